// Package efadv is EFA's direct verbs (rdma-core's efadv.h) for softefa devices: SRD QP creation,
// the EFA device attributes and caps, the AH number, the CQ's source-GID and unsolicited fields,
// and the raw SQ, RQ and CQ rings a program may drive itself.
//
// # Compatibility
//
// In C, each efadv call takes the caller's struct size (inlen) so that old binaries keep working
// as structs grow. Go programs are compiled against one version of this package, so the Go calls
// take and return whole structs and have no inlen: a field added later is appended, and its zero
// value means "not requested". The CompMask rules do hold: input CompMask must be 0 (EINVAL, as
// libefa) and output CompMask is 0. The *Len variants keep libefa's inlen rules (minimum sizes,
// fields beyond inlen left zero) for a caller that carries a C struct's size. (Unmodified C
// programs run on the real libefa, over the uverbs ABI: see package cabi.)
//
// The flags are typed (DeviceCaps, QPFlags, WCExFlags, ...) as package verbs types its own.
// RingDoorbell, which has no libefa counterpart, has the device look at a queue at once after a
// program stored its doorbell itself.
//
// Errors are Go errors that match the errno libefa returns: errors.Is(err, syscall.EINVAL). A nil
// pointer argument, which would crash libefa, is EINVAL.
package efadv

import (
	"fmt"
	"syscall"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/provider"
	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/verbs"
)

// DeviceCaps are the device's capability bits (EFADV_DEVICE_ATTR_CAPS_*), as DeviceAttr reports
// them; config.Device.Caps takes the same bits as a uint32.
type DeviceCaps uint32

// Device capability bits. A softefa device offers the first five (config.Device.Caps chooses).
const (
	DeviceAttrCapsRDMARead             DeviceCaps = uapi.CapRDMARead
	DeviceAttrCapsRNRRetry             DeviceCaps = uapi.CapRNRRetry
	DeviceAttrCapsCQWithSGID           DeviceCaps = uapi.CapCQWithSGID
	DeviceAttrCapsRDMAWrite            DeviceCaps = uapi.CapRDMAWrite
	DeviceAttrCapsUnsolicitedWriteRecv DeviceCaps = uapi.CapUnsolicitedWriteRecv
	DeviceAttrCapsCQWithExtMemDMABuf   DeviceCaps = uapi.CapCQWithExtMemDMABuf
	DeviceAttrCapsCompCntr             DeviceCaps = uapi.CapCompCntr
)

// DriverQPType is a driver QP's type (enum efadv_qp_driver_type).
type DriverQPType uint32

// QPDriverTypeSRD is the SRD QP type, the only one.
const QPDriverTypeSRD DriverQPType = uapi.DriverQPTypeSRD

// QPFlags are a QP's EFA creation flags (EFADV_QP_FLAGS_*).
type QPFlags uint16

// QP flags: UnsolicitedWriteRecv needs the UNSOLICITED_WRITE_RECV cap, InlineWrite RDMA_WRITE.
const (
	QPFlagsUnsolicitedWriteRecv QPFlags = uapi.DVQPFlagUnsolicitedWriteRecv
	QPFlagsInlineWrite          QPFlags = uapi.DVQPFlagInlineWrite
)

// WRFlags select the extra WR setters a QP offers (EFADV_WR_EX_*).
type WRFlags uint64

// WRExWithProcessingHints offers WRSetProcessingHints.
const WRExWithProcessingHints WRFlags = uapi.DVWRExWithProcessingHints

// ProcessingHints are a WR's processing hints (EFADV_WR_PROCESSING_HINT_*).
type ProcessingHints uint32

// WRProcessingHintBurstPPSSensitive marks a WR as part of a burst sensitive to packet rate.
const WRProcessingHintBurstPPSSensitive ProcessingHints = efaio.ProcessingHintBurstPPSSensitive

// WQCaps are a work queue's capabilities (EFADV_WQ_CAPS_*), as QueryQPWQs reports them.
type WQCaps uint16

