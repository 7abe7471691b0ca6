package srd

import (
	"cmp"
	"slices"
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/wire"
)

// Kinds of outgoing message.
const (
	kindRequest  = iota // a SEND, RDMA write or read request from one of our QPs
	kindResp            // our answer to a peer's request
	kindReadResp        // read data answering a peer's READ_REQ
)

// Msg is a message in a peer's outgoing stream. Requests are also in txStream.reqs until
// answered, and held by their owner until it is told the outcome. A Msg returns to the free
// list once it is answered (or needs no answer) and none of its segments is unacknowledged.
type Msg struct {
	kind    int
	p       *peer
	hdr     wire.Data // fields of every frame of the message; PSN, Offset and Payload per segment
	src     [efaio.TxNumBufs]mem.Span
	nsrc    int
	region  any // read data: the region src lies in (Host.Live)
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
	owner    any      // whose outcome it is (Host.Done); nil once told, or cancelled
	sink     mem.Span // RDMA read: where the data goes
	got      uint64   // RDMA read: bytes arrived
	answered bool     // the peer answered: it has every segment
	faulted  bool     // the application's memory faulted under a segment: the rest go as ABORTs
	// A SEND or WRITE whose every segment is acknowledged waits in txStream.waiting until the
	// peer's stream reaches horizon (in the peer's epoch hEpoch): then no RESP says it failed.
	// A READ's data is counted in got for the peer's epoch hEpoch.
	waits   bool
	hasHzn  bool // false: the covering ACK named no horizon (no RESP in the peer's epoch)
	horizon wire.PSN
	hEpoch  wire.Epoch
}

// sentPkt is a PSN's slot in the stream: which segment of which message it carries.
type sentPkt struct {
	msg *Msg
	seg uint32
	// gap is, for a packet counted lost because one sent once after it on its path was
	// acknowledged (pathState.onceAt), how much later that one was sent, in nanoseconds
	// (saturated): the reordering it shows if the packet arrives after all (sawReorder). 0 for
	// a loss found otherwise.
	gap   uint32
	at    time.Duration
	path  uint8
	retx  uint8
	acked bool
	lost  bool
	// suspect is 1 + the path of a transmission that timed out with nothing to blame it on yet:
	// if the packet then arrives by another path, that path swallowed it.
	suspect uint8
	copied  bool // sent on a second path too (copySeg)
	counted bool // counted lost in a loss episode (undoSpurious)
}

// txStream is the sending half of a peer context.
type txStream struct {
	next, una  wire.PSN  // PSNs [una, next) are in ring (of the stream's epoch, at the end)
	ring       []sentPkt // indexed by psn & (len-1)
	inflight   int       // sent, not acknowledged, not counted lost
	cwnd       float64
	ssthresh   float64
	recovering bool
	recoverPSN wire.PSN
	srtt       time.Duration
	rttvar     time.Duration
	minRTT     time.Duration
	rto        time.Duration
	rtoAt      time.Duration // when the retransmission timer last fired (checkRTO); 0 after progress
	rtoLine    time.Duration // the packets sent up to then had waited the timeout when it fired
	progress   time.Duration // last time the peer acknowledged something, or the stream was idle
	queue      []*Msg        // messages with segments not yet sent, in order
	answers    int           // those of them that answer the peer (Msg.answer; onData's backlog)
	retx       []wire.PSN    // PSNs counted lost, to send again
	reqs       *reqTable     // requests sent and not yet answered or failed (nil while slim)
	waiting    []*Msg        // requests acknowledged whole, waiting for the peer's horizon (settle)
	unsent     uint32        // segments in queue not yet sent once: next+unsent is where the stream ends
	respEnd    wire.PSN      // the PSN after our latest RESP, queued or sent: our ACKs' horizon
	resp       bool          // a RESP has been queued in this epoch: respEnd means something (it may be 0)
	nextMsg    uint32
	reoSteps   int           // the reordering allowance, in steps of a quarter of minRTT (reorderWindow)
	reoClean   int           // loss episodes since the last loss that proved spurious
	reoSeen    time.Duration // the widest reordering within a path acknowledgements showed (sawReorder)
	lossAt     time.Duration // when a packet was last counted lost (by acknowledgements or the timer)
	lossRate   float64       // moving average of packets' fates, 1 lost, 0 acknowledged (lossGain)
	sentAt     time.Duration // when a DATA frame last went to the peer (flushAcks)
	burst      int           // datagrams of DATA started on the current path since it was picked

	// The window before the latest cut, kept while every packet counted lost since could still
	// prove spurious (undoLeft of them not yet acknowledged as originals): then the cut is
	// undone (congestion.go).
	undoCwnd, undoSsthresh float64
	undoRTO                time.Duration
	undoLeft               int
	undo                   bool
	hzn                    wire.PSN   // the horizon of the newest ACK (wire.Ack.Horizon)
	hasHzn                 bool       // whether it named one (wire.Ack.HasHorizon)
	hznEpoch               wire.Epoch // and the epoch of the peer's stream it is in
	// The stream's epoch; last, beside the other small fields: first, its padding made every peer
	// context 8 bytes longer (over 632 bytes, the allocator's header puts a pointerful object in
	// the next size class, 704: TestOneQPManyPeers).
	epoch wire.Epoch
	// The timer's PINGs sent since it last fired with nothing acknowledged (rtoAt 0), and whether
	// one of them was answered (checkRTO).
	pings  uint8
	ponged bool
}

