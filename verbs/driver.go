package verbs

import (
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/softefa/softefa/efaio"
)

// This file is the provider's driver interface: what libefa keeps inside its own structures and
// package efadv reports. Programs use package efadv; these are exported for it.

// DriverDeviceAttr are the EFA device values the provider caches at context creation.
type DriverDeviceAttr struct {
	MaxSQWR         uint32
	MaxRQWR         uint32
	MaxSQSGE        uint16
	MaxRQSGE        uint16
	InlineBufSize   uint16
	InlineBufSizeEx uint16
	DeviceCaps      uint32
	MaxRDMASize     uint32
	MaxLLQSize      uint32
	MaxSGERD        uint32
}

// DriverAttr returns the context's EFA device values.
func (c *Context) DriverAttr() DriverDeviceAttr {
	cfg := &c.cfg
	return DriverDeviceAttr{
		MaxSQWR: uint32(cfg.MaxSQWR), MaxRQWR: uint32(cfg.MaxRQWR),
		MaxSQSGE: uint16(cfg.MaxSQSGE), MaxRQSGE: uint16(cfg.MaxRQSGE),
		InlineBufSize: uint16(cfg.InlineBufSize), InlineBufSizeEx: uint16(cfg.InlineBufSizeEx),
		DeviceCaps: cfg.Caps, MaxRDMASize: cfg.MaxRDMASize, MaxLLQSize: uint32(cfg.MaxLLQSize),
		MaxSGERD: uint32(cfg.MaxSGERD),
	}
}

// CreateCQExDriver is CreateCQEx with EFA's extra completion fields: the source GID of senders
// the receiver has no AH for, and the unsolicited flag.
func (c *Context) CreateCQExDriver(attr *CQInitAttrEx, sgid, unsolicited bool) (*CQ, error) {
	return c.createCQ(attr, sgid, unsolicited)
}

// DriverFlags reports which EFA completion fields the CQ was created with.
func (cq *CQ) DriverFlags() (sgid, unsolicited bool) { return cq.sgid, cq.unsolicited }

// DriverReadSGID returns the current receive completion's source GID (efadv_wc_read_sgid):
// ENOENT when the receiver has an AH for the sender, EOPNOTSUPP when the CQ was created without
// the SGID field.
func (cq *CQ) DriverReadSGID() (GID, error) {
	if !cq.sgid {
		return GID{}, fmt.Errorf("verbs: CQ created without EFADV_WC_EX_WITH_SGID: %w", syscall.EOPNOTSUPP)
	}
	return cq.readSGID()
}

// DriverIsUnsolicited reports whether the current receive completion consumed no receive WR
// (efadv_wc_is_unsolicited).
func (cq *CQ) DriverIsUnsolicited() bool {
	return cq.cur.QType == efaio.QTypeRecv && cq.cur.Unsolicited
}

// DriverRing returns the CQ's ring, entry size, entry count and doorbell (efadv_query_cq).
func (cq *CQ) DriverRing() (buf []byte, entrySize, entries int, db *uint32) {
	return cq.ring, efaio.CQESize, cq.depth, cq.db
}

// DriverWQ describes one work queue's ring (efadv_wq_attr).
type DriverWQ struct {
	Buffer     []byte
	EntrySize  int
	NumEntries int
	Doorbell   *uint32
	MaxBatch   int
	ReqID64    bool
}

// DriverWQs returns the QP's send and receive queues as the device reads them (efadv_query_qp_wqs).
func (qp *QP) DriverWQs() (sq, rq DriverWQ) {
	qp.e.PollDoorbells() // the caller may store doorbells itself from now on
	sq = DriverWQ{Buffer: qp.sq.ring, EntrySize: qp.sq.esz, NumEntries: int(qp.sq.mask + 1),
		Doorbell: qp.sq.db, MaxBatch: qp.sq.maxBatch, ReqID64: qp.sq.reqID64}
	n := int(qp.rq.mask + 1)
	rq = DriverWQ{Buffer: qp.rq.ring, EntrySize: efaio.RxDescSize, NumEntries: n, Doorbell: qp.rq.db, MaxBatch: n}
	return sq, rq
}

// DriverAttr returns the EFA attributes the QP was created with.
func (qp *QP) DriverAttr() DriverQPAttr { return qp.drv }

// Gen returns the generation of the QP's number: the high bits of its 16-bit request ids.
func (qp *QP) Gen() uint16 { return qp.e.Gen() }

// RingDoorbell stores v into one of the QP's doorbells (its SQ or RQ doorbell, as
// efadv_query_qp_wqs reports them) and wakes the device at once: the helper a program that
// writes WQEs itself can use instead of a plain atomic store, which the device notices only at
// its next doorbell poll. db must be one of the QP's doorbells.
func (qp *QP) RingDoorbell(db *uint32, v uint32) error {
	if db != qp.sq.db && db != qp.rq.db {
		return fmt.Errorf("verbs: not a doorbell of QP %d: %w", qp.qpn, syscall.EINVAL)
	}
	atomic.StoreUint32(db, v)
	qp.ctx.e.Ring(qp.e)
	return nil
}
