package verbs

import (
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/softefa/softefa/efaio"
)

// SendWR is a send work request (struct ibv_send_wr with its UD address). ImmData is in host
// order. EFA sends need AH, RemoteQPN and RemoteQKey.
type SendWR struct {
	WRID       uint64
	SGList     []SGE
	Opcode     WROpcode
	SendFlags  SendFlags
	ImmData    uint32
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR struct {
	WRID   uint64
	SGList []SGE
}

// PostSend posts send work requests (ibv_post_send). As in libefa it takes SEND and SEND_WITH_IMM
// only (RDMA goes through QPEx), every WR must be signaled, and it fails with EINVAL outside RTS
// and SQD, on a destroyed (or nil) QP, for other flags or opcodes, an AH of another PD, too many
// SGEs or too much inline data, and with ENOMEM when the send queue is full — a slot frees only
// when its completion is polled. On failure it returns the index of the WR that failed; the WRs
// before it are posted. The doorbell is rung every max_batch WQEs and at the end.
//
// The doorbell stores are made under the send queue's lock; the device is woken after it is
// released (Ring may do the device's work, and send, on this goroutine). A QPEx session holds
// that lock from WRStart on: PostSend waits for another goroutine's session to end, and must not
// be called inside the caller's own (it would wait for ever, as libefa's spins).
func (qp *QP) PostSend(wrs []SendWR) (int, error) {
	if qp == nil {
		return 0, fmt.Errorf("verbs: post send on a nil QP: %w", syscall.EINVAL)
	}
	sq := &qp.sq
	sq.mu.Lock()
	start := sq.rung
	n, err := qp.postSends(wrs)
	rung := sq.rung != start
	sq.mu.Unlock()
	if rung {
		qp.ctx.e.Ring(qp.e)
	}
	return n, err
}

func (qp *QP) postSends(wrs []SendWR) (int, error) {
	sq := &qp.sq
	if qp.dead.Load() {
		return 0, qp.errDead("post send")
	}
	for i := range wrs {
		if err := qp.postOne(&wrs[i]); err != nil {
			qp.ringSQ()
			return i, err
		}
		if int(sq.pc-sq.rung) >= sq.maxBatch {
			qp.ringSQ()
		}
	}
	qp.ringSQ()
	return len(wrs), nil
}

func (qp *QP) postOne(wr *SendWR) error {
	if err := qp.validateSend(wr.SendFlags); err != nil {
		return err
	}
	var op efaio.OpType
	switch wr.Opcode {
	case WRSend, WRSendWithImm:
		op = efaio.OpSend
	default:
		return fmt.Errorf("verbs: ibv_post_send opcode %d; EFA takes SEND and SEND_WITH_IMM: %w", wr.Opcode, syscall.EINVAL)
	}
	if wr.AH == nil {
		return fmt.Errorf("verbs: send WR without an AH: %w", syscall.EINVAL)
	}
	if wr.AH.pd != qp.pd { // the device looks the AH number up in the QP's PD
		return fmt.Errorf("verbs: send WR with an AH of another PD: %w", syscall.EINVAL)
	}
	s := &qp.sq.sess
	var d efaio.TxDesc
	if wr.SendFlags&SendInline != 0 {
		n, err := qp.gatherInline(wr.SGList, s.inl[:])
		if err != nil {
			return err
		}
		d.Inline, d.Length, d.InlineBuf = true, uint16(n), s.inl[:n]
	} else {
		if len(wr.SGList) > int(qp.cap.MaxSendSGE) {
			return fmt.Errorf("verbs: %d SGEs over max_send_sge %d: %w", len(wr.SGList), qp.cap.MaxSendSGE, syscall.EINVAL)
		}
		d.Length = uint16(len(wr.SGList))
		for j, sge := range wr.SGList {
			d.SGL[j] = efaio.BufDesc{Length: sge.Length, LKey: sge.LKey, Addr: sge.Addr}
		}
	}
	d.Op, d.HasImm, d.Imm = op, wr.Opcode == WRSendWithImm, wr.ImmData
	d.AHN, d.DestQPN, d.QKey = wr.AH.e.AHN(), uint16(wr.RemoteQPN), wr.RemoteQKey
	slot := qp.claimSlot(&d, wr.WRID)
	slot.Encode(&d)
	return nil
}

// gatherInline copies the bytes an inline send's SGEs name into buf. The SGEs must lie in
// regions of this context (the Go API reads memory only through a registered slice); the total
// must fit max_inline_data.
func (qp *QP) gatherInline(sges []SGE, buf []byte) (int, error) {
	n := 0
	for _, sge := range sges {
		if n+int(sge.Length) > int(qp.cap.MaxInlineData) || n+int(sge.Length) > len(buf) {
			return 0, fmt.Errorf("verbs: inline data over max_inline_data %d: %w", qp.cap.MaxInlineData, syscall.EINVAL)
		}
		b, ok := qp.ctx.mrBytes(sge)
		if !ok {
			return 0, fmt.Errorf("verbs: inline SGE at %#x not inside a region of lkey %#x: %w", sge.Addr, sge.LKey, syscall.EINVAL)
		}
		n += copy(buf[n:], b)
	}
	return n, nil
}

// validateSend is libefa's efa_post_send_validate: state RTS or SQD, signaled, flags EFA knows,
// room in the send queue.
func (qp *QP) validateSend(flags SendFlags) error {
	switch st := qp.State(); {
	case st != QPSRTS && st != QPSSQD:
		return fmt.Errorf("verbs: post send in state %v: %w", st, syscall.EINVAL)
	case flags&SendSignaled == 0 && !qp.sqSigAll:
		return fmt.Errorf("verbs: unsignaled send WRs are not supported: %w", syscall.EINVAL)
	case flags&^(SendSignaled|SendInline) != 0:
		return fmt.Errorf("verbs: send flags %#x: %w", flags&^(SendSignaled|SendInline), syscall.EINVAL)
	case qp.sq.full():
		return fmt.Errorf("verbs: send queue full (%d WRs outstanding until polled): %w", qp.sq.cnt, syscall.ENOMEM)
	}
	return nil
}

// claimSlot takes the next SQ slot for a WR: it fills d's request id (pool index and generation,
// or the whole wr_id in 64-bit mode), phase and completion request, and advances the producer.
func (qp *QP) claimSlot(d *efaio.TxDesc, wrid uint64) efaio.TxWQE {
	sq := &qp.sq
	if sq.reqID64 {
		d.ReqID, d.ReqIDEx = uint16(wrid), wrid>>16
	} else {
		idx := sq.get()
		sq.wrid[idx] = wrid
		d.ReqID = sq.reqID(idx)
		if sq.sess.active.Load() {
			sq.sess.idx = append(sq.sess.idx, idx)
		}
	}
	d.Phase, d.CompReq = sq.phase, true
	off := int(uint32(sq.pc)&sq.mask) * sq.esz
	slot := efaio.TxWQE(sq.ring[off : off+sq.esz])
	sq.pc++
	if uint32(sq.pc)&sq.mask == 0 {
		sq.phase ^= 1
	}
	sq.posted++
	return slot
}

// ringSQ stores the producer counter into the SQ doorbell (the caller wakes the device once it
// has let go of the send queue's lock).
func (qp *QP) ringSQ() {
	sq := &qp.sq
	if sq.pc == sq.rung {
		return
	}
	sq.rung = sq.pc
	atomic.StoreUint32(sq.db, uint32(sq.pc))
}

// PostRecv posts receive work requests (ibv_post_recv): one 16-byte descriptor per SGE (an empty
// WR gets one empty descriptor). It fails with EINVAL in RESET and ERR, on a destroyed (or nil)
// QP, or for more SGEs than max_recv_sge, and with ENOMEM when the receive queue holds
// max_recv_wr WRs not yet polled. On failure it returns the index of the WR that failed; the
// doorbell is rung either way.
func (qp *QP) PostRecv(wrs []RecvWR) (int, error) {
	if qp == nil {
		return 0, fmt.Errorf("verbs: post receive on a nil QP: %w", syscall.EINVAL)
	}
	rq := &qp.rq
	rq.mu.Lock()
	n, err := qp.postRecvs(wrs)
	atomic.StoreUint32(rq.db, uint32(rq.pc))
	rq.mu.Unlock()
	if e := qp.ctx.e; e.RecvsWanted() {
		e.Ring(qp.e) // after letting go: Ring may do the device's work on this goroutine
	}
	return n, err
}

func (qp *QP) postRecvs(wrs []RecvWR) (int, error) {
	rq := &qp.rq
	if qp.dead.Load() {
		return 0, qp.errDead("post receive")
	}
	if st := qp.State(); st == QPSReset || st == QPSErr {
		return 0, fmt.Errorf("verbs: post receive in state %v: %w", st, syscall.EINVAL)
	}
	for i := range wrs {
		wr := &wrs[i]
		switch {
		case len(wr.SGList) > int(qp.cap.MaxRecvSGE):
			return i, fmt.Errorf("verbs: %d SGEs over max_recv_sge %d: %w", len(wr.SGList), qp.cap.MaxRecvSGE, syscall.EINVAL)
		case rq.full():
			return i, fmt.Errorf("verbs: receive queue full (%d WRs): %w", rq.cnt, syscall.ENOMEM)
		}
		idx := rq.get()
		rq.wrid[idx] = wr.WRID
		n := max(len(wr.SGList), 1)
		for j := range n {
			f := efaio.RxDescFields{First: j == 0, Last: j == n-1}
			if j == 0 {
				f.ReqID = rq.reqID(idx)
			}
			if j < len(wr.SGList) {
				sge := &wr.SGList[j]
				f.Addr, f.Length, f.LKey = sge.Addr, uint16(min(sge.Length, 0xffff)), sge.LKey
			}
			off := int(uint32(rq.pc)&rq.mask) * efaio.RxDescSize
			efaio.RxDesc(rq.ring[off : off+efaio.RxDescSize]).Encode(&f)
			rq.pc++
		}
		rq.posted++
	}
	return len(wrs), nil
}
