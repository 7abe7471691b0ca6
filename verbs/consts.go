package verbs

import (
	"fmt"

	"github.com/softefa/softefa/internal/uapi"
)

// QPType is a QP's transport (enum ibv_qp_type). EFA has UD QPs and driver QPs; the only driver
// QP type is SRD (package efadv).
type QPType int

// QP types.
const (
	QPTUD     QPType = uapi.QPTypeUD
	QPTDriver QPType = uapi.QPTypeDriver
)

// QPState is a QP state (enum ibv_qp_state).
type QPState int

// QP states.
const (
	QPSReset   QPState = uapi.QPSReset
	QPSInit    QPState = uapi.QPSInit
	QPSRTR     QPState = uapi.QPSRTR
	QPSRTS     QPState = uapi.QPSRTS
	QPSSQD     QPState = uapi.QPSSQD
	QPSSQE     QPState = uapi.QPSSQE
	QPSErr     QPState = uapi.QPSErr
	QPSUnknown QPState = uapi.QPSUnknown
)

func (s QPState) String() string {
	names := [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN"}
	if s >= 0 && int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("QPState(%d)", int(s))
}

// QPAttrMask selects attributes of ModifyQP and QueryQP (enum ibv_qp_attr_mask).
type QPAttrMask int

// QP attribute mask bits.
const (
	QPAttrState            QPAttrMask = uapi.QPAttrState
	QPAttrCurState         QPAttrMask = uapi.QPAttrCurState
	QPAttrEnSQDAsyncNotify QPAttrMask = uapi.QPAttrEnSQDAsyncNotify
	QPAttrAccessFlags      QPAttrMask = uapi.QPAttrAccessFlags
	QPAttrPKeyIndex        QPAttrMask = uapi.QPAttrPKeyIndex
	QPAttrPort             QPAttrMask = uapi.QPAttrPort
	QPAttrQKey             QPAttrMask = uapi.QPAttrQKey
	QPAttrAV               QPAttrMask = uapi.QPAttrAV
	QPAttrPathMTU          QPAttrMask = uapi.QPAttrPathMTU
	QPAttrTimeout          QPAttrMask = uapi.QPAttrTimeout
	QPAttrRetryCnt         QPAttrMask = uapi.QPAttrRetryCnt
	QPAttrRNRRetry         QPAttrMask = uapi.QPAttrRNRRetry
	QPAttrRQPSN            QPAttrMask = uapi.QPAttrRQPSN
	QPAttrMaxQPRdAtomic    QPAttrMask = uapi.QPAttrMaxQPRdAtomic
	QPAttrAltPath          QPAttrMask = uapi.QPAttrAltPath
	QPAttrMinRNRTimer      QPAttrMask = uapi.QPAttrMinRNRTimer
	QPAttrSQPSN            QPAttrMask = uapi.QPAttrSQPSN
	QPAttrMaxDestRdAtomic  QPAttrMask = uapi.QPAttrMaxDestRdAtomic
	QPAttrPathMigState     QPAttrMask = uapi.QPAttrPathMigState
	QPAttrCap              QPAttrMask = uapi.QPAttrCap
	QPAttrDestQPN          QPAttrMask = uapi.QPAttrDestQPN
)

// AccessFlags are memory region access rights (enum ibv_access_flags).
type AccessFlags int

// Access flags. EFA supports LocalWrite, RemoteRead (with the RDMA_READ cap) and RemoteWrite
// (with the RDMA_WRITE cap); the optional bits (AccessRelaxedOrdering) are accepted and ignored.
const (
	AccessLocalWrite      AccessFlags = uapi.AccessLocalWrite
	AccessRemoteWrite     AccessFlags = uapi.AccessRemoteWrite
	AccessRemoteRead      AccessFlags = uapi.AccessRemoteRead
	AccessRemoteAtomic    AccessFlags = uapi.AccessRemoteAtomic
	AccessMWBind          AccessFlags = uapi.AccessMWBind
	AccessZeroBased       AccessFlags = uapi.AccessZeroBased
	AccessOnDemand        AccessFlags = uapi.AccessOnDemand
	AccessHugeTLB         AccessFlags = uapi.AccessHugeTLB
	AccessRelaxedOrdering AccessFlags = uapi.AccessRelaxedOrder
)

// WROpcode is a send work request's operation (enum ibv_wr_opcode).
type WROpcode int

// Work request opcodes. PostSend takes only WRSend and WRSendWithImm, as libefa does; RDMA goes
// through the QPEx iterator.
const (
	WRRDMAWrite        WROpcode = 0
	WRRDMAWriteWithImm WROpcode = 1
	WRSend             WROpcode = 2
	WRSendWithImm      WROpcode = 3
	WRRDMARead         WROpcode = 4
)

// SendFlags are work request flags (enum ibv_send_flags).
type SendFlags int

// Send flags. EFA takes Signaled and Inline only, and every WR must be signaled (or the QP
// created with SQSigAll).
const (
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
	SendIPCsum    SendFlags = 1 << 4
)

// SendOpsFlags select the QPEx opcodes a QP offers (enum ibv_qp_create_send_ops_flags).
type SendOpsFlags uint64

// Send-ops flags.
const (
	SendOpsRDMAWrite        SendOpsFlags = 1 << 0
	SendOpsRDMAWriteWithImm SendOpsFlags = 1 << 1
	SendOpsSend             SendOpsFlags = 1 << 2
	SendOpsSendWithImm      SendOpsFlags = 1 << 3
	SendOpsRDMARead         SendOpsFlags = 1 << 4
	SendOpsAtomicCmpSwp     SendOpsFlags = 1 << 5
	SendOpsAtomicFetchAdd   SendOpsFlags = 1 << 6
	SendOpsLocalInv         SendOpsFlags = 1 << 7
	SendOpsBindMW           SendOpsFlags = 1 << 8
	SendOpsSendWithInv      SendOpsFlags = 1 << 9
	SendOpsTSO              SendOpsFlags = 1 << 10
	SendOpsFlush            SendOpsFlags = 1 << 11
	SendOpsAtomicWrite      SendOpsFlags = 1 << 12
)

// QPInitAttrMask says which optional fields of QPInitAttrEx are set (enum ibv_qp_init_attr_mask).
type QPInitAttrMask int

// QP init attribute mask bits.
const (
	QPInitAttrPD           QPInitAttrMask = 1 << 0
	QPInitAttrXRCD         QPInitAttrMask = 1 << 1
	QPInitAttrCreateFlags  QPInitAttrMask = 1 << 2
	QPInitAttrMaxTSOHeader QPInitAttrMask = 1 << 3
	QPInitAttrIndTable     QPInitAttrMask = 1 << 4
	QPInitAttrRXHash       QPInitAttrMask = 1 << 5
	QPInitAttrSendOpsFlags QPInitAttrMask = 1 << 6
)

// WCStatus is a work completion status (enum ibv_wc_status).
type WCStatus int

// Work completion statuses.
const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocEECOpErr    WCStatus = 3
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCMWBindErr      WCStatus = 6
	WCBadRespErr     WCStatus = 7
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCLocRDDViolErr  WCStatus = 14
	WCRemInvRDReqErr WCStatus = 15
	WCRemAbortErr    WCStatus = 16
	WCInvEECNErr     WCStatus = 17
	WCInvEECStateErr WCStatus = 18
	WCFatalErr       WCStatus = 19
	WCRespTimeoutErr WCStatus = 20
	WCGeneralErr     WCStatus = 21
)

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error",
	"remote access error", "remote operation error", "transport retry counter exceeded",
	"RNR retry counter exceeded", "local RDD violation error", "remote invalid RD request",
	"aborted error", "invalid EE context number", "invalid EE context state", "fatal error",
	"response timeout error", "general error",
}