// answer reports whether m answers the peer (read data, a RESP) rather than being ours.
func (m *Msg) answer() bool { return m.kind == kindResp || m.kind == kindReadResp }

// dequeued notes that the queue has let go of m (every segment sent).
func (s *txStream) dequeued(m *Msg) {
	m.inQueue = false
	if m.answer() {
		s.answers--
	}
}

// queued counts m's segments into the stream; a RESP moves the horizon our ACKs carry
// (wire.Ack.Horizon) past it, so that every failure we have answered lies below the horizon.
func (s *txStream) queued(m *Msg) {
	m.inQueue = true
	s.unsent += m.nseg
	if m.answer() {
		s.answers++
	}
	if m.kind == kindResp {
		s.respEnd, s.resp = s.next.Add(s.unsent), true
	}
}

// horizon is the horizon our ACKs carry (wire.Ack.Horizon): the PSN after our latest RESP
// while the peer has not acknowledged it, and once it has, the point below which the peer has
// acknowledged everything (una), which lies past every RESP and which the peer has reached. The
// PSN after a RESP long acknowledged would go stale: 2^31 PSNs later it reads as ahead of the
// peer's cumulative point, and the peer's SENDs and WRITEs would wait for it forever (docs/wire.md,
// "Completion"). ok is false while no RESP has been queued in this epoch. Either PSN may be 0 (the
// PSN space ended at a RESP): ok, not the value, says there is a horizon.
func (s *txStream) horizon() (h wire.PSN, ok bool) {
	switch {
	case !s.resp:
		return 0, false
	case s.una.Dist(s.respEnd) <= s.una.Dist(s.next.Add(s.unsent)):
		return s.respEnd, true // not yet acknowledged: in [una, end of the stream]
	}
	return s.una, true
}

// init sets a new stream's estimates; its ring and request table come with its first message
// (txReady).
func (s *txStream) init() {
	s.cwnd, s.ssthresh, s.rto = initialCwnd, maxCwnd, initialRTO
	s.reoSteps = 1
}

func (s *txStream) slot(psn wire.PSN) *sentPkt { return &s.ring[uint32(psn)&uint32(len(s.ring)-1)] }

// busy reports whether the stream has anything outstanding.
func (s *txStream) busy() bool { return s.una != s.next || len(s.queue) > 0 || s.reqs.len() > 0 }

// grow doubles the ring, keeping [una, next) in place by PSN.
func (s *txStream) grow() {
	old := s.ring
	s.ring = make([]sentPkt, 2*len(old))
	for psn := s.una; psn != s.next; psn++ {
		*s.slot(psn) = old[uint32(psn)&uint32(len(old)-1)]
	}
}

// newMsg takes an Msg from the free list.
func (t *Transport) newMsg(p *peer, kind int) *Msg {
	var m *Msg
	if n := len(t.freeMsgs); n > 0 {
		m = t.freeMsgs[n-1]
		t.freeMsgs = t.freeMsgs[:n-1]
		*m = Msg{}
	} else {
		m = new(Msg)
	}
	m.p, m.kind = p, kind
	return m
}

// release returns m to the free list when nothing refers to it any more; once (m.p is nil from
// then until newMsg hands it out again): a transport timeout releases a message for each of its
// packets' slots.
func (t *Transport) release(m *Msg) {
	if m.p != nil && m.done && m.pending == 0 && m.sent == m.nseg && m.owner == nil && !m.inQueue {
		m.p = nil
		t.freeMsgs = append(t.freeMsgs, m)
	}
}

// enqueue adds m to p's stream: its segments go out as the window allows.
func (t *Transport) enqueue(p *peer, m *Msg) {
	t.queue(p, m)
	t.pump(p)
}

