package uverbs

// The RDMA netlink ABI (the kernel's uapi rdma_netlink.h; docs/cabi.md, "Netlink"): the NLDEV
// client's commands and attributes that the emulation answers.

// netlinkRDMA is the NETLINK_RDMA protocol number; nlClientNLDEV the NLDEV client. A message's
// type is client<<10 | command.
const (
	netlinkRDMA   = 20
	nlClientNLDEV = 5
)

// enum rdma_nldev_command.
const (
	nldevCmdGet        = 1
	nldevCmdPortGet    = 5
	nldevCmdSysGet     = 6
	nldevCmdResGet     = 9
	nldevCmdResQPGet   = 10
	nldevCmdResCQGet   = 12
	nldevCmdResMRGet   = 13
	nldevCmdResPDGet   = 14
	nldevCmdGetChardev = 15
	nldevCmdStatGet    = 17
)

// enum rdma_nldev_attr.
const (
	nlaDevIndex          = 1  // u32
	nlaDevName           = 2  // string
	nlaPortIndex         = 3  // u32
	nlaCapFlags          = 4  // u64
	nlaFWVersion         = 5  // string
	nlaNodeGUID          = 6  // u64
	nlaSysImageGUID      = 7  // u64
	nlaPortState         = 12 // u8
	nlaPortPhysState     = 13 // u8
	nlaDevNodeType       = 14 // u8
	nlaResSummary        = 15 // nested
	nlaResSummaryEntry   = 16 // nested
	nlaResSummaryName    = 17 // string
	nlaResSummaryCurr    = 18 // u64
	nlaResQP             = 19 // nested
	nlaResQPEntry        = 20 // nested
	nlaResLQPN           = 21 // u32
	nlaResType           = 26 // u8
	nlaResState          = 27 // u8
	nlaResPID            = 28 // u32
	nlaResCQ             = 35 // nested
	nlaResCQEntry        = 36 // nested
	nlaResCQE            = 37 // u32
	nlaResUseCnt         = 38 // u64
	nlaResMR             = 40 // nested
	nlaResMREntry        = 41 // nested
	nlaResRKey           = 42 // u32
	nlaResLKey           = 43 // u32
	nlaResIOVA           = 44 // u64
	nlaResMRLen          = 45 // u64
	nlaResPD             = 46 // nested
	nlaResPDEntry        = 47 // nested
	nlaNdevName          = 51 // string
	nlaResPDN            = 60 // u32
	nlaResCQN            = 61 // u32
	nlaResMRN            = 62 // u32
	nlaSysNetnsMode      = 66 // u8
	nlaChardevType       = 69 // string
	nlaChardevName       = 70 // string
	nlaChardevABI        = 71 // u64
	nlaChardev           = 72 // u64
	nlaUverbsDriverID    = 73 // u32
	nlaStatRes           = 75 // u32
	nlaStatHWCounters    = 80 // nested
	nlaStatHWCounterEnt  = 81 // nested
	nlaStatHWCounterName = 82 // string
	nlaStatHWCounterVal  = 83 // u64
	nlaDevDIM            = 84 // u8
	nlaSysCopyOnFork     = 93 // u8
	nlaStatHWCounterIdx  = 94 // u32
	nlaStatHWCounterDyn  = 95 // u8
	nlaSysPrivQKeyMode   = 96 // u8
	nlaMax               = 118
)

// Netlink message framing (linux/netlink.h).
const (
	nlmsgHdrLen   = 16
	nlmsgError    = 2
	nlmsgDone     = 3
	nlmFRequest   = 0x1
	nlmFMulti     = 0x2
	nlmFAck       = 0x4
	nlmFDump      = 0x300 // NLM_F_ROOT | NLM_F_MATCH
	nlmFCapped    = 0x100 // on an NLMSG_ERROR: the request's payload is left out
	nlaFNested    = 1 << 15
	nlaTypeMask   = 0x3fff
	rdmaDriverEFA = 17 // enum rdma_driver_id
)

// Kernel enum values the replies carry.
const (
	// RDMA_NODE_UNSPECIFIED (enum rdma_node_type), the node type EFA's driver gives its devices
	// (efa_ib_device_add), which libibverbs makes IBV_NODE_UNSPECIFIED and transport
	// IBV_TRANSPORT_UNSPECIFIED; the sysfs tree's node_type says the same (NodeTypeSysfs).
	rdmaNodeUnspecified = 7
	ibQPTUD             = 4 // enum ib_qp_type
	ibQPTDriver         = 0xFF
)
