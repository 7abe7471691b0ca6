package engine

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/internal/wire"
)

// Kinds of outgoing message.
const (
	kindRequest  = iota // a SEND, RDMA write or read request from one of our QPs
	kindResp            // our answer to a peer's request
	kindReadResp        // read data answering a peer's READ_REQ
)

// outMsg is a message in a peer's outgoing stream. Requests are also in txStream.reqs until
// answered, and in their QP's out list until completed. An outMsg returns to the device's free
// list once it is answered (or needs no answer) and none of its segments is unacknowledged.
type outMsg struct {
	kind    int
	p       *peer
	hdr     wire.Data // fields of every frame of the message; PSN, Offset and Payload per segment
	src     [efaio.TxNumBufs][]byte
	nsrc    int
	length  uint64
	nseg    uint32
	sent    uint32 // segments handed to the stream at least once
	pending int    // segments in the stream not yet acknowledged
	done    bool   // needs nothing more but its segments' acknowledgements
	inQueue bool   // still in txStream.queue (pump has not moved past it)
	// withAck: every datagram carrying the message carries an ACK of the peer's stream too. A
	// RESP queued again after a transport timeout does: the peer's requests waiting for a
	// horizon of our abandoned epoch need one from the new epoch (settle), and the RESPs, which
	// go until acknowledged, bring it.
	withAck bool
	again   bool // resetTx has noted it to go again (read data)

	// Requests only.
	q        *QP // nil once the QP flushed it
	qIdx     int // position in q.out
	w        efaio.TxDesc
	tries    int
	sink     []byte // RDMA read: where the data goes
	got      uint64 // RDMA read: bytes arrived
	answered bool   // the peer answered: it has every segment
	faulted  bool   // the application's memory faulted under a segment: the rest go as ABORTs
	// A SEND or WRITE whose every segment is acknowledged waits in txStream.waiting until the
	// peer's stream reaches horizon (in the peer's epoch hEpoch): then no RESP says it failed.
	// A READ's data is counted in got for the peer's epoch hEpoch.
	waits   bool
	horizon uint32
	hEpoch  uint16
}

// sentPkt is a PSN's slot in the stream: which segment of which message it carries.
type sentPkt struct {
	msg   *outMsg
	seg   uint32
	at    time.Duration
	path  uint8
	retx  uint8
	acked bool
	lost  bool
	// suspect is 1 + the path of a transmission that timed out with nothing to blame it on yet:
	// if the packet then arrives by another path, that path swallowed it.
	suspect uint8
	copied  bool // sent on a second path too (copySeg)
}

// txStream is the sending half of a peer context.
type txStream struct {
	epoch      uint16
	next, una  uint32    // PSNs [una, next) are in ring
	ring       []sentPkt // indexed by psn & (len-1)
	inflight   int       // sent, not acknowledged, not counted lost
	cwnd       float64
	ssthresh   float64
	recovering bool
	recoverPSN uint32
	srtt       time.Duration
	rttvar     time.Duration
	minRTT     time.Duration
	rto        time.Duration
	progress   time.Duration // last time the peer acknowledged something, or the stream was idle
	queue      []*outMsg     // messages with segments not yet sent, in order
	retx       []uint32      // PSNs counted lost, to send again
	reqs       map[uint32]*outMsg
	waiting    []*outMsg // requests acknowledged whole, waiting for the peer's horizon (settle)
	unsent     uint32    // segments in queue not yet sent once: next+unsent is where the stream ends
	respEnd    uint32    // the PSN after our latest RESP, queued or sent: our ACKs' horizon
	nextMsg    uint32
	reoSteps   int           // the reordering allowance, in steps of a quarter of minRTT (reorderWindow)
	reoClean   int           // loss episodes since the last loss that proved spurious
	lossAt     time.Duration // when a packet was last counted lost (by acknowledgements or the timer)
	lossRate   float64       // moving average of packets' fates, 1 lost, 0 acknowledged (lossGain)
	sentAt     time.Duration // when a DATA frame last went to the peer (flushAcks)
	burst      int           // packets sent on the current path since it was picked

	newly    int           // onAck's scratch: packets newly acknowledged
	rtt      time.Duration // onAck's scratch: the latest RTT sample, or -1
	hzn      uint32        // the horizon of the newest ACK (wire.Ack.Horizon)
	hznEpoch uint16        // and the epoch of the peer's stream it is in
}

