package verbs

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/softefa/softefa/efaio"
)

// WC is a work completion (struct ibv_wc). ImmData is in host order: the value the sender gave.
type WC struct {
	WRID         uint64
	Status       WCStatus
	Opcode       WCOpcode
	VendorErr    uint32 // the EFA status (efaio.Status)
	ByteLen      uint32
	ImmData      uint32
	QPNum        uint32
	SrcQP        uint32
	WCFlags      WCFlags
	PKeyIndex    uint16
	SLID         uint16 // receive: the receiver's AH number for the sender, or 0xffff
	SL           uint8
	DLIDPathBits uint8
}

// errEmpty is the internal "no entry" result; StartPoll and NextPoll report it as ENOENT.
var errEmpty = errors.New("verbs: CQ empty")

// Poll reads up to len(wc) completions (ibv_poll_cq) and returns how many it read. An entry for a
// QP this context does not know, or one a destroyed QP left (its flush completions, whether or
// not a new QP has its number since), is consumed and dropped; if it is the first entry, Poll
// returns EINVAL, as libefa does (efa_poll_sub_cq: no QP in the QP table's slot, or a req_id of
// another generation). CQ.BadCompletions counts them.
//
// A Poll that finds the CQ empty takes what the network holds for the device, on the caller's
// goroutine, and looks again (busy polling: no handoff from the device's receive goroutine). A
// Poll that finds completions counts as busy polling too: while the application polls, the
// device's receive goroutine stays parked rather than reading beside it.
func (cq *CQ) Poll(wc []WC) (int, error) {
	n, err := cq.poll(wc)
	switch {
	case n > 0:
		cq.ctx.e.Polled()
	case err == nil && len(wc) > 0 && cq.ctx.e.PollNetwork():
		n, err = cq.poll(wc)
	}
	return n, err
}

func (cq *CQ) poll(wc []WC) (int, error) {
	cq.lock()
	defer cq.unlock()
	n := 0
	var err error
	cq.batching = true
	defer cq.endBatch() // (deferred: a panic must not leave a queue's pool lock held)
	for n < len(wc) {
		err = cq.next()
		if err != nil {
			break
		}
		cq.fill(&wc[n])
		n++
	}
	if n == 0 && err != nil && err != errEmpty {
		return 0, err
	}
	return n, nil
}

// next consumes the entry at the consumer index into cq.cur, cq.curUD and cq.wrid, and reports
// the new consumer count in the doorbell at once: a long StartPoll session or batch Poll does not
// make the device find the ring full. Called with the CQ lock held.
func (cq *CQ) next() error {
	slot := cq.ring[int(uint32(cq.cc)&cq.mask)*efaio.CQESize:][:efaio.CQESize]
	hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&slot[0])))
	if efaio.PhaseOf(hdr) != cq.phase {
		return errEmpty
	}
	cq.cc++
	if uint32(cq.cc)&cq.mask == 0 {
		cq.phase ^= 1
	}
	err := cq.take(slot, hdr)
	cq.ringConsumed() // after take: till then the device stays within a ring of the entry (before)
	return err
}

// take decodes the entry just consumed, hdr being its header word, and settles it in its QP's
// books.
func (cq *CQ) take(slot []byte, hdr uint32) error {
	c := &cq.cur
	if err := efaio.CQE(slot).Decode(hdr, c); err != nil {
		return cq.invalid("malformed CQE: %v", err)
	}
	// The live books are read before the graves: a destroy or a reset buries the books it
	// replaces before it replaces them, so an entry that misses the graves has the books read.
	var live *qpRef
	if qp := cq.ctx.qps[c.QPN].Load(); qp != nil {
		live = qp.books.Load()
	}
	q, ok := cq.graveFor(c.QPN, cq.cc-1) // an entry written before its QP went or was reset
	switch {
	case ok && q.sq == nil:
		// libefa finds no QP, or one of another generation, in its table: either way the
		// entry is not the live QP's, whatever number it has now.
		return cq.invalid("CQE of destroyed QP %d", c.QPN)
	case !ok && live == nil:
		return cq.invalid("CQE for unknown QP %d", c.QPN)
	case !ok:
		q = *live
	}
	cq.curUD = q.ud
	switch {
	case c.QType == efaio.QTypeSend && q.reqID64:
		cq.wrid = uint64(c.ReqID) | c.ReqIDEx<<16
		q.sq.completed.Add(1)
	case c.QType == efaio.QTypeRecv && c.Unsolicited:
		cq.wrid = 0
	default:
		wq := q.sq
		if c.QType == efaio.QTypeRecv {
			wq = q.rq
		}
		idx, ok := wq.index(c.ReqID)
		if !ok {
			return cq.invalid("CQE req_id %#x of QP %d from another generation", c.ReqID, c.QPN)
		}
		cq.wrid = wq.wrid[idx]
		if !cq.put(wq, idx) {
			return cq.invalid("CQE req_id %#x of QP %d for no outstanding WR", c.ReqID, c.QPN)
		}
	}
	return nil
}