// WQCaps64BitReqID: the SQ's WQEs and CQEs carry the whole 64-bit wr_id
// (config.Device.RequestID64).
const WQCaps64BitReqID WQCaps = 1 << 0

// SQDepthFlags are the needs GetMaxSQDepth sizes an SQ for (EFADV_SQ_DEPTH_ATTR_*).
type SQDepthFlags uint32

// SQDepthAttrInlineWrite: the SQ's WQEs may be inline RDMA writes (128-byte WQEs).
const SQDepthAttrInlineWrite SQDepthFlags = 1 << 0

// WCExFlags choose EFA's extra completion fields of a CQ (EFADV_WC_EX_*).
type WCExFlags uint64

// Extra completion fields: WCReadSGID and WCIsUnsolicited.
const (
	WCExWithSGID          WCExFlags = 1 << 0
	WCExWithIsUnsolicited WCExFlags = 1 << 1
)

// CQInitFlags are a CQ's EFA creation flags (EFADV_CQ_INIT_FLAGS_*).
type CQInitFlags uint64

// CQInitFlagsExtMemDMABuf puts the CQ in external dmabuf memory, which this device does not have.
const CQInitFlagsExtMemDMABuf CQInitFlags = 1 << 0

// MRValidity says which interconnect ids of MRAttr are valid (EFADV_MR_ATTR_VALIDITY_*).
type MRValidity uint16

// Interconnect id validity bits; a softefa region has none.
const (
	MRAttrValidityRecvICID     MRValidity = 1 << 0
	MRAttrValidityRDMAReadICID MRValidity = 1 << 1
	MRAttrValidityRDMARecvICID MRValidity = 1 << 2
)

// Sizes of the C structs, the inlen a current C program passes.
const (
	SizeofDeviceAttr  = 32
	SizeofAHAttr      = 16
	SizeofQPInitAttr  = 24
	SizeofWQAttr      = 40
	SizeofCQInitAttr  = 56
	SizeofCQAttr      = 32
	SizeofMRAttr      = 16
	SizeofSQDepthAttr = 24
	SizeofRQDepthAttr = 16
)

func errInlen(fn string, inlen, min int) error {
	return fmt.Errorf("efadv: %s inlen %d, need more than %d: %w", fn, inlen, min, syscall.EINVAL)
}

// errNil is the error for a nil argument: EINVAL.
func errNil(fn, arg string) error {
	return fmt.Errorf("efadv: %s with a nil %s: %w", fn, arg, syscall.EINVAL)
}

// DeviceAttr is struct efadv_device_attr.
type DeviceAttr struct {
	CompMask        uint64
	MaxSQWR         uint32
	MaxRQWR         uint32
	MaxSQSGE        uint16
	MaxRQSGE        uint16
	InlineBufSize   uint16
	InlineBufSizeEx uint16
	DeviceCaps      DeviceCaps
	MaxRDMASize     uint32
}

// QueryDevice returns the EFA attributes of the device (efadv_query_device).
func QueryDevice(ctx *verbs.Context) (DeviceAttr, error) {
	return QueryDeviceLen(ctx, SizeofDeviceAttr)
}

// QueryDeviceLen is QueryDevice with libefa's inlen rules: inlen must be over 22; device_caps
// (but for the RDMA bits) is filled past 24, max_rdma_size and the RDMA caps past 28.
func QueryDeviceLen(ctx *verbs.Context, inlen int) (DeviceAttr, error) {
	if inlen <= 22 {
		return DeviceAttr{}, errInlen("query_device", inlen, 22)
	}
	if ctx == nil {
		return DeviceAttr{}, errNil("query_device", "context")
	}
	d := contextConfig(ctx)
	a := DeviceAttr{
		MaxSQWR: uint32(d.MaxSQWR), MaxRQWR: uint32(d.MaxRQWR),
		MaxSQSGE: uint16(d.MaxSQSGE), MaxRQSGE: uint16(d.MaxRQSGE),
		InlineBufSize: uint16(d.InlineBufSize), InlineBufSizeEx: uint16(d.InlineBufSizeEx),
	}
	const rdma = DeviceAttrCapsRDMARead | DeviceAttrCapsRDMAWrite
	if inlen > 24 {
		a.DeviceCaps = deviceCaps(ctx) &^ rdma
	}
	if inlen > 28 {
		a.MaxRDMASize = d.MaxRDMASize
		a.DeviceCaps |= deviceCaps(ctx) & rdma
	}
	return a, nil
}