// queued counts m's segments into the stream; a RESP moves the horizon our ACKs carry
// (wire.Ack.Horizon) past it, so that every failure we have answered lies below the horizon.
func (s *txStream) queued(m *outMsg) {
	m.inQueue = true
	s.unsent += m.nseg
	if m.kind == kindResp {
		s.respEnd = s.next + s.unsent
	}
}

func (s *txStream) init() {
	s.ring = make([]sentPkt, 64)
	s.cwnd, s.ssthresh, s.rto = initialCwnd, maxCwnd, initialRTO
	s.reoSteps = 1
	s.reqs = make(map[uint32]*outMsg)
}

func (s *txStream) slot(psn uint32) *sentPkt { return &s.ring[psn&uint32(len(s.ring)-1)] }

// reorderWindow is how much later than a packet another may be sent and still be acknowledged
// first without the packet counting as lost: a quarter of the least RTT seen, times reoSteps,
// which grows each time a loss proves spurious (the packet was acknowledged after all) and falls
// back after 16 loss episodes without one; never above the smoothed RTT.
func (s *txStream) reorderWindow() time.Duration {
	base := max(s.minRTT/4, minReorder)
	return min(base*time.Duration(s.reoSteps), max(s.srtt, minReorder))
}

// resetRTO undoes the retransmission timer's backoff: the peer is acknowledging again.
func (s *txStream) resetRTO() {
	if s.srtt > 0 {
		s.rto = min(max(s.srtt+4*s.rttvar, minRTO), maxRTO)
	}
}

// busy reports whether the stream has anything outstanding.
func (s *txStream) busy() bool { return s.una != s.next || len(s.queue) > 0 || len(s.reqs) > 0 }

// grow doubles the ring, keeping [una, next) in place by PSN.
func (s *txStream) grow() {
	old := s.ring
	s.ring = make([]sentPkt, 2*len(old))
	for psn := s.una; psn != s.next; psn++ {
		*s.slot(psn) = old[psn&uint32(len(old)-1)]
	}
}

// newMsg takes an outMsg from the free list.
func (d *Device) newMsg(p *peer, kind int) *outMsg {
	var m *outMsg
	if n := len(d.freeMsgs); n > 0 {
		m = d.freeMsgs[n-1]
		d.freeMsgs = d.freeMsgs[:n-1]
		*m = outMsg{}
	} else {
		m = new(outMsg)
	}
	m.p, m.kind = p, kind
	return m
}

// release returns m to the free list when nothing refers to it any more.
func (d *Device) release(m *outMsg) {
	if m.done && m.pending == 0 && m.sent == m.nseg && m.q == nil && !m.inQueue {
		m.p = nil
		d.freeMsgs = append(d.freeMsgs, m)
	}
}

// enqueue adds m to p's stream: its segments go out as the window allows.
func (d *Device) enqueue(p *peer, m *outMsg) {
	d.queue(p, m)
	d.pump(p)
}

// queue adds m to p's stream without sending anything yet.
func (d *Device) queue(p *peer, m *outMsg) {
	seg := uint64(d.segSize())
	m.nseg = uint32(max((m.length+seg-1)/seg, 1))
	if m.hdr.Op == wire.OpReadReq || m.hdr.Op == wire.OpResp {
		m.nseg = 1
	}
	if !p.tx.busy() {
		// The stream starts waiting now: the transport timeout counts from here, not from
		// whenever it last moved (an idle stream's progress is as old as its last traffic).
		p.tx.progress = d.now
		p.seen = p.tx.progress
	}
	if m.kind == kindRequest {
		p.tx.reqs[m.hdr.MsgID] = m // after the idle check: an outstanding request makes the stream busy
	}
	d.txBusy = true // the engine loop's timer runs until the stream is idle again
	p.tx.queue = append(p.tx.queue, m)
	p.tx.queued(m)
}

