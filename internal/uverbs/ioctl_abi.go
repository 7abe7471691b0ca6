package uverbs

// The uverbs ioctl ABI (the kernel's uapi rdma_user_ioctl_cmds.h, ib_user_ioctl_cmds.h and
// efa-abi.h; docs/cabi.md, "The ioctl interface").

const (
	// rdmaVerbsIoctl is RDMA_VERBS_IOCTL: _IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr).
	rdmaVerbsIoctl = 3<<30 | ioctlHdrSize<<16 | 0x1b<<8 | 1

	ioctlHdrSize  = 24 // struct ib_uverbs_ioctl_hdr
	ioctlAttrSize = 16 // struct ib_uverbs_attr

	attrFMandatory   = 1 << 0 // UVERBS_ATTR_F_MANDATORY
	attrFValidOutput = 1 << 1 // UVERBS_ATTR_F_VALID_OUTPUT

	idNSShift = 12 // UVERBS_ID_NS_SHIFT: driver-specific ids start at 1 << 12

	uverbsObjectDevice = 0 // UVERBS_OBJECT_DEVICE
	uverbsObjectMR     = 7 // UVERBS_OBJECT_MR

	// UVERBS_METHOD_QUERY_PORT_SPEED (ibv_query_port_speed, rdma-core >= 61) and its attributes.
	methodQueryPortSpeed   = 7
	attrQueryPortSpeedPort = 0 // UVERBS_ATTR_CONST_IN, u32
	attrQueryPortSpeedResp = 1 // UVERBS_ATTR_PTR_OUT, u64: the speed in units of 100 Mb/s

	// UVERBS_METHOD_REG_DMABUF_MR (ibv_reg_dmabuf_mr) and its attributes.
	methodRegDmabufMR       = 4
	attrRegDmabufMRHandle   = 0 // the new MR
	attrRegDmabufMRPD       = 1
	attrRegDmabufMROffset   = 2 // u64
	attrRegDmabufMRLength   = 3 // u64
	attrRegDmabufMRIOVA     = 4 // u64
	attrRegDmabufMRFD       = 5 // the dma-buf's file descriptor, s32
	attrRegDmabufMRAccess   = 6 // UVERBS_ATTR_FLAGS_IN, optional
	attrRegDmabufMRRespLKey = 7 // u32
	attrRegDmabufMRRespRKey = 8 // u32

	// EFA_IB_METHOD_MR_QUERY and its attributes (enum efa_query_mr_attrs).
	efaMethodMRQuery         = 1 << idNSShift
	efaAttrQueryMRHandle     = 1 << idNSShift
	efaAttrQueryMRValidity   = efaAttrQueryMRHandle + 1
	efaAttrQueryMRRecvICID   = efaAttrQueryMRHandle + 2
	efaAttrQueryMRReadICID   = efaAttrQueryMRHandle + 3
	efaAttrQueryMRRecvRDMAID = efaAttrQueryMRHandle + 4

	// enum efa_query_mr_validity.
	efaQueryMRValidRecvICID     = 1 << 0
	efaQueryMRValidRDMAReadICID = 1 << 1
	efaQueryMRValidRDMARecvICID = 1 << 2
)