// AHAttr is struct efadv_ah_attr.
type AHAttr struct {
	CompMask uint64
	AHN      uint16
}

// QueryAH returns the device's AH number (efadv_query_ah).
func QueryAH(ah *verbs.AH) (AHAttr, error) { return QueryAHLen(ah, SizeofAHAttr) }

// QueryAHLen is QueryAH with libefa's inlen rule: inlen must be over 8.
func QueryAHLen(ah *verbs.AH, inlen int) (AHAttr, error) {
	if inlen <= 8 {
		return AHAttr{}, errInlen("query_ah", inlen, 8)
	}
	if ah == nil {
		return AHAttr{}, errNil("query_ah", "AH")
	}
	return AHAttr{AHN: ahn(ah)}, nil
}

// MRAttr is struct efadv_mr_attr: the interconnect ids through which the region is reached.
type MRAttr struct {
	CompMask     uint64
	ICIDValidity MRValidity
	RecvICID     uint16
	RDMAReadICID uint16
	RDMARecvICID uint16
}

// QueryMR returns the region's interconnect ids (efadv_query_mr). A software device has no
// interconnects: every validity bit is clear.
func QueryMR(mr *verbs.MR) (MRAttr, error) { return QueryMRLen(mr, SizeofMRAttr) }

// QueryMRLen is QueryMR with libefa's inlen rule: inlen must be over 14.
func QueryMRLen(mr *verbs.MR, inlen int) (MRAttr, error) {
	if inlen <= 14 {
		return MRAttr{}, errInlen("query_mr", inlen, 14)
	}
	if mr == nil {
		return MRAttr{}, errNil("query_mr", "MR")
	}
	return MRAttr{}, nil
}

// QPInitAttr is struct efadv_qp_init_attr.
type QPInitAttr struct {
	CompMask     uint64
	DriverQPType DriverQPType
	Flags        QPFlags
	SL           uint8
	Reserved     uint8
	WRFlags      WRFlags
}

// CreateQPEx creates an SRD QP (efadv_create_qp_ex). attr.QPType must be verbs.QPTDriver and
// efa.CompMask and efa.Reserved zero (EINVAL); then libefa's creation checks apply in order
// (EOPNOTSUPP for a driver type other than SRD, flags or send ops the device lacks; EINVAL for
// sizes over the limits), and the rounded queue sizes are written back into attr.Cap.
func CreateQPEx(ctx *verbs.Context, attr *verbs.QPInitAttrEx, efa *QPInitAttr) (*verbs.QP, error) {
	return CreateQPExLen(ctx, attr, efa, SizeofQPInitAttr)
}

// CreateQPExLen is CreateQPEx with libefa's inlen rule: inlen must be over 8; fields beyond
// inlen read as zero (the reserved byte is checked regardless, as libefa reads it).
func CreateQPExLen(ctx *verbs.Context, attr *verbs.QPInitAttrEx, efa *QPInitAttr, inlen int) (*verbs.QP, error) {
	switch {
	case inlen <= 8:
		return nil, errInlen("create_qp_ex", inlen, 8)
	case ctx == nil || attr == nil || efa == nil:
		return nil, errNil("create_qp_ex", "context or attributes")
	case attr.QPType != verbs.QPTDriver:
		return nil, fmt.Errorf("efadv: QP type %d, want IBV_QPT_DRIVER: %w", attr.QPType, syscall.EINVAL)
	case efa.CompMask != 0:
		return nil, fmt.Errorf("efadv: comp_mask %#x: %w", efa.CompMask, syscall.EINVAL)
	case efa.Reserved != 0:
		return nil, fmt.Errorf("efadv: reserved byte %#x: %w", efa.Reserved, syscall.EINVAL)
	}
	drv := provider.QPAttr{DriverQPType: uint32(efa.DriverQPType)}
	if inlen > 12 {
		drv.Flags = uint16(efa.Flags)
	}
	if inlen > 14 {
		drv.SL = efa.SL
	}
	if inlen > 16 {
		drv.WRFlags = uint64(efa.WRFlags)
	}
	return createQPEx(ctx, attr, &drv)
}