// String returns ibv_wc_status_str's text.
func (s WCStatus) String() string {
	if s >= 0 && int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return "unknown"
}

// WCOpcode is a completion's operation (enum ibv_wc_opcode).
type WCOpcode int

// Completion opcodes. libefa reports an RDMA read's completion as WCSend.
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCRecv            WCOpcode = 1 << 7
	WCRecvRDMAWithImm WCOpcode = WCRecv + 1
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", int(o))
}

// WCFlags are a completion's flags (enum ibv_wc_flags).
type WCFlags int

// Completion flags.
const (
	WCGRH     WCFlags = 1 << 0
	WCWithImm WCFlags = 1 << 1
)

// CreateCQWCFlags choose the fields an extended CQ reports (enum ibv_create_cq_wc_flags).
type CreateCQWCFlags uint64

// Extended CQ field flags. EFA supports the standard set; timestamps, CVLAN, flow tag and tag
// matching are EOPNOTSUPP.
const (
	WCExWithByteLen             CreateCQWCFlags = 1 << 0
	WCExWithImm                 CreateCQWCFlags = 1 << 1
	WCExWithQPNum               CreateCQWCFlags = 1 << 2
	WCExWithSrcQP               CreateCQWCFlags = 1 << 3
	WCExWithSLID                CreateCQWCFlags = 1 << 4
	WCExWithSL                  CreateCQWCFlags = 1 << 5
	WCExWithDLIDPathBits        CreateCQWCFlags = 1 << 6
	WCExWithCompletionTimestamp CreateCQWCFlags = 1 << 7
	WCExWithCVLAN               CreateCQWCFlags = 1 << 8
	WCExWithFlowTag             CreateCQWCFlags = 1 << 9
	WCExWithTMInfo              CreateCQWCFlags = 1 << 10
	WCExWithTimestampWallclock  CreateCQWCFlags = 1 << 11

	WCStandardFlags = WCExWithByteLen | WCExWithImm | WCExWithQPNum | WCExWithSrcQP |
		WCExWithSLID | WCExWithSL | WCExWithDLIDPathBits
)

