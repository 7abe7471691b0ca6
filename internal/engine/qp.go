package engine

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/uapi"
)

// QPCaps are a QP's queue capabilities as the provider computed them; the device stores them for
// ibv_query_qp and checks them against its maxima.
type QPCaps struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE, MaxInlineData int
}

// QPInit describes a QP to create: what libefa passes in the create-QP command.
type QPInit struct {
	Type        int // uapi.QPTypeUD or uapi.QPTypeDriver
	DriverType  int // for QPTypeDriver: uapi.DriverQPTypeSRD
	PD          *PD
	SendCQ      *CQ
	RecvCQ      *CQ
	Caps        QPCaps
	SQEntries   int // WQEs in the SQ ring, a power of two
	SQEntrySize int // 64 or 128
	RQEntries   int // RX descriptors in the RQ ring, a power of two
	Flags       int // uapi.QPFlag*
	SL          uint8
	Owner       any // returned by Owner, for the provider's own bookkeeping

	// Memory the caller owns, or nil for the device to allocate.
	SQRing, RQRing         []byte
	SQDoorbell, RQDoorbell *uint32
}

// QP is a queue pair as the device sees it.
type QP struct {
	d      *Device
	pd     *PD
	lastAH *AH // the AH the QP's last send named (prepare): a stream to one peer looks it up once
	qpn    uint32
	gen    uint16
	typ    int
	flags  int
	sl     uint8
	caps   QPCaps
	sendCQ *CQ
	recvCQ *CQ

	attr QPAttr // State, QKey, SQPSN, RNRRetry, ...
	sq   sendQueue
	rq   recvQueue

	parked   []parkedWR   // sends waiting to retry after RNR
	out      []*sendWR    // sends on the network, waiting for the peer's answer
	outN     atomic.Int32 // len(out) up to 2, for a thread lingering without mu (AwaitRecv; publishOut)
	answered atomic.Int64 // device clock when a linger last took its receive (AwaitRecv)
	drainReq bool         // raise SQ_DRAINED when nothing is in flight
	kicked   atomic.Bool
	remote   atomic.Bool        // it has sent to another device (TalksToPeers)
	peer     atomic.Pointer[QP] // the QP of this device its last same-device message went to (LocalPeer)
	polled   bool               // its doorbells may be stored without Ring: the engine polls them (PollDoorbells)
	dead     bool
	owner    any

	// The producer counts of the send and receive CQs when the QP was destroyed: every
	// completion of the QP lies below them (Fences).
	fenceSend, fenceRecv uint16

	scratch efaio.TxDesc // decode buffer, so that the data path does not allocate

	// counts is guarded by d.mu, as everything that counts holds it: the data path counts
	// without a locked instruction. Its RecvWRs stays 0; recvs is that count, atomic, for
	// threads that wait for a receive without the lock (AwaitRecv).
	counts QPCounters
	recvs  atomic.Uint64
	taken  atomic.Uint64 // when processSQ last took WQEs: recvs then << 16 | the SQ's ci after (RecvsBefore)
}

// QPCounters are one QP's counters, with EFA's names where EFA has them.
type QPCounters struct {
	SendWRs, SendBytes, RecvWRs, RecvBytes                   uint64
	RDMAReadWRs, RDMAReadBytes, RDMAWriteWRs, RDMAWriteBytes uint64
	WRErrors                                                 uint64 // send WRs completed with an error
}

// add adds o's counts to c's.
func (c *QPCounters) add(o *QPCounters) {
	c.SendWRs += o.SendWRs
	c.SendBytes += o.SendBytes
	c.RecvWRs += o.RecvWRs
	c.RecvBytes += o.RecvBytes
	c.RDMAReadWRs += o.RDMAReadWRs
	c.RDMAReadBytes += o.RDMAReadBytes
	c.RDMAWriteWRs += o.RDMAWriteWRs
	c.RDMAWriteBytes += o.RDMAWriteBytes
	c.WRErrors += o.WRErrors
}

// Counters returns a snapshot of q's counters. It takes the device lock.
func (q *QP) Counters() QPCounters {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	return q.countsLocked()
}

