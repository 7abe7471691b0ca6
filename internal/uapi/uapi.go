// Package uapi holds the numeric values shared by the provider (package verbs), package efadv,
// the device engine and the uverbs ABI (internal/uverbs): the enums of the verbs ABI (QP types,
// states, attribute masks, access flags, async events, port states, MTUs), EFA's direct-verbs
// flags (efadv.h) and EFA's kernel ABI flags (efa-abi.h). Each value is defined here once; the
// public packages re-export them as typed constants (verbs.QPState, efadv.DeviceCaps, ...).
package uapi

// QP types (enum ibv_qp_type).
const (
	QPTypeUD     = 4
	QPTypeDriver = 0xff
)

// EFA driver QP type (EFADV_QP_DRIVER_TYPE_SRD).
const DriverQPTypeSRD = 0

// QP states (enum ibv_qp_state).
const (
	QPSReset = iota
	QPSInit
	QPSRTR
	QPSRTS
	QPSSQD
	QPSSQE
	QPSErr
	QPSUnknown
)

// QP attribute mask bits (enum ibv_qp_attr_mask).
const (
	QPAttrState            = 1 << 0
	QPAttrCurState         = 1 << 1
	QPAttrEnSQDAsyncNotify = 1 << 2
	QPAttrAccessFlags      = 1 << 3
	QPAttrPKeyIndex        = 1 << 4
	QPAttrPort             = 1 << 5
	QPAttrQKey             = 1 << 6
	QPAttrAV               = 1 << 7
	QPAttrPathMTU          = 1 << 8
	QPAttrTimeout          = 1 << 9
	QPAttrRetryCnt         = 1 << 10
	QPAttrRNRRetry         = 1 << 11
	QPAttrRQPSN            = 1 << 12
	QPAttrMaxQPRdAtomic    = 1 << 13
	QPAttrAltPath          = 1 << 14
	QPAttrMinRNRTimer      = 1 << 15
	QPAttrSQPSN            = 1 << 16
	QPAttrMaxDestRdAtomic  = 1 << 17
	QPAttrPathMigState     = 1 << 18
	QPAttrCap              = 1 << 19
	QPAttrDestQPN          = 1 << 20
)

// Memory access flags (enum ibv_access_flags).
const (
	AccessLocalWrite   = 1 << 0
	AccessRemoteWrite  = 1 << 1
	AccessRemoteRead   = 1 << 2
	AccessRemoteAtomic = 1 << 3
	AccessMWBind       = 1 << 4
	AccessZeroBased    = 1 << 5
	AccessOnDemand     = 1 << 6
	AccessHugeTLB      = 1 << 7
	AccessRelaxedOrder = 1 << 20 // IBV_ACCESS_OPTIONAL_FIRST
	AccessOptionalMask = 0x3ff << 20

	// AccessSupported is every access bit the uverbs ABI accepts (IB_ACCESS_SUPPORTED).
	AccessSupported = AccessHugeTLB<<1 - 1 | AccessOptionalMask
)

// QPAttrLegacyMask is every QP attribute bit of the legacy modify_qp command
// ((IB_USER_LEGACY_LAST_QP_ATTR_MASK << 1) - 1).
const QPAttrLegacyMask = QPAttrDestQPN<<1 - 1

// Port states (enum ibv_port_state).
const (
	PortDown   = 1
	PortInit   = 2
	PortArmed  = 3
	PortActive = 4
)

// PhysStateLinkUp is the physical port state of a port whose link is up (ib_port_phys_state).
const PhysStateLinkUp = 5

// MTUs (enum ibv_mtu).
const (
	MTU256  = 1
	MTU512  = 2
	MTU1024 = 3
	MTU2048 = 4
	MTU4096 = 5
)

// Async event types (enum ibv_event_type).
const (
	EventCQErr       = 0
	EventQPFatal     = 1
	EventQPReqErr    = 2
	EventQPAccessErr = 3
	EventCommEst     = 4
	EventSQDrained   = 5
	EventDeviceFatal = 8
	EventPortActive  = 9
	EventPortErr     = 10
)

// EFA device capability bits (EFADV_DEVICE_ATTR_CAPS_*). The device offers none of the last two.
const (
	CapRDMARead             = 1 << 0
	CapRNRRetry             = 1 << 1
	CapCQWithSGID           = 1 << 2
	CapRDMAWrite            = 1 << 3
	CapUnsolicitedWriteRecv = 1 << 4
	CapCQWithExtMemDMABuf   = 1 << 5
	CapCompCntr             = 1 << 6
)

// EFA direct-verbs QP flags (EFADV_QP_FLAGS_*) and WR flags (EFADV_WR_EX_*), as
// efadv_qp_init_attr carries them to the provider.
const (
	DVQPFlagUnsolicitedWriteRecv = 1 << 0
	DVQPFlagInlineWrite          = 1 << 1
	DVWRExWithProcessingHints    = 1 << 0
)

// QP creation flags carried to the device (efa_ibv_create_qp flags).
const (
	QPFlagUnsolicitedWriteRecv = 1 << 0
	QPFlagSQ64BitReqID         = 1 << 1
)

// CQ creation flags carried to the device (efa_ibv_create_cq flags).
const (
	CQFlagWithCompletionChannel = 1 << 0
	CQFlagWithSGID              = 1 << 1
	CQFlagSQ64BitReqID          = 1 << 2
)

// RNRRetryInfinite is the rnr_retry value that retries forever (the SRD default).
const RNRRetryInfinite = 7
