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

	uverbsObjectMR = 7 // UVERBS_OBJECT_MR

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