// sendRemote starts a request to another device: it goes on the peer's stream, and q's WR
// completes when the peer answers (or the transport gives up).
func (d *Device) sendRemote(q *QP, w *efaio.TxDesc, m *message, tries int) efaio.Status {
	p := d.peerFor(m.dstGID)
	if p == nil {
		return efaio.StatusLocalUnreachRemote
	}
	o := d.newMsg(p, kindRequest)
	o.q, o.w, o.tries = q, *w, tries
	o.length, o.src, o.nsrc, o.sink = m.length, m.src, m.nsrc, m.sink
	op := uint8(wire.OpSend)
	switch m.op {
	case efaio.OpRDMAWrite:
		op = wire.OpWrite
	case efaio.OpRDMARead:
		op = wire.OpReadReq
	}
	o.hdr = wire.Data{
		MsgID: p.tx.nextMsg, Length: uint32(m.length), Op: op, SrcQPN: m.srcQPN, DstQPN: m.dstQPN,
		QKey: m.qkey, Imm: m.imm, RKey: m.rkey, RAddr: m.raddr,
	}
	if m.hasImm {
		o.hdr.Flags |= wire.FlagImm
	}
	p.tx.nextMsg++
	o.qIdx = len(q.out)
	q.out = append(q.out, o)
	d.enqueue(p, o)
	return statusPending
}

// statusPending is execute's "the WR is on the network": not an EFA status.
const statusPending efaio.Status = 0xff

// sendUD sends a UD message as one unacknowledged datagram; the WR succeeds once it is sent.
func (d *Device) sendUD(m *message) efaio.Status {
	p := d.peerFor(m.dstGID)
	if p == nil {
		return efaio.StatusLocalUnreachRemote
	}
	hdr := wire.Data{Length: uint32(m.length), Op: wire.OpSend, Flags: wire.FlagUD, SrcQPN: m.srcQPN,
		DstQPN: m.dstQPN, QKey: m.qkey, Imm: m.imm}
	if m.hasImm {
		hdr.Flags |= wire.FlagImm
	}
	size := wire.FrameHeaderSize + wire.DataHeaderSize + int(m.length)
	b := d.roomLarge(p, d.pickPath(p, -1), size)
	b = wire.AppendDataHeader(b, &hdr, int(m.length))
	for _, s := range m.src[:m.nsrc] {
		b = append(b, s...)
	}
	d.commit(b)
	return efaio.StatusOK
}

// roomLarge is room for a frame that may not fit a path-MTU datagram (a UD message up to the
// device MTU): it gets a datagram of its own, which the IP layer fragments if it must.
func (d *Device) roomLarge(p *peer, path, size int) []byte {
	if wire.DatagramHeaderSize+size <= d.txq.maxLen {
		return d.room(p, path, size)
	}
	d.txq.cur = nil // start a datagram of its own
	b := d.room(p, path, 0)
	pk := &d.txq.pkts[d.txq.n-1]
	if cap(pk.Buf) < len(b)+size {
		nb := make([]byte, len(b), len(b)+size)
		copy(nb, b)
		pk.Buf = nb
		b = nb
	}
	d.txq.cur = nil // nothing else joins it
	return b
}

// pump sends what p's window allows: retransmissions first, then new segments. Both count
// against the congestion window.
func (d *Device) pump(p *peer) {
	s := &p.tx
	now := d.now
	if len(s.retx) > 1 {
		// Oldest first: the lowest hole holds the receiver's cumulative point, and the ACK's
		// selective bits reach only 256 PSNs past it. Last in line behind a long list, at a
		// small window and a backed-off timer, it could wait past the transport timeout.
		una := s.una
		byAge := func(a, b uint32) int { return cmp.Compare(a-una, b-una) }
		if !slices.IsSortedFunc(s.retx, byAge) {
			slices.SortFunc(s.retx, byAge)
		}
	}
	taken := 0
	for taken < len(s.retx) && float64(s.inflight) < max(s.cwnd, 1) {
		psn := s.retx[taken]
		taken++
		if psnLess(psn, s.una) || !psnLess(psn, s.next) {
			continue
		}
		e := s.slot(psn)
		if e.acked || !e.lost || e.msg == nil {
			continue
		}
		e.lost = false
		if m := e.msg; m.kind == kindRequest && m.done && m.q == nil && m.answered {
			// The answer proved the peer has every segment: nothing to send again.
			s.inflight++ // ack() takes it back out
			d.ackSlot(p, e, now)
			continue
		}
		e.retx++
		d.sendSeg(p, psn, e, now, int(e.path))
	}
	s.retx = s.retx[:copy(s.retx, s.retx[taken:])]
	done := 0
	for done < len(s.queue) && float64(s.inflight) < s.cwnd {
		m := s.queue[done]
		if m.sent == m.nseg {
			done++ // cut short by cancel: it may go to the free list now that the queue lets go
			m.inQueue = false
			d.release(m)
			continue
		}
		if s.next-s.una >= uint32(len(s.ring)) {
			if len(s.ring) >= maxCwnd*2 {
				break
			}
			s.grow()
		}
		psn := s.next
		s.next++
		s.unsent--
		e := s.slot(psn)
		*e = sentPkt{msg: m, seg: m.sent}
		m.sent++
		m.pending++
		d.sendSeg(p, psn, e, now, -1)
		if s.inflight <= sparseFlight && s.lossRate >= sparseLoss && now-s.lossAt < lossMemory && !d.cfg.NoSparseCopies {
			d.copySeg(p, psn, e)
		}
		if m.sent == m.nseg {
			done++
			m.inQueue = false
		}
	}
	n := copy(s.queue, s.queue[done:])
	clear(s.queue[n:]) // let go of the messages moved past
	s.queue = s.queue[:n]
}

