package uverbs

import "encoding/binary"

// The uverbs write ABI (rdma-core kernel-headers/rdma/ib_user_verbs.h, ABI version 6) and EFA's
// driver data (efa-abi.h, EFA ABI version 1). Offsets are in bytes from the start of each
// struct; sizes are the structs' sizeof. The verbs enums the ABI carries are package uapi's, the
// EFA descriptor sizes package efaio's.

// ABI versions the sysfs tree reports.
const (
	UverbsABIVersion = 6
	EFAABIVersion    = 1
)

// NodeTypeSysfs is the device's node_type file as the kernel writes it for an EFA device
// (node_type_show for RDMA_NODE_UNSPECIFIED, the type efa_ib_device_add gives), the value
// netlink's NLDEV GET reports too.
const NodeTypeSysfs = "7: unspecified"

// Command numbers of enum ib_uverbs_write_cmds.
const (
	cmdGetContext        = 0
	cmdQueryDevice       = 1
	cmdQueryPort         = 2
	cmdAllocPD           = 3
	cmdDeallocPD         = 4
	cmdCreateAH          = 5
	cmdDestroyAH         = 8
	cmdRegMR             = 9
	cmdDeregMR           = 13
	cmdCreateCompChannel = 17
	cmdCreateCQ          = 18
	cmdDestroyCQ         = 20
	cmdCreateQP          = 24
	cmdQueryQP           = 25
	cmdModifyQP          = 26
	cmdDestroyQP         = 27
)

// Header layout (struct ib_uverbs_cmd_hdr, struct ib_uverbs_ex_cmd_hdr).
const (
	hdrSize          = 8
	exHdrSize        = 16
	cmdMask          = 0xff
	cmdFlagExtended  = 0x80000000
	userPageSize     = 4096
	dbPageQPSQOffset = 0
	dbPageQPRQOffset = 8
)

// Request and response sizes of the core structs (without driver data).
const (
	getContextReq   = 8   // response
	getContextResp  = 8   // async_fd, num_comp_vectors
	queryDeviceReq  = 8   // response
	queryDeviceResp = 176 // struct ib_uverbs_query_device_resp
	queryPortReq    = 16
	queryPortResp   = 40
	allocPDReq      = 8
	allocPDResp     = 4
	deallocPDReq    = 4
	createAHReq     = 56
	createAHResp    = 4
	destroyAHReq    = 4
	regMRReq        = 40
	regMRResp       = 12
	deregMRReq      = 4
	compChannelReq  = 8
	compChannelResp = 4
	createCQReq     = 32
	createCQResp    = 8
	destroyCQReq    = 16
	destroyCQResp   = 8
	createQPReq     = 56
	createQPResp    = 32
	queryQPReq      = 16
	queryQPResp     = 128
	modifyQPReq     = 112
	destroyQPReq    = 16
	destroyQPResp   = 4

	exQueryDeviceReq  = 8   // comp_mask, reserved
	exQueryDeviceResp = 184 // base + comp_mask + response_length (the rest is optional)
	exQueryDeviceFull = 304 // sizeof(struct ib_uverbs_ex_query_device_resp) in ABI 6 (v44)
	exCreateCQReq     = 32
	exCreateCQResp    = 16
)

// EFA driver data (efa-abi.h).
const (
	efaAllocUcontextCmdTxBatch = 1 << 0
	efaAllocUcontextCmdMinSQWR = 1 << 1

	efaCmdsSuppUdataQueryDevice = 1 << 0
	efaCmdsSuppUdataCreateAH    = 1 << 1

	efaCreateCQRespDBOff = 1 << 0

	// EFA_QUERY_DEVICE_CAPS_*: v44 has the first four; later kernels add DATA_POLLING_128
	// (1 << 4, not offered), RDMA_WRITE, UNSOLICITED_WRITE_RECV, CQ_WITH_EXT_MEM and COMP_CNTR
	// (not offered) and SQ_64_BIT_REQ_ID.
	efaCapRDMARead             = 1 << 0
	efaCapRNRRetry             = 1 << 1
	efaCapCQNotifications      = 1 << 2
	efaCapCQWithSGID           = 1 << 3
	efaCapRDMAWrite            = 1 << 5
	efaCapUnsolicitedWriteRecv = 1 << 6
	efaCapSQ64BitReqID         = 1 << 9

	efaAllocUcontextCmdSize  = 8
	efaAllocUcontextRespSize = 24
	efaAllocPDRespSize       = 8
	efaCreateCQCmdSize       = 16
	efaCreateCQCmdMin        = 10 // offsetofend(num_sub_cqs)
	efaCreateCQRespSize      = 40
	efaCreateQPCmdSize       = 24 // with flags and sl (rdma-core ≥ v46); v44 sends 16
	efaCreateQPCmdMin        = 16 // offsetofend(driver_qp_type)
	efaCreateQPRespSize      = 64
	efaCreateAHRespSize      = 8
	efaExQueryDeviceRespSize = 24
)

var le = binary.LittleEndian

// u16, u32 and u64 read little-endian fields at off; b must be long enough (callers pad).
func u16(b []byte, off int) uint16 { return le.Uint16(b[off:]) }
func u32(b []byte, off int) uint32 { return le.Uint32(b[off:]) }
func u64(b []byte, off int) uint64 { return le.Uint64(b[off:]) }

func put16(b []byte, off int, v uint16) { le.PutUint16(b[off:], v) }
func put32(b []byte, off int, v uint32) { le.PutUint32(b[off:], v) }
func put64(b []byte, off int, v uint64) { le.PutUint64(b[off:], v) }

// padTo returns b extended with zeros to n bytes (a copy when it must grow), as the kernel's
// uverbs_request zero-fills a shorter request.
func padTo(b []byte, n int) []byte {
	if len(b) >= n {
		return b
	}
	out := make([]byte, n)
	copy(out, b)
	return out
}

// cleared reports whether every byte of b is zero (ib_is_buffer_cleared).
func cleared(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