// countsLocked is Counters, with d.mu held.
func (q *QP) countsLocked() QPCounters {
	c := q.counts
	c.RecvWRs = q.recvs.Load()
	return c
}

// Recvs returns how many receive WRs q has completed, without the device lock: the completions
// are written before the count moves, so a thread that sees it move finds them.
func (q *QP) Recvs() uint64 { return q.recvs.Load() }

// RecvsBefore returns the receive count (Recvs) past which a receive may answer the sends
// posted up to SQ doorbell value db: the count when the device took the last of them from the
// SQ, if it has (the engine loop's look at every SQ may take them before the Ring their post
// makes, and an answer may come meanwhile), and otherwise the count now. Without the device lock.
func (q *QP) RecvsBefore(db uint32) uint64 {
	at := q.taken.Load() // (first: now is then at least the count it holds)
	now := q.recvs.Load()
	if uint16(at) != uint16(db) {
		return now // (not yet taken, or later posts taken too)
	}
	const mask = 1<<48 - 1 // (the count's low 48 bits are kept: never that far behind now)
	then := at >> 16
	return now - (now-then)&mask
}

type sendQueue struct {
	ring  []byte
	esz   int
	cnt   uint32 // entries, a power of two
	db    *uint32
	ci    uint16 // WQEs consumed, modulo 2^16
	phase uint8  // expected phase bit of the entry at ci
}

type recvQueue struct {
	ring []byte
	cnt  uint32 // descriptors, a power of two
	db   *uint32
	ci   uint16 // descriptors consumed
	seen uint16 // doorbell value at the last look, to notice new receives
}

type parkedWR struct {
	desc  efaio.TxDesc
	tries int
	due   time.Duration // on the device clock
	// inl is an inline WR's data, kept apart from the SQ slot it came from (sendWR.inl says
	// why); desc.InlineBuf is pointed at it again when the WR is retried.
	inl [efaio.TxWQESize128]byte
}

// parked is the WR w parked for its tries-th attempt at due, with its inline data copied.
func parked(w *efaio.TxDesc, tries int, due time.Duration) parkedWR {
	p := parkedWR{desc: *w, tries: tries, due: due}
	if w.Inline {
		copy(p.inl[:], w.InlineBuf)
	}
	return p
}

// Owner returns the value given as QPInit.Owner; nil for a nil QP.
func (q *QP) Owner() any {
	if q == nil {
		return nil
	}
	return q.owner
}

// PollDoorbells tells the device that q's producer may store its doorbells without calling
// Ring, as a program writing the rings itself does (efadv_query_qp_wqs): the engine loop then
// looks at q's doorbells every PollMin to PollMax for as long as q lives. Without it, a device
// with nothing outstanding does not wake at all.
func (q *QP) PollDoorbells() {
	d := q.d
	d.mu.Lock()
	if !q.polled && !q.dead {
		q.polled = true
		d.polledQPs++
	}
	d.mu.Unlock()
	d.wake()
}

// Fences returns, for a destroyed QP, the producer counts of its send and receive CQs when it
// was destroyed: the device wrote every completion of the QP below them, so a consumer can tell
// the QP's last entries from those of a later QP given the same number.
func (q *QP) Fences() (send, recv uint16) {
	q.d.mu.Lock()
	defer q.d.mu.Unlock()
	return q.fenceSend, q.fenceRecv
}

// QPN returns the QP number.
func (q *QP) QPN() uint32 { return q.qpn }

// Gen returns the generation of the QP's number (see package qpn).
func (q *QP) Gen() uint16 { return q.gen }

// SQRing, SQDoorbell, RQRing and RQDoorbell return the QP's queue memory.
func (q *QP) SQRing() []byte      { return q.sq.ring }
func (q *QP) SQDoorbell() *uint32 { return q.sq.db }
func (q *QP) RQRing() []byte      { return q.rq.ring }
func (q *QP) RQDoorbell() *uint32 { return q.rq.db }