// put returns the WR index idx to w's pool (wq.put). Within a Poll it keeps w's pool lock for
// the entries that follow, until an entry of other books or the Poll's end (unbook): no user code
// runs meanwhile, and the lock order is the CQ's lock, then the pool's, then the graves'.
func (cq *CQ) put(w *wq, idx uint16) bool {
	if !cq.batching {
		return w.put(idx)
	}
	if cq.booked != w {
		cq.unbook()
		w.poolMu.Lock()
		cq.booked = w
	}
	if !w.ungetLocked(idx) {
		return false
	}
	cq.bookedN++
	return true
}

// endBatch ends a Poll's batch: put takes pool locks per entry again, and the one it kept goes.
func (cq *CQ) endBatch() {
	cq.batching = false
	cq.unbook()
}

// unbook counts the WRs put took back as completed, and lets go of the pool lock it kept, if any.
func (cq *CQ) unbook() {
	if cq.booked != nil {
		cq.booked.completed.Add(cq.bookedN)
		cq.bookedN = 0
		cq.booked.poolMu.Unlock()
		cq.booked = nil
	}
}

// qpRef is what polling needs of a QP: its request-id books and its type.
type qpRef struct {
	sq, rq  *wq
	reqID64 bool
	ud      bool
}

// grave marks the entries a destroyed QP, or a QP's life before a move to RESET, left in a CQ.
// Each of the QP's CQs keeps one until the consumer has passed fence, the CQ's producer count
// when the QP went or was reset: the entries before it that name the QP (its flush completions,
// or those of WRs posted before the reset) are its own, the entries after it belong to whichever
// QP, or life of the QP, has the number since. A reset QP's grave keeps its request-id books, and
// its entries complete the WRs they name; a destroyed QP's keeps no books (sq and rq are nil),
// and its entries are dropped as libefa drops them (CQ.Poll). The grave goes once the consumer
// passes the fence.
type grave struct {
	qpRef
	qpn   uint16
	fence uint16
}

// bury keeps qp's current books for the entries it left in cq below fence, or, when the QP is
// destroyed (dead), marks those entries as ones to drop; nothing if there are none.
func (cq *CQ) bury(qp *QP, fence uint16, dead bool) {
	cq.graveMu.Lock()
	defer cq.graveMu.Unlock()
	if !cq.before(uint16(atomic.LoadUint32(cq.db)), fence) {
		return // the consumer has every entry the QP left
	}
	if dead { // the entries of its lives before a reset are dropped too
		for i := range cq.graves {
			if cq.graves[i].qpn == uint16(qp.qpn) {
				cq.graves[i].qpRef = qpRef{}
			}
		}
	}
	g := grave{qpn: uint16(qp.qpn), fence: fence}
	if !dead {
		g.qpRef = *qp.books.Load()
	}
	cq.graves = append(cq.graves, g)
	cq.nGraves.Store(int32(len(cq.graves)))
}

// graveFor returns the books of the destroyed QP qpn if the entry at position pos is one it
// left, and lets go of the graves the consumer has passed.
func (cq *CQ) graveFor(qpn uint16, pos uint16) (qpRef, bool) {
	if cq.nGraves.Load() == 0 {
		return qpRef{}, false
	}
	cq.graveMu.Lock()
	defer cq.graveMu.Unlock()
	var found qpRef
	ok := false
	keep := cq.graves[:0]
	for _, g := range cq.graves { // in the order the QPs went: the oldest match first
		if !cq.before(pos, g.fence) {
			continue // passed: every entry it left is consumed
		}
		keep = append(keep, g)
		if g.qpn == qpn && !ok {
			found, ok = g.qpRef, true
		}
	}
	clear(cq.graves[len(keep):])
	cq.graves = keep
	cq.nGraves.Store(int32(len(keep)))
	return found, ok
}