// sendSeg writes the DATA frame for slot e (PSN psn) on a path other than avoid when it can.
func (d *Device) sendSeg(p *peer, psn uint32, e *sentPkt, now time.Duration, avoid int) {
	path := d.pickPath(p, avoid)
	n := d.writeSeg(p, psn, e, path)
	e.at, e.path = now, uint8(path)
	p.tx.sentAt = now
	p.tx.inflight++
	p.paths[path].sent++
	if e.retx > 0 {
		d.counts.RetransPkts.Add(1)
		d.counts.RetransBytes.Add(uint64(n))
	}
}

// sparseFlight is the most packets in flight at which a new packet also goes as a copy on a
// second path, if the stream's recent loss rate is at least sparseLoss and it lost a packet within
// lossMemory (and unless config.Device.NoSparseCopies): a network that loses nothing pays nothing,
// nor one that lost a packet once. lossGain is the loss rate's averaging length, in packets:
// after a single loss the rate stays above sparseLoss for about 500 packets, so that at 1% loss
// copies are on nearly all the time (at 64 and 0.2% they were off a quarter of it, and a loss
// then waited for the 2 ms timer: the ping-pong's p99 with 1% loss).
const (
	sparseFlight = 4
	sparseLoss   = 0.0005
	lossGain     = 256
	lossMemory   = time.Second
)

// countFate moves the stream's loss rate by one packet's fate.
func (s *txStream) countFate(lost bool) {
	if lost {
		s.lossRate += (1 - s.lossRate) / lossGain
	} else {
		s.lossRate -= s.lossRate / lossGain
	}
}

// copySeg sends slot e's frame once more, on the next healthy path after its own: while few
// packets are in flight, a lost one has no later packets to reveal its loss and waits for the
// retransmission timer (2 ms at least), the whole of a latency-bound exchange's tail under loss;
// a copy on another path makes that a loss of both. The copy is not in the flight count, and an
// acknowledgement of either credits no path (which of the two arrived is unknown).
func (d *Device) copySeg(p *peer, psn uint32, e *sentPkt) {
	n := len(p.paths)
	for i := 1; i < n; i++ {
		path := (int(e.path) + i) % n
		if !p.paths[path].failed {
			d.ackCopy = true
			d.writeSeg(p, psn, e, path)
			d.ackCopy = false
			p.paths[path].sent++
			e.copied = true
			d.counts.SparseCopies.Add(1)
			return
		}
	}
}

