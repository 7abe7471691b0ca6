package verbs

import (
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/provider"
)

// This file is the provider's driver interface: what libefa keeps inside its own structures and
// package efadv reports. It is installed as internal/provider's hooks; programs reach it through
// efadv only.

func init() {
	provider.ContextConfig = func(c *Context) *config.Device { return &c.cfg }
	provider.CreateCQ = (*Context).createCQ
	provider.ReadSGID = (*CQ).driverReadSGID
	provider.IsUnsolicited = (*CQ).driverIsUnsolicited
	provider.CQRing = (*CQ).driverRing
	provider.CreateQPEx = (*Context).createQP
	provider.CreateQP = (*PD).createDriverQP
	provider.QPWQs = (*QP).driverWQs
	provider.RingDoorbell = (*QP).ringDoorbell
	provider.SetProcessingHints = (*QPEx).setProcessingHints
	provider.AHN = func(ah *AH) uint16 { return ah.e.AHN() }
}

// driverReadSGID returns the current receive completion's source GID (efadv_wc_read_sgid):
// ENOENT when the receiver has an AH for the sender, EOPNOTSUPP when the CQ was created without
// the SGID field.
func (cq *CQ) driverReadSGID() (GID, error) {
	if !cq.sgid {
		return GID{}, fmt.Errorf("verbs: CQ created without EFADV_WC_EX_WITH_SGID: %w", syscall.EOPNOTSUPP)
	}
	return cq.readSGID()
}

// driverIsUnsolicited reports whether the current receive completion consumed no receive WR
// (efadv_wc_is_unsolicited); false on a CQ created without the field.
func (cq *CQ) driverIsUnsolicited() bool {
	return cq.unsolicited && cq.cur.QType == efaio.QTypeRecv && cq.cur.Unsolicited
}

// driverRing returns the CQ's ring, entry size, entry count and doorbell (efadv_query_cq).
func (cq *CQ) driverRing() (buf []byte, entrySize, entries int, db *uint32) {
	return cq.ring, efaio.CQESize, cq.depth, cq.db
}

// driverWQs returns the QP's send and receive queues as the device reads them
// (efadv_query_qp_wqs), and has the device poll the QP's doorbells from now on: the caller may
// store them itself.
func (qp *QP) driverWQs() (sq, rq provider.WQ) {
	qp.e.PollDoorbells()
	sq = provider.WQ{Buffer: qp.sq.ring, EntrySize: qp.sq.esz, NumEntries: int(qp.sq.mask + 1),
		Doorbell: qp.sq.db, MaxBatch: qp.sq.maxBatch, ReqID64: qp.sq.reqID64}
	n := int(qp.rq.mask + 1)
	rq = provider.WQ{Buffer: qp.rq.ring, EntrySize: efaio.RxDescSize, NumEntries: n, Doorbell: qp.rq.db, MaxBatch: n}
	return sq, rq
}

// ringDoorbell stores v into one of the QP's doorbells and wakes the device at once; EINVAL when
// db is not one of them or the QP is destroyed.
func (qp *QP) ringDoorbell(db *uint32, v uint32) error {
	if qp.dead.Load() {
		return qp.errDead("ring doorbell")
	}
	if db != qp.sq.db && db != qp.rq.db {
		return fmt.Errorf("verbs: not a doorbell of QP %d: %w", qp.qpn, syscall.EINVAL)
	}
	atomic.StoreUint32(db, v)
	qp.ctx.e.Ring(qp.e)
	return nil
}