// produced returns the device's producer count, read from the ring: the first position, from the
// consumer's on, whose slot the device has not written yet. Every entry written before the call
// lies below it.
func (cq *CQ) produced() uint16 {
	p := uint16(atomic.LoadUint32(cq.db))
	for {
		for cq.holds(p) {
			p++
		}
		// Not written yet, unless the consumer has passed p and the slot holds the next lap.
		c := uint16(atomic.LoadUint32(cq.db))
		if int(p-c) <= cq.depth {
			return p
		}
		p = c
	}
}

// holds reports whether the slot of position p holds the entry of that position.
func (cq *CQ) holds(p uint16) bool {
	hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&cq.ring[int(uint32(p)&cq.mask)*efaio.CQESize])))
	return efaio.PhaseOf(hdr) == 1^uint8(uint32(p)/uint32(cq.depth)&1) // phase 1 on the first lap
}

// before reports whether position pos comes before fence. A fence is never more than a ring
// ahead of the positions it is compared with, nor a ring behind, and a ring is at most 2^15
// entries: fence-pos is 1..depth when pos is before it, and 0 or above depth when not.
func (cq *CQ) before(pos, fence uint16) bool {
	d := fence - pos
	return d != 0 && int(d) <= cq.depth
}

func (cq *CQ) invalid(format string, args ...any) error {
	cq.bad.Add(1)
	return fmt.Errorf("verbs: "+format+": %w", append(args, syscall.EINVAL)...)
}

// ringConsumed tells the device how many entries have been consumed (the CQ doorbell: the
// consumer count and cmd_sn, arm clear).
func (cq *CQ) ringConsumed() {
	atomic.StoreUint32(cq.db, efaio.CQDoorbell(cq.cc, uint8(cq.cmdSN.Load()), false))
}

// fill converts the current entry to a WC as libefa's efa_poll_cq does: send completions carry
// no length, source or AH.
func (cq *CQ) fill(wc *WC) {
	c := &cq.cur
	*wc = WC{
		WRID: cq.wrid, Status: statusToWC(c.Status), VendorErr: uint32(c.Status), QPNum: uint32(c.QPN),
		Opcode: cq.opcode(),
	}
	if c.QType == efaio.QTypeRecv {
		wc.ByteLen = c.Length
		wc.SrcQP = uint32(c.SrcQPN)
		wc.SLID = c.AHN
		wc.WCFlags = cq.flags()
		wc.ImmData = c.Imm
	}
}

func (cq *CQ) opcode() WCOpcode {
	c := &cq.cur
	switch {
	case c.QType == efaio.QTypeSend && c.Op == efaio.OpRDMAWrite:
		return WCRDMAWrite
	case c.QType == efaio.QTypeSend:
		return WCSend // an RDMA read completes as SEND, as in libefa
	case c.Op == efaio.OpRDMAWrite:
		return WCRecvRDMAWithImm
	}
	return WCRecv
}

func (cq *CQ) flags() WCFlags {
	var f WCFlags
	if cq.cur.HasImm {
		f |= WCWithImm
	}
	if cq.cur.QType == efaio.QTypeRecv && cq.curUD {
		f |= WCGRH
	}
	return f
}

// statusToWC maps an EFA status to ibv_wc_status as libefa's to_ibv_status does.
func statusToWC(s efaio.Status) WCStatus {
	switch s {
	case efaio.StatusOK:
		return WCSuccess
	case efaio.StatusFlushed:
		return WCWRFlushErr
	case efaio.StatusLocalQPInternalError, efaio.StatusLocalUnsupportedOp, efaio.StatusLocalInvalidAH:
		return WCLocQPOpErr
	case efaio.StatusLocalInvalidLKey:
		return WCLocProtErr
	case efaio.StatusLocalBadLength:
		return WCLocLenErr
	case efaio.StatusRemoteBadAddress:
		return WCRemAccessErr
	case efaio.StatusRemoteAbort:
		return WCRemAbortErr
	case efaio.StatusRemoteBadDestQPN:
		return WCRemInvRDReqErr
	case efaio.StatusRemoteRNR:
		return WCRNRRetryExcErr
	case efaio.StatusRemoteBadLength, efaio.StatusRemoteFeatureMismatch:
		return WCRemInvReqErr
	case efaio.StatusRemoteBadStatus:
		return WCBadRespErr
	case efaio.StatusLocalUnrespRemote, efaio.StatusLocalUnreachRemote:
		return WCRespTimeoutErr
	case efaio.StatusRemoteUnknownPeer:
		return WCRemOpErr
	}
	return WCGeneralErr
}