// writeSeg appends slot e's DATA frame (PSN psn) to a datagram on path and returns how many
// payload bytes it carries.
func (d *Device) writeSeg(p *peer, psn uint32, e *sentPkt, path int) int {
	m := e.msg
	seg := uint64(d.segSize())
	off := uint64(e.seg) * seg
	n := 0
	if m.hdr.Op != wire.OpReadReq && m.hdr.Op != wire.OpResp {
		n = int(min(seg, m.length-min(off, m.length)))
	}
	hdr := m.hdr
	hdr.PSN, hdr.Offset = psn, uint32(off)
	if m.kind == kindRequest && m.q == nil && !m.answered {
		// Flushed by its QP: the application may reuse the buffer, so the segment goes again
		// without it, as an ABORT that lets the responder drop what it has of the message.
		hdr.Op, n = wire.OpAbort, 0
	}
	if m.faulted {
		hdr.Op, n = wire.OpAbort, 0
	}
	d.ackForce = m.withAck
	b := d.room(p, path, wire.FrameHeaderSize+wire.DataHeaderSize+n)
	d.ackForce = false
	start := len(b)
	b = wire.AppendDataHeader(b, &hdr, n)
	ok := true
	if d.foreignMRs == 0 {
		b = appendRange(b, m.src[:m.nsrc], off, n)
	} else {
		b, ok = guardedRange(b, m.src[:m.nsrc], off, n)
	}
	if !ok {
		// The application's memory faulted under the segment: it goes as an ABORT (the peer
		// drops what it has of the message), and so does the rest of the message.
		m.faulted = true
		hdr.Op, n = wire.OpAbort, 0
		b = wire.AppendDataHeader(b[:start], &hdr, 0)
		d.commit(b)
		d.onFault(p, m)
		return 0
	}
	d.commit(b)
	return n
}

// guardedRange is appendRange under a fault guard (catchFault): false if the source faulted.
func guardedRange(b []byte, src [][]byte, off uint64, n int) ([]byte, bool) {
	ok := catchFault(func() { b = appendRange(b, src, off, n) })
	return b, ok
}

// onFault ends a message whose memory faulted while a segment was built: a request fails with
// LOCAL_ERROR_INVALID_LKEY; read data we were sending is answered with REMOTE_ERROR_BAD_ADDRESS,
// which fails the peer's read. (Queued, not pumped: this runs inside pump.)
func (d *Device) onFault(p *peer, m *outMsg) {
	switch m.kind {
	case kindRequest:
		if m.q != nil {
			d.completeReq(m, efaio.StatusLocalInvalidLKey, false)
		}
	case kindReadResp:
		o := d.newMsg(p, kindResp)
		o.hdr = wire.Data{MsgID: m.hdr.MsgID, Op: wire.OpResp, Status: uint8(efaio.StatusRemoteBadAddress)}
		o.done, o.nseg = true, 1
		p.tx.queue = append(p.tx.queue, o)
		p.tx.queued(o)
	}
}

// appendRange appends bytes [off, off+n) of the concatenation of src.
func appendRange(b []byte, src [][]byte, off uint64, n int) []byte {
	for _, s := range src {
		if n == 0 {
			break
		}
		if off >= uint64(len(s)) {
			off -= uint64(len(s))
			continue
		}
		k := min(n, len(s)-int(off))
		b = append(b, s[off:int(off)+k]...)
		n -= k
		off = 0
	}
	return b
}

// pickPath chooses the path for the next packet to p: the current one for a burst of packets,
// so that GSO/GRO-style batching survives, then the next healthy one; never avoid if another
// healthy path exists.
func (d *Device) pickPath(p *peer, avoid int) int {
	const burst = 16
	n := len(p.paths)
	if n == 1 {
		return 0
	}
	if avoid < 0 && p.tx.burst < burst && !p.paths[p.pathRR].failed {
		p.tx.burst++
		return p.pathRR
	}
	for i := 1; i <= n; i++ {
		c := (p.pathRR + i) % n
		if !p.paths[c].failed && c != avoid {
			p.pathRR, p.tx.burst = c, 1
			return c
		}
	}
	// Every other path has failed: use them anyway, in turn.
	p.pathRR = (p.pathRR + 1) % n
	return p.pathRR
}

// Why a stream is reset (resetTx).
const (
	// resetTimeout: the peer stopped acknowledging for the transport timeout. Every request
	// fails with the given status; our answers not yet acknowledged are queued again in the new
	// stream. RESPs: the peer's requests they fail may be waiting for them, and an ACK of the new
	// stream (whose horizon starts over) must not let those succeed. Read data, whole: the
	// peer's read would otherwise wait for bytes the old stream took with it (reading twice is
	// harmless; the peer counts afresh). They go again after every timeout until acknowledged,
	// to a peer that may be gone for good: correctness first.
	resetTimeout = iota
	// resetRestart: the peer is a new incarnation. Requests its earlier life acknowledged in
	// part or whole, or answered, fail with the given status (REMOTE_ABORT: what happened to
	// them died with it); requests it never acknowledged any of go again, whole, to the new
	// life, since nothing shows the earlier one had them (docs/wire.md, "Incarnations").
	resetRestart
)