// CreateDriverQP creates a QP of driverQPType in pd (efadv_create_driver_qp): attr.QPType must be
// verbs.QPTDriver (EINVAL); the rounded queue sizes are written back into attr.Cap.
func CreateDriverQP(pd *verbs.PD, attr *verbs.QPInitAttr, driverQPType DriverQPType) (*verbs.QP, error) {
	if pd == nil || attr == nil {
		return nil, errNil("create_driver_qp", "PD or attributes")
	}
	if attr.QPType != verbs.QPTDriver {
		return nil, fmt.Errorf("efadv: QP type %d, want IBV_QPT_DRIVER: %w", attr.QPType, syscall.EINVAL)
	}
	return createQP(pd, attr, &provider.QPAttr{DriverQPType: uint32(driverQPType)})
}

// QP is the EFA part of a QP (struct efadv_qp), from QPFromIBVQPEx.
type QP struct {
	CompMask uint64
	x        *verbs.QPEx
}

// QPFromIBVQPEx returns the EFA part of an extended QP (efadv_qp_from_ibv_qp_ex).
func QPFromIBVQPEx(x *verbs.QPEx) *QP { return &QP{x: x} }

// WRSetProcessingHints sets the current WR's processing hints (efadv_wr_set_processing_hints):
// call it after the opcode and before the next opcode or WRComplete. The QP needs
// WRExWithProcessingHints in its WRFlags, else the session fails with EOPNOTSUPP.
func WRSetProcessingHints(q *QP, hints ProcessingHints) { setHints(q.x, uint32(hints)) }

// WQAttr is struct efadv_wq_attr: one work queue's ring as the device reads it. Buffer is the
// ring itself; Doorbell is the word the producer stores its counter into, with sync/atomic.
type WQAttr struct {
	CompMask   uint64
	Buffer     []byte
	EntrySize  uint32
	NumEntries uint32
	Doorbell   *uint32
	MaxBatch   uint32
	Caps       WQCaps
}

// QueryQPWQs returns the QP's send and receive queues (efadv_query_qp_wqs). A program may write
// EFA-format WQEs and RX descriptors into them itself and store its producer counter into the
// doorbell (atomically); the device notices the store within its polling period, or at once
// after a post through package verbs. The SQ reports WQCaps64BitReqID when it takes 64-bit
// request ids.
func QueryQPWQs(qp *verbs.QP) (sq, rq WQAttr, err error) { return QueryQPWQsLen(qp, SizeofWQAttr) }

// QueryQPWQsLen is QueryQPWQs with libefa's inlen rules: inlen must be over 32; caps is filled
// past 38.
func QueryQPWQsLen(qp *verbs.QP, inlen int) (sq, rq WQAttr, err error) {
	if inlen <= 32 {
		return WQAttr{}, WQAttr{}, errInlen("query_qp_wqs", inlen, 32)
	}
	if qp == nil {
		return WQAttr{}, WQAttr{}, errNil("query_qp_wqs", "QP")
	}
	s, r := qpWQs(qp)
	sq = WQAttr{Buffer: s.Buffer, EntrySize: uint32(s.EntrySize), NumEntries: uint32(s.NumEntries),
		Doorbell: s.Doorbell, MaxBatch: uint32(s.MaxBatch)}
	rq = WQAttr{Buffer: r.Buffer, EntrySize: uint32(r.EntrySize), NumEntries: uint32(r.NumEntries),
		Doorbell: r.Doorbell, MaxBatch: uint32(r.MaxBatch)}
	if inlen > 38 && s.ReqID64 {
		sq.Caps = WQCaps64BitReqID
	}
	return sq, rq, nil
}