// CreateQP creates a QP in RESET with the kernel EFA driver's checks: EOPNOTSUPP for a QP type
// other than UD or SRD or unsupported flags; EINVAL for missing CQs, caps above the device maxima
// or ring sizes that are not powers of two; ENOMEM when QPs or QP numbers run out.
func (d *Device) CreateQP(in QPInit) (*QP, error) {
	cfg := &d.cfg
	const knownFlags = uapi.QPFlagUnsolicitedWriteRecv | uapi.QPFlagSQ64BitReqID
	switch {
	case in.Type != uapi.QPTypeUD && in.Type != uapi.QPTypeDriver:
		return nil, fmt.Errorf("engine: QP type %d: %w", in.Type, syscall.EOPNOTSUPP)
	case in.Type == uapi.QPTypeDriver && in.DriverType != uapi.DriverQPTypeSRD:
		return nil, fmt.Errorf("engine: driver QP type %d: %w", in.DriverType, syscall.EOPNOTSUPP)
	case in.Flags&^knownFlags != 0,
		in.Flags&uapi.QPFlagUnsolicitedWriteRecv != 0 && cfg.Caps&uapi.CapUnsolicitedWriteRecv == 0,
		in.Flags&uapi.QPFlagSQ64BitReqID != 0 && !cfg.RequestID64:
		return nil, fmt.Errorf("engine: QP flags %#x: %w", in.Flags, syscall.EOPNOTSUPP)
	case in.PD == nil || in.SendCQ == nil || in.RecvCQ == nil:
		return nil, fmt.Errorf("engine: QP needs a PD and both CQs: %w", syscall.EINVAL)
	case in.Caps.MaxSendWR > cfg.MaxSQWR, in.Caps.MaxRecvWR > cfg.MaxRQWR,
		in.Caps.MaxSendSGE > cfg.MaxSQSGE, in.Caps.MaxRecvSGE > cfg.MaxRQSGE,
		in.Caps.MaxInlineData > cfg.InlineBufSizeEx:
		return nil, fmt.Errorf("engine: QP caps %+v above the device maxima: %w", in.Caps, syscall.EINVAL)
	case in.SQEntrySize != efaio.TxWQESize && in.SQEntrySize != efaio.TxWQESize128,
		!isPow2(in.SQEntries), !isPow2(in.RQEntries),
		in.SQEntries*in.SQEntrySize > cfg.MaxLLQSize, in.RQEntries > cfg.MaxRQWR:
		return nil, fmt.Errorf("engine: SQ %d×%d bytes, RQ %d descriptors: %w",
			in.SQEntries, in.SQEntrySize, in.RQEntries, syscall.EINVAL)
	}
	sqRing, rqRing := in.SQRing, in.RQRing
	if sqRing == nil {
		sqRing = allocRing(in.SQEntries * in.SQEntrySize)
	}
	if rqRing == nil {
		rqRing = allocRing(in.RQEntries * efaio.RxDescSize)
	}
	sqDB, rqDB := in.SQDoorbell, in.RQDoorbell
	if sqDB == nil {
		sqDB = new(uint32)
	}
	if rqDB == nil {
		rqDB = new(uint32)
	}
	if len(sqRing) < in.SQEntries*in.SQEntrySize || len(rqRing) < in.RQEntries*efaio.RxDescSize {
		return nil, fmt.Errorf("engine: ring memory too small: %w", syscall.EINVAL)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if d.pds[in.PD.pdn] != in.PD || in.SendCQ.dead || in.RecvCQ.dead {
		return nil, fmt.Errorf("engine: QP on a freed PD or CQ: %w", syscall.EINVAL)
	}
	if len(d.qps) >= cfg.MaxQP {
		return nil, fmt.Errorf("engine: %d QPs, the device maximum: %w", len(d.qps), syscall.ENOMEM)
	}
	n, gen, err := d.qpns.Alloc()
	if err != nil {
		return nil, err
	}
	q := &QP{
		d: d, pd: in.PD, qpn: n, gen: gen, typ: in.Type, flags: in.Flags, sl: in.SL, caps: in.Caps,
		sendCQ: in.SendCQ, recvCQ: in.RecvCQ, owner: in.Owner,
		attr:   QPAttr{State: uapi.QPSReset, Port: 1, RNRRetry: uapi.RNRRetryInfinite},
		sq:     sendQueue{ring: sqRing, esz: in.SQEntrySize, cnt: uint32(in.SQEntries), db: sqDB},
		rq:     recvQueue{ring: rqRing, cnt: uint32(in.RQEntries), db: rqDB},
		parked: make([]parkedWR, 0, in.SQEntries),
	}
	clear(sqRing)
	clear(rqRing)
	atomic.StoreUint32(sqDB, 0)
	atomic.StoreUint32(rqDB, 0)
	d.qps[n] = q
	d.qpList = append(d.qpList, q)
	in.PD.refs++
	in.SendCQ.refs++
	in.RecvCQ.refs++
	d.wake() // the engine starts polling doorbells again if it had no QP
	return q, nil
}

// ModifyQP changes q's state and attributes (efa_modify_qp): EOPNOTSUPP for attributes EFA QPs
// lack or a port other than 1 or pkey index other than 0; EINVAL for a transition the QP type's
// state table does not allow or an attribute set it does not take.
func (d *Device) ModifyQP(q *QP, a *QPAttr, mask int) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if q.dead {
		return fmt.Errorf("engine: QP %d destroyed: %w", q.qpn, syscall.EINVAL)
	}
	next, err := checkModify(q.typ, q.attr.State, a, mask)
	if err != nil {
		return err
	}
	if mask&uapi.QPAttrQKey != 0 {
		q.attr.QKey = a.QKey
	}
	if mask&uapi.QPAttrSQPSN != 0 {
		q.attr.SQPSN = a.SQPSN & 0xffffff
	}
	if mask&uapi.QPAttrRNRRetry != 0 {
		q.attr.RNRRetry = a.RNRRetry
	}
	if mask&uapi.QPAttrPKeyIndex != 0 {
		q.attr.PKeyIndex = a.PKeyIndex
	}
	if mask&uapi.QPAttrEnSQDAsyncNotify != 0 {
		q.attr.EnSQDAsyncNotify = a.EnSQDAsyncNotify
	}
	prev := q.attr.State
	q.attr.State = next
	switch {
	case next == uapi.QPSReset:
		q.reset()
	case next == uapi.QPSErr && prev != uapi.QPSErr:
		q.flush()
	case next == uapi.QPSSQD && prev == uapi.QPSRTS:
		q.drainReq = q.attr.EnSQDAsyncNotify
		q.checkDrained()
	}
	if next == uapi.QPSRTS {
		d.wake()
	}
	return nil
}