// queue adds m to p's stream without sending anything yet.
func (t *Transport) queue(p *peer, m *Msg) {
	seg := uint64(t.segSize())
	m.nseg = uint32(max((m.length+seg-1)/seg, 1))
	if m.hdr.Op == wire.OpReadReq || m.hdr.Op == wire.OpResp {
		m.nseg = 1
	}
	t.txReady(p)
	if !p.tx.busy() {
		// The stream starts waiting now: the transport timeout counts from here, not from
		// whenever it last moved (an idle stream's progress is as old as its last traffic).
		p.tx.progress = t.now
		p.seen = p.tx.progress
	}
	if m.kind == kindRequest {
		p.tx.reqs.put(m) // after the idle check: an outstanding request makes the stream busy
	}
	t.busy = true // the device's timer runs until the stream is idle again (Tick)
	p.tx.queue = append(p.tx.queue, m)
	p.tx.queued(m)
}

// sendRemote starts request r to dst on behalf of owner: it goes on the peer's stream.
func (t *Transport) sendRemote(dst [16]byte, r *Request, owner any) (*Msg, efaio.Status) {
	p := t.peerFor(dst)
	if p == nil {
		return nil, efaio.StatusLocalUnreachRemote
	}
	o := t.newMsg(p, kindRequest)
	o.owner = owner
	o.length, o.src, o.nsrc, o.sink = r.Length, r.Src, r.NSrc, r.Sink
	o.hdr = wire.Data{
		MsgID: p.tx.nextMsg, Length: uint32(r.Length), Op: r.Op, SrcQPN: r.SrcQPN, DstQPN: r.DstQPN,
		QKey: r.QKey, Imm: r.Imm, RKey: r.RKey, RAddr: r.RAddr,
	}
	if r.HasImm {
		o.hdr.Flags |= wire.FlagImm
	}
	p.tx.nextMsg++
	t.queue(p, o)
	t.pumpLater(p)
	return o, efaio.StatusOK
}

// pumpLater has p's stream pumped at the end of the caller's batch (pumpDue: from Hold, and from
// inputBatch for a batch of received datagrams) instead of now: a doorbell's list of requests is
// framed by one pump, with one reading of the clock, rather than one pump a request; and what a
// received datagram's frames set going (answers, what an ACK after DATA frames lets out, a
// stream that waited for a challenge) is framed after all its frames, so that an ACK riding with
// it covers the datagram whole.
func (t *Transport) pumpLater(p *peer) {
	if !p.due {
		p.due = true
		t.due = append(t.due, p)
	}
}

// pumpDue pumps the streams noted since the last call (pumpLater); a peer forgotten since is
// skipped.
func (t *Transport) pumpDue() {
	for i := 0; i < len(t.due); i++ { // (len afresh: a stream noted during a pump is pumped too)
		p := t.due[i]
		t.due[i] = nil
		p.due = false
		if t.peers[p.gid] == p {
			t.pump(p)
		}
	}
	t.due = t.due[:0]
}

// sendUD sends a UD message as one unacknowledged datagram.
func (t *Transport) sendUD(dst [16]byte, r *Request) efaio.Status {
	p := t.peerFor(dst)
	if p == nil {
		return efaio.StatusLocalUnreachRemote
	}
	hdr := wire.Data{Length: uint32(r.Length), Op: wire.OpSend, Flags: wire.FlagUD, SrcQPN: r.SrcQPN,
		DstQPN: r.DstQPN, QKey: r.QKey, Imm: r.Imm}
	if r.HasImm {
		hdr.Flags |= wire.FlagImm
	}
	size := wire.FrameHeaderSize + wire.DataHeaderSize + int(r.Length)
	started := t.txq.started
	b := t.roomLarge(p, t.pickPath(p, -1), size)
	t.countBurst(p, started)
	b = wire.AppendDataHeader(b, &hdr, int(r.Length))
	b, ok := t.host.Gather(b, r.Src[:r.NSrc], 0, int(r.Length))
	if !ok {
		return efaio.StatusLocalInvalidLKey // (the datagram is not committed: nothing goes)
	}
	t.commit(b)
	return efaio.StatusOK
}