// resetTx abandons p's outgoing stream (why says what happens to its requests and answers) and
// starts it again from PSN 0 in a new epoch, so that the receiver starts afresh too.
func (d *Device) resetTx(p *peer, st efaio.Status, why int) {
	s := &p.tx
	var answers []wire.Data
	var reads []readAgain
	var carry []*outMsg
	// In the order they were sent (not the map's), so that a replayed run completes them alike.
	reqs := slices.SortedFunc(maps.Values(s.reqs), func(a, b *outMsg) int { return cmp.Compare(a.hdr.MsgID-s.nextMsg, b.hdr.MsgID-s.nextMsg) })
	for _, m := range reqs {
		switch {
		case m.q == nil:
		case why == resetRestart && m.untouched():
			carry = append(carry, m)
		default:
			d.completeReq(m, st, false)
		}
	}
	for psn := s.una; psn != s.next; psn++ {
		if e := s.slot(psn); e.msg != nil {
			switch m := e.msg; {
			case why != resetTimeout || e.acked:
			case m.kind == kindResp:
				answers = append(answers, m.hdr)
			case m.kind == kindReadResp && !m.again:
				m.again = true // once, whatever number of its segments are out
				reads = append(reads, readAgain{m.hdr, m.src[0], m.length})
			}
			e.msg.pending = 0
			e.msg.done = true
			e.msg.sent = e.msg.nseg
			d.release(e.msg)
			e.msg = nil
		}
	}
	for _, m := range s.queue {
		switch {
		case why != resetTimeout:
		case m.kind == kindResp:
			answers = append(answers, m.hdr)
		case m.kind == kindReadResp && !m.again:
			reads = append(reads, readAgain{m.hdr, m.src[0], m.length})
		}
		m.done, m.sent, m.pending, m.inQueue = true, m.nseg, 0, false
		d.release(m)
	}
	epoch := s.epoch + 1
	nextMsg := s.nextMsg
	*s = txStream{}
	s.init()
	s.epoch, s.nextMsg = epoch, nextMsg
	for i := range p.paths {
		p.paths[i] = pathState{}
	}
	if d.txq != nil && d.txq.cur == p {
		d.txq.cur = nil // what follows is the new stream's: a datagram of its own
	}
	for _, h := range answers {
		o := d.newMsg(p, kindResp)
		o.hdr, o.done, o.withAck = h, true, true
		o.hdr.PSN, o.hdr.Offset = 0, 0
		d.queue(p, o) // all of them before any goes: the horizon an ACK carries lies past them all
	}
	for _, r := range reads {
		o := d.newMsg(p, kindReadResp)
		o.hdr, o.done = r.hdr, true
		o.hdr.PSN, o.hdr.Offset = 0, 0
		o.src[0], o.nsrc, o.length = r.src, 1, r.length
		d.queue(p, o)
	}
	if len(answers)+len(reads) > 0 {
		d.pump(p)
	}
	for _, m := range carry {
		d.resend(m)
	}
}

// readAgain is read data to send again in a new stream (resetTimeout).
type readAgain struct {
	hdr    wire.Data
	src    []byte
	length uint64
}

// untouched reports whether nothing shows that the peer had any of request m: no segment
// acknowledged, no answer, no read data.
func (m *outMsg) untouched() bool {
	return !m.answered && !m.waits && m.got == 0 && m.acked() == 0
}

// acked is how many of m's segments handed to the stream were acknowledged.
func (m *outMsg) acked() uint32 { return m.sent - uint32(m.pending) }

// resend sends request m again from its start as a new message on its peer's stream, in m's
// place in its QP's list; m itself is let go.
func (d *Device) resend(m *outMsg) {
	p, q := m.p, m.q
	delete(p.tx.reqs, m.hdr.MsgID) // an answer to m, if one comes, finds nothing
	p.tx.unwait(m)
	m.done = true
	o := d.newMsg(p, kindRequest)
	o.q, o.w, o.tries = q, m.w, m.tries
	o.length, o.src, o.nsrc, o.sink = m.length, m.src, m.nsrc, m.sink
	o.hdr = m.hdr
	o.hdr.MsgID = p.tx.nextMsg
	p.tx.nextMsg++
	o.qIdx = m.qIdx
	q.out[o.qIdx] = o
	m.q = nil
	d.release(m)
	d.enqueue(p, o)
}