// RingDoorbell stores v into one of qp's doorbells (the SQ's or the RQ's, as QueryQPWQs reports
// them) and has the device look at the queue at once. It has no libefa counterpart: on EFA
// hardware a plain store is the doorbell; here a plain atomic store works too, but the device
// notices it only at its next doorbell poll. EINVAL for a nil or destroyed qp, or when db is not
// one of qp's doorbells.
func RingDoorbell(qp *verbs.QP, db *uint32, v uint32) error {
	if qp == nil {
		return errNil("ring_doorbell", "QP")
	}
	return ringDoorbell(qp, db, v)
}

// SQDepthAttr is struct efadv_sq_depth_attr.
type SQDepthAttr struct {
	CompMask      uint64
	Flags         SQDepthFlags
	MaxSendSGE    uint32
	MaxRDMASGE    uint32
	MaxInlineData uint32
}

// GetMaxSQDepth returns the deepest SQ a QP with these needs can have (efadv_get_max_sq_depth):
// the LLQ size over the WQE size (128 bytes for inline data over 32 or INLINE_WRITE), rounded down
// to a power of two. EINVAL for a non-zero CompMask or needs over the device's limits.
func GetMaxSQDepth(ctx *verbs.Context, attr SQDepthAttr) (int, error) {
	if ctx == nil {
		return 0, errNil("get_max_sq_depth", "context")
	}
	d := contextConfig(ctx)
	switch {
	case attr.CompMask != 0:
		return 0, fmt.Errorf("efadv: comp_mask %#x: %w", attr.CompMask, syscall.EINVAL)
	case attr.MaxSendSGE > uint32(d.MaxSQSGE), attr.MaxRDMASGE > uint32(d.MaxSGERD),
		attr.MaxInlineData > uint32(d.InlineBufSizeEx):
		return 0, fmt.Errorf("efadv: SQ needs %+v over the device limits: %w", attr, syscall.EINVAL)
	}
	wqe := uint32(64)
	if attr.MaxInlineData > 32 || attr.Flags&SQDepthAttrInlineWrite != 0 {
		wqe = 128
	}
	n := uint32(d.MaxLLQSize) / wqe
	if n == 0 {
		return 0, nil
	}
	p := uint32(1)
	for p*2 <= n {
		p *= 2
	}
	return int(p), nil
}

// RQDepthAttr is struct efadv_rq_depth_attr.
type RQDepthAttr struct {
	CompMask   uint64
	MaxRecvSGE uint32
}

// GetMaxRQDepth returns the deepest RQ, in WRs, for WRs of MaxRecvSGE buffers
// (efadv_get_max_rq_depth). EINVAL for a non-zero CompMask, more SGEs than the device takes, or
// zero SGEs (where libefa would divide by zero).
func GetMaxRQDepth(ctx *verbs.Context, attr RQDepthAttr) (int, error) {
	if ctx == nil {
		return 0, errNil("get_max_rq_depth", "context")
	}
	d := contextConfig(ctx)
	switch {
	case attr.CompMask != 0:
		return 0, fmt.Errorf("efadv: comp_mask %#x: %w", attr.CompMask, syscall.EINVAL)
	case attr.MaxRecvSGE == 0 || attr.MaxRecvSGE > uint32(d.MaxRQSGE):
		return 0, fmt.Errorf("efadv: max_recv_sge %d outside [1, %d]: %w", attr.MaxRecvSGE, d.MaxRQSGE, syscall.EINVAL)
	}
	return int(uint32(d.MaxRQWR) / attr.MaxRecvSGE), nil
}