// PollCQAttr is the argument of StartPoll (struct ibv_poll_cq_attr); CompMask must be 0.
type PollCQAttr struct{ CompMask uint32 }

// StartPoll begins an extended poll (ibv_start_poll). It returns ENOENT, with the CQ lock
// released, if the CQ is empty; otherwise the first completion is current and the lock is held
// until EndPoll. Non-zero attr.CompMask is EINVAL.
func (cq *CQ) StartPoll(attr PollCQAttr) error {
	if attr.CompMask != 0 {
		return fmt.Errorf("verbs: start_poll comp_mask %#x: %w", attr.CompMask, syscall.EINVAL)
	}
	cq.lock()
	err := cq.next()
	switch {
	case err == nil:
		cq.ctx.e.Polled()
	case err == errEmpty && cq.ctx.e.PollNetwork(): // busy polling, as in Poll
		err = cq.next()
	}
	if err == errEmpty {
		cq.unlock()
		return syscall.ENOENT
	}
	if err != nil {
		cq.unlock()
		return err
	}
	cq.polling.Store(true)
	return nil
}

// NextPoll moves to the next completion (ibv_next_poll): ENOENT when there is none.
func (cq *CQ) NextPoll() error {
	err := cq.next()
	if err == errEmpty {
		return syscall.ENOENT
	}
	return err
}

// EndPoll ends an extended poll (ibv_end_poll): it releases the CQ lock. The device has been
// told of each entry as StartPoll and NextPoll consumed it. Without a session open (StartPoll
// failed or was not called, or EndPoll was already called) it does nothing.
func (cq *CQ) EndPoll() {
	if cq.polling.Swap(false) {
		cq.unlock()
	}
}

// WRID returns the current completion's work request id (ibv_cq_ex.wr_id).
func (cq *CQ) WRID() uint64 { return cq.wrid }

// Status returns the current completion's status (ibv_cq_ex.status).
func (cq *CQ) Status() WCStatus { return statusToWC(cq.cur.Status) }

// ReadOpcode returns the current completion's opcode (ibv_wc_read_opcode).
func (cq *CQ) ReadOpcode() WCOpcode { return cq.opcode() }

// ReadVendorErr returns the EFA status (ibv_wc_read_vendor_err).
func (cq *CQ) ReadVendorErr() uint32 { return uint32(cq.cur.Status) }

// ReadWCFlags returns the completion flags (ibv_wc_read_wc_flags).
func (cq *CQ) ReadWCFlags() WCFlags { return cq.flags() }

// ReadByteLen returns the received length, 0 for send completions (ibv_wc_read_byte_len).
func (cq *CQ) ReadByteLen() uint32 {
	if cq.cur.QType == efaio.QTypeSend {
		return 0
	}
	return cq.cur.Length
}

// ReadImmData returns the immediate data in host order (ibv_wc_read_imm_data).
func (cq *CQ) ReadImmData() uint32 { return cq.cur.Imm }

// ReadQPNum returns the local QP number (ibv_wc_read_qp_num).
func (cq *CQ) ReadQPNum() uint32 { return uint32(cq.cur.QPN) }

// ReadSrcQP returns the sender's QP number (ibv_wc_read_src_qp).
func (cq *CQ) ReadSrcQP() uint32 { return uint32(cq.cur.SrcQPN) }

// ReadSLID returns the receiver's AH number for the sender, 0xffff if none (ibv_wc_read_slid).
// It is 16 bits wide, as WC.SLID and the AH number are (C's ibv_wc_read_slid widens it to 32).
func (cq *CQ) ReadSLID() uint16 { return cq.cur.AHN }

// ReadSL returns 0: EFA reports no service level (ibv_wc_read_sl).
func (cq *CQ) ReadSL() uint8 { return 0 }

// ReadDLIDPathBits returns 0 (ibv_wc_read_dlid_path_bits).
func (cq *CQ) ReadDLIDPathBits() uint8 { return 0 }

// readSGID returns the source GID of the current receive completion when the receiving PD had no
// AH for the sender (efadv_wc_read_sgid); ENOENT when the AH is known.
func (cq *CQ) readSGID() (GID, error) {
	if cq.cur.AHN != efaio.UnknownAH {
		return GID{}, fmt.Errorf("verbs: sender's AH %d is known: %w", cq.cur.AHN, syscall.ENOENT)
	}
	return GID(cq.cur.SrcAddr), nil
}
