// Package uapi holds the numeric values shared by the provider (package verbs) and the device
// engine: the enums of the uverbs ABI (QP types, states, attribute masks, access flags, async
// events) and EFA's kernel ABI flags. Both sides speak in these numbers, as libibverbs and the
// kernel do; package verbs re-exports them as typed constants.
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

// EFA device capability bits (EFADV_DEVICE_ATTR_CAPS_*).
const (
	CapRDMARead             = 1 << 0
	CapRNRRetry             = 1 << 1
	CapCQWithSGID           = 1 << 2
	CapRDMAWrite            = 1 << 3
	CapUnsolicitedWriteRecv = 1 << 4
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