// CQInitAttrMask says which optional fields of CQInitAttrEx are set.
type CQInitAttrMask int

// CQ init attribute mask bits (enum ibv_cq_init_attr_mask).
const (
	CQInitAttrFlags CQInitAttrMask = 1 << 0
	CQInitAttrPD    CQInitAttrMask = 1 << 1
)

// CreateCQFlags are CQ creation flags (enum ibv_create_cq_attr_flags).
type CreateCQFlags int

// CQ creation flags.
const (
	CreateCQSingleThreaded CreateCQFlags = 1 << 0
	CreateCQIgnoreOverrun  CreateCQFlags = 1 << 1
)

// EventType is an asynchronous event's type (enum ibv_event_type).
type EventType int

// Asynchronous event types.
const (
	EventCQErr       EventType = uapi.EventCQErr
	EventQPFatal     EventType = uapi.EventQPFatal
	EventQPReqErr    EventType = uapi.EventQPReqErr
	EventQPAccessErr EventType = uapi.EventQPAccessErr
	EventCommEst     EventType = uapi.EventCommEst
	EventSQDrained   EventType = uapi.EventSQDrained
	EventDeviceFatal EventType = uapi.EventDeviceFatal
	EventPortActive  EventType = uapi.EventPortActive
	EventPortErr     EventType = uapi.EventPortErr
)

// PortState is a port's state (enum ibv_port_state).
type PortState int

// Port states.
const (
	PortDown   PortState = uapi.PortDown
	PortInit   PortState = uapi.PortInit
	PortArmed  PortState = uapi.PortArmed
	PortActive PortState = uapi.PortActive
)

// MTU is an IB MTU enum (enum ibv_mtu).
type MTU int

// MTU values.
const (
	MTU256  MTU = uapi.MTU256
	MTU512  MTU = uapi.MTU512
	MTU1024 MTU = uapi.MTU1024
	MTU2048 MTU = uapi.MTU2048
	MTU4096 MTU = uapi.MTU4096
)

// mtuEnum maps a byte MTU to its enum; anything of 4096 or more reports as MTU4096, as the EFA
// kernel driver's ib_mtu_int_to_enum does.
func mtuEnum(n int) MTU {
	switch {
	case n >= 4096:
		return MTU4096
	case n >= 2048:
		return MTU2048
	case n >= 1024:
		return MTU1024
	case n >= 512:
		return MTU512
	}
	return MTU256
}