// QueryQP returns q's attributes and the caps stored at creation.
func (d *Device) QueryQP(q *QP) (QPAttr, QPCaps) {
	d.mu.Lock()
	defer d.mu.Unlock()
	a := q.attr
	a.SQDraining = a.State == uapi.QPSSQD && len(q.parked)+len(q.out) > 0
	return a, q.caps
}

// DestroyQP flushes q's outstanding work requests (FLUSHED completions for every unprocessed or
// waiting send and every posted receive) and frees it. The QP number is not reused at once.
func (d *Device) DestroyQP(q *QP) error {
	var err error
	tq := d.takeTxq()
	d.locked(tq, func(now time.Duration) { err = d.destroyQP(q, now) })
	d.putTxq(tq)
	return err
}

// destroyQP is DestroyQP at now, with d.mu held.
func (d *Device) destroyQP(q *QP, now time.Duration) error {
	if q.dead {
		return fmt.Errorf("engine: QP %d already destroyed: %w", q.qpn, syscall.EINVAL)
	}
	// WQEs whose doorbell was stored before the destroy are carried out first, as a device that
	// fetches on the doorbell would have: a doorbell noticed late (by the watcher, for a mapping
	// that does not trap: docs/cabi.md, "Doorbells") must not turn a send the program made, and
	// may already count as done (an inject), into a flushed one. What is still on the network
	// afterwards is flushed below: its sent segments are delivered, the rest dropped. The
	// transport frames a batch's requests at its end (srd.Transport.Hold): Frame frames these
	// before the flush cancels them.
	if q.attr.State == uapi.QPSRTS && uint16(atomic.LoadUint32(q.sq.db)) != q.sq.ci {
		for d.processSQ(q, now) {
		}
		if d.srd != nil {
			d.srd.Frame(now)
		}
	}
	if q.attr.State != uapi.QPSReset {
		q.flush()
	}
	q.fenceSend, q.fenceRecv = q.sendCQ.pc, q.recvCQ.pc
	q.peer.Store(nil)                               // (no chain of destroyed QPs kept alive through it)
	if w := q.recvCQ.waiter; w != nil && w.q == q { // (no receive comes now: told at once)
		q.recvCQ.waiter, w.cq, w.q = nil, nil, nil
		w.Fn(nil)
	}
	if q.polled {
		d.polledQPs--
	}
	q.parked, q.out = nil, nil
	q.publishOut()
	q.dead = true
	c := q.countsLocked()
	d.retired.add(&c)
	delete(d.qps, q.qpn)
	for i, x := range d.qpList {
		if x == q {
			d.qpList = append(d.qpList[:i], d.qpList[i+1:]...)
			break
		}
	}
	d.qpns.Free(q.qpn)
	q.pd.refs--
	q.sendCQ.refs--
	q.recvCQ.refs--
	return nil
}