// completeReq finishes a request with st: its WR completes (or, after RNR, waits to be tried
// again as a new message) and it leaves its QP and its stream's request table.
func (d *Device) completeReq(m *outMsg, st efaio.Status, mayRetry bool) {
	delete(m.p.tx.reqs, m.hdr.MsgID)
	m.p.tx.unwait(m)
	m.done = true
	m.answered = true
	if q := m.q; q != nil {
		q.dropOut(m)
		if mayRetry && st == efaio.StatusRemoteRNR && (q.attr.RNRRetry == 7 || m.tries < int(q.attr.RNRRetry)) &&
			(q.attr.State == uapi.QPSRTS || q.attr.State == uapi.QPSSQD) {
			q.parked = append(q.parked, parkedWR{desc: m.w, tries: m.tries + 1, due: d.now + d.cfg.RNRInterval})
		} else {
			var msg message
			msg.length = m.length
			d.count(q, &m.w, &msg, st)
			q.completeSend(&m.w, st)
		}
	}
	d.release(m)
}

// cancel detaches a request from its flushed QP: it stops waiting for an answer, its segments
// not yet sent are dropped and, if the responder may hold part of it, one ABORT frame tells it to
// let go.
func (d *Device) cancel(m *outMsg) {
	m.q.dropOut(m)
	delete(m.p.tx.reqs, m.hdr.MsgID) // an answer, if one comes, finds nothing
	m.p.tx.unwait(m)
	m.done = true
	if m.sent < m.nseg {
		partial := m.sent > 0
		old := m.nseg
		m.nseg = m.sent
		if partial {
			m.nseg++ // the ABORT, sent as the message's next segment
		}
		s := &m.p.tx
		s.unsent -= old - m.nseg
		if psnLess(s.next, s.respEnd) {
			s.recountRespEnd() // a RESP queued behind m takes an earlier PSN now
		}
	}
	d.release(m)
}

// recountRespEnd finds where the latest queued RESP will go, from the queue as it stands.
func (s *txStream) recountRespEnd() {
	pos := s.next
	for _, m := range s.queue {
		pos += m.nseg - m.sent
		if m.kind == kindResp {
			s.respEnd = pos
		}
	}
}

// unwait takes m out of the requests waiting for the peer's horizon.
func (s *txStream) unwait(m *outMsg) {
	if !m.waits {
		return
	}
	m.waits = false
	if i := slices.Index(s.waiting, m); i >= 0 {
		s.waiting = slices.Delete(s.waiting, i, i+1)
	}
}

// settle completes the requests waiting for the peer's horizon that have it: the peer's stream
// has arrived up to the horizon its ACK named, and no RESP in it failed them, so they succeeded.
//
// A horizon in an epoch of the peer's stream that the peer has since abandoned (its stream timed
// out) can no longer come; but the peer queued every RESP of its old stream not yet acknowledged
// again at the start of the new one (resetTimeout), so the horizon of any ACK from the new epoch
// lies past every failure it answered: such a request waits for that horizon instead.
func (d *Device) settle(p *peer) {
	s, r := &p.tx, &p.rx
	for i := 0; i < len(s.waiting); {
		m := s.waiting[i]
		switch {
		case m.horizon == 0 || r.started && r.epoch == m.hEpoch && !psnLess(r.cum, m.horizon):
			d.completeReq(m, efaio.StatusOK, false) // takes it out of waiting
		case r.started && int16(m.hEpoch-r.epoch) < 0 && s.hznEpoch == r.epoch:
			m.horizon, m.hEpoch = s.hzn, s.hznEpoch // looked at again with the new horizon
		default:
			i++
		}
	}
}

// dropOut removes m from q's list of requests on the network.
func (q *QP) dropOut(m *outMsg) {
	last := len(q.out) - 1
	q.out[m.qIdx] = q.out[last]
	q.out[m.qIdx].qIdx = m.qIdx
	q.out[last] = nil
	q.out = q.out[:last]
	m.q = nil
}