// pump sends what p's window allows: retransmissions first, then new segments. Both count
// against the congestion window.
func (t *Transport) pump(p *peer) {
	t.revalidate(p)
	s := &p.tx
	now := t.sendTime()
	if len(s.retx) > 1 {
		// Oldest first: the lowest hole holds the receiver's cumulative point, and the ACK's
		// selective bits reach only 256 PSNs past it. Last in line behind a long list, at a
		// small window and a backed-off timer, it could wait past the transport timeout.
		una := s.una
		byAge := func(a, b wire.PSN) int { return cmp.Compare(una.Dist(a), una.Dist(b)) }
		if !slices.IsSortedFunc(s.retx, byAge) {
			slices.SortFunc(s.retx, byAge)
		}
	}
	began := t.txq.started
	taken := 0
	for taken < len(s.retx) && float64(s.inflight) < max(s.cwnd, 1) {
		psn := s.retx[taken]
		taken++
		if psn.Less(s.una) || !psn.Less(s.next) {
			continue
		}
		e := s.slot(psn)
		if e.acked || !e.lost || e.msg == nil {
			continue
		}
		t.sendAgain(p, psn, e, now)
		now, began = t.restamp(p, e, now, began)
	}
	s.retx = s.retx[:copy(s.retx, s.retx[taken:])]
	// A peer never heard from has no context for us yet: it would challenge our first packet
	// and drop it (docs/wire.md, "Address validation"). The stream waits for the answer to a
	// PROBE instead (hello, below), and goes with the challenge's cookie: nothing twice.
	window := s.cwnd
	if !p.heard {
		window = 0
	}
	done := 0
	for done < len(s.queue) {
		m := s.queue[done]
		if m.sent == m.nseg {
			done++ // cut short by cancel: it may go to the free list now that the queue lets go
			s.dequeued(m)
			t.release(m)
			continue
		}
		if float64(s.inflight) >= window {
			break
		}
		if s.una.Dist(s.next) >= uint32(len(s.ring)) {
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
		t.sendSeg(p, psn, e, now, -1)
		now, began = t.restamp(p, e, now, began)
		if s.inflight <= sparseFlight && s.losing(now) && !t.cfg.NoSparseCopies {
			t.copySeg(p, psn, e)
		}
		if m.sent == m.nseg {
			done++
			s.dequeued(m)
		}
	}
	n := copy(s.queue, s.queue[done:])
	clear(s.queue[n:]) // let go of the messages moved past
	s.queue = s.queue[:n]
	if !p.heard && n > 0 {
		t.hello(p, now)
	}
}

// restamp reads the clock again when the queue's count of datagrams begun has moved past began
// since the last reading (the frame just written into slot e began a datagram, or a sparse copy
// before it did), and stamps e with the reading: the packets of one datagram share a stamp, and
// the datagrams of a pump do not (a pump's first frame may join a datagram an earlier pump of
// the batch began, under that pump's reading). The loss rules take a packet's stamp for its
// send time (docs/congestion.md): with one reading for a whole pump, the tail of a long one (a
// 1 MiB WRITE, a list of 64 8 KiB SENDs, several lists of small SENDs framed in one step) looked
// older than it was by the time framing took, and the time rule counted it lost while it was
// still going out. A list of small SENDs in one datagram is framed with two readings (the
// pump's, and its datagram's), not one a request.
func (t *Transport) restamp(p *peer, e *sentPkt, now time.Duration, began uint64) (time.Duration, uint64) {
	if t.txq.started == began {
		return now, began
	}
	now = t.sendTime()
	e.at = now
	p.tx.sentAt = now
	return now, t.txq.started
}

// hello asks a peer never heard from for its challenge: a PROBE on the endpoint's path, sent
// again after the retransmission timeout, backed off each time as the first round trip's timeouts
// are (checkRTO), on the next path each time (the endpoint's may be dark; the peer challenges the
// port of a path's PROBE, and the cookie comes back in a PROBE on that path), until the peer
// answers or the transport timeout ends the stream (docs/wire.md, "Address validation"). The
// timer is the endpoint's path's probe time: that path is probed for nothing else before the
// peer is heard from; pathRR, the path of the next data burst, names the path of the last PROBE.
func (t *Transport) hello(p *peer, now time.Duration) {
	ps, s := &p.paths[0], &p.tx
	if !ps.probeSent {
		p.pathRR = 0
	} else {
		if now < ps.probeAt {
			return
		}
		s.rto = min(2*s.rto, maxRTO)
		p.pathRR = (p.pathRR + 1) % len(p.paths)
	}
	t.probe(p, p.pathRR, now)
	ps.probeSent, ps.probeAt = true, now+s.rto
}

// answeredReq reports whether m is a request the peer's answer showed it had whole.
func (m *Msg) answeredReq() bool {
	return m.kind == kindRequest && m.done && m.owner == nil && m.answered
}

// sendAgain sends slot e, counted lost, again (on another path than its last, if one is usable).
func (t *Transport) sendAgain(p *peer, psn wire.PSN, e *sentPkt, now time.Duration) {
	if e.msg.answeredReq() {
		t.ackAnswered(p, e, now) // the answer proved the peer has every segment: nothing to send again
		return
	}
	e.lost = false
	e.retx++
	t.sendSeg(p, psn, e, now, int(e.path))
}

// countBurst counts towards p's burst on its path (pickPath) the datagram that a DATA frame just
// written began, if it began one: the queue had begun started datagrams before the write.
func (t *Transport) countBurst(p *peer, started uint64) {
	if t.txq.started != started {
		p.tx.burst++
	}
}

// sendSeg writes the DATA frame for slot e (PSN psn) on a path other than avoid when it can.
func (t *Transport) sendSeg(p *peer, psn wire.PSN, e *sentPkt, now time.Duration, avoid int) {
	path := t.pickPath(p, avoid)
	started := t.txq.started
	n := t.writeSeg(p, psn, e, path, ackIfOwed)
	t.countBurst(p, started)
	e.at, e.path = now, uint8(path)
	p.tx.sentAt = now
	p.tx.inflight++
	p.paths[path].sent++
	if e.retx > 0 {
		t.counts.RetransPkts.Add(1)
		t.counts.RetransBytes.Add(uint64(n))
	}
}

// copySeg sends slot e's frame once more, on the next healthy path after its own: while few
// packets are in flight, a lost one has no later packets to reveal its loss and waits for the
// retransmission timer (2 ms at least), the whole of a latency-bound exchange's tail under loss;
// a copy on another path makes that a loss of both. The copy is not in the flight count, and an
// acknowledgement of either credits no path (which of the two arrived is unknown).
func (t *Transport) copySeg(p *peer, psn wire.PSN, e *sentPkt) {
	n := len(p.paths)
	for i := 1; i < n; i++ {
		path := (int(e.path) + i) % n
		if p.paths[path].usable() {
			t.writeSeg(p, psn, e, path, ackIfCopy)
			p.paths[path].sent++
			e.copied = true
			t.counts.SparseCopies.Add(1)
			return
		}
	}
}

// writeSeg appends slot e's DATA frame (PSN psn) to a datagram on path and returns how many
// payload bytes it carries.
func (t *Transport) writeSeg(p *peer, psn wire.PSN, e *sentPkt, path, ride int) int {
	m := e.msg
	seg := uint64(t.segSize())
	off := uint64(e.seg) * seg
	n := 0
	if m.hdr.Op != wire.OpReadReq && m.hdr.Op != wire.OpResp {
		n = int(min(seg, m.length-min(off, m.length)))
	}
	hdr := m.hdr
	hdr.PSN, hdr.Offset = psn, uint32(off)
	if m.kind == kindRequest && m.owner == nil && !m.answered {
		// Cancelled (its QP was flushed): the application may reuse the buffer, so the segment goes again
		// without it, as an ABORT that lets the responder drop what it has of the message.
		hdr.Op, n = wire.OpAbort, 0
	}
	if m.faulted {
		hdr.Op, n = wire.OpAbort, 0
	}
	if m.withAck {
		ride = ackAlways
	}
	b := t.roomFor(p, path, wire.FrameHeaderSize+wire.DataHeaderSize+n, ride)
	start := len(b)
	b = wire.AppendDataHeader(b, &hdr, n)
	b, ok := t.host.Gather(b, m.src[:m.nsrc], off, n)
	if ok && n > 0 && m.region != nil && !t.host.Live(m.region) {
		ok = false // deregistered since Read: the bytes read may be the application's new ones
	}
	if !ok {
		// The application's memory faulted under the segment: it goes as an ABORT (the peer
		// drops what it has of the message), and so does the rest of the message.
		m.faulted = true
		hdr.Op, n = wire.OpAbort, 0
		b = wire.AppendDataHeader(b[:start], &hdr, 0)
		t.commit(b)
		t.onFault(p, m)
		return 0
	}
	t.commit(b)
	return n
}

// onFault ends a message whose memory faulted while a segment was built: a request fails with
// LOCAL_ERROR_INVALID_LKEY; read data we were sending is answered with REMOTE_ERROR_BAD_ADDRESS,
// which fails the peer's read. (Queued, not pumped: this runs inside pump.)
func (t *Transport) onFault(p *peer, m *Msg) {
	switch m.kind {
	case kindRequest:
		if m.owner != nil {
			t.completeReq(m, efaio.StatusLocalInvalidLKey, false)
		}
	case kindReadResp:
		o := t.newMsg(p, kindResp)
		o.hdr = wire.Data{MsgID: m.hdr.MsgID, Op: wire.OpResp, Status: uint8(efaio.StatusRemoteBadAddress)}
		o.done, o.nseg = true, 1
		p.tx.queue = append(p.tx.queue, o)
		p.tx.queued(o)
	}
}