// reset discards everything in q's queues without completions, as IB's RESET does; the ring
// phase carries on from where the producer left it, as libefa keeps its phase across RESET.
func (q *QP) reset() {
	q.sq.skipTo(uint16(atomic.LoadUint32(q.sq.db)))
	q.sq.ci = 0
	atomic.StoreUint32(q.sq.db, 0)
	q.taken.Store(q.recvs.Load() << 16) // (ci 0: RecvsBefore)
	q.rq.ci, q.rq.seen = 0, 0
	atomic.StoreUint32(q.rq.db, 0)
	q.parked = q.parked[:0]
	for len(q.out) > 0 {
		q.d.cancel(q.out[len(q.out)-1]) // no completion: its answer, if it comes, is ignored
	}
	q.d.stopReceiving(q, false)
	q.drainReq = false
}

// skipTo advances the consumer to pc without processing, keeping the phase in step.
func (s *sendQueue) skipTo(pc uint16) {
	for s.ci != pc {
		s.advance()
	}
}

func (s *sendQueue) advance() {
	s.ci++
	if uint32(s.ci)&(s.cnt-1) == 0 {
		s.phase ^= 1
	}
}

func (s *sendQueue) slot(i uint16) efaio.TxWQE {
	off := int(uint32(i)&(s.cnt-1)) * s.esz
	return efaio.TxWQE(s.ring[off : off+s.esz])
}

// flush completes every outstanding work request of q with FLUSHED: waiting sends, sends not yet
// consumed from the SQ, and receives posted to the RQ.
func (q *QP) flush() {
	for len(q.out) > 0 {
		o := q.out[len(q.out)-1]
		q.completeSend(&o.w, efaio.StatusFlushed)
		q.d.cancel(o) // the answer, if it comes, is ignored
	}
	for i := range q.parked {
		q.completeSend(&q.parked[i].desc, efaio.StatusFlushed)
	}
	q.parked = q.parked[:0]
	for pc := uint16(atomic.LoadUint32(q.sq.db)); q.sq.ci != pc; q.sq.advance() {
		w := &q.scratch
		_ = q.sq.slot(q.sq.ci).Decode(w) // a malformed entry is flushed with the req_id it has
		w.CompReq = true
		q.completeSend(w, efaio.StatusFlushed)
	}
	q.d.stopReceiving(q, true) // a message received in part took its WR first
	var wr recvWR
	for q.rq.next(&wr, q.d.cfg.MaxRQSGE) {
		q.rq.ci += uint16(wr.ndesc)
		q.completeRecv(&efaio.Completion{ReqID: wr.reqID, Status: efaio.StatusFlushed})
	}
	q.checkDrained()
}

// checkDrained raises SQ_DRAINED once an SQD QP that asked for it has nothing in flight.
func (q *QP) checkDrained() {
	if q.drainReq && len(q.parked) == 0 && len(q.out) == 0 {
		q.drainReq = false
		q.d.raise(AsyncEvent{Type: uapi.EventSQDrained, QP: q})
	}
}

func isPow2(n int) bool { return n > 0 && n&(n-1) == 0 }
