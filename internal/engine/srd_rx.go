package engine

import (
	"cmp"
	"maps"
	"math/bits"
	"net/netip"
	"runtime"
	"slices"
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/seal"
	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link"
)

// rxStream is the receiving half of a peer context: which PSNs of the peer's stream have
// arrived, and the multi-segment messages being put together.
type rxStream struct {
	epoch    uint16
	started  bool
	cum      uint32   // every PSN below has arrived
	highest  uint32   // highest PSN seen
	seen     []uint64 // bit psn%rxWindow: psn in [cum, cum+rxWindow) arrived
	ackDue   bool
	ackSince time.Duration // when the ACK became due
	ackPath  uint8
	sinceAck int
	in       map[uint32]*inbound // by the peer's message id
}

func (r *rxStream) init() { r.in = make(map[uint32]*inbound) }

func (r *rxStream) test(psn uint32) bool {
	i := psn % rxWindow
	return r.seen[i/64]&(1<<(i%64)) != 0
}

func (r *rxStream) flip(psn uint32) {
	i := psn % rxWindow
	r.seen[i/64] ^= 1 << (i % 64)
}

func psnLess(a, b uint32) bool { return int32(a-b) < 0 }

// rxLoop is the receive goroutine: it reads batches from the link and handles them under the
// device lock, then sends the ACKs and frames the batch produced.
func (d *Device) rxLoop() {
	defer d.wg.Done()
	rx := d.newRxScratch()
	pkts, q := rx.pkts, rx.q
	poller, _ := d.link.(link.Poller)
	var last time.Time // when the last datagram came
	for {
		var n int
		var err error
		if poller != nil && d.cfg.RxSpin > 0 && time.Since(last) < d.cfg.RxSpin {
			if n, err = poller.TryReceive(pkts); n == 0 && err == nil {
				t := time.Now()
				runtime.Gosched()
				if time.Since(t) > spinYield {
					// Other goroutines were waiting for the processor: spinning takes it from
					// them. Wait in the network poller until the next traffic.
					last = time.Time{}
				}
				continue
			}
		} else {
			n, err = d.link.Receive(pkts)
		}
		if err != nil {
			select {
			case <-d.done:
				return
			default:
			}
			if err == link.ErrClosed {
				return
			}
			continue
		}
		last = time.Now()
		d.mu.Lock()
		d.useTx(q)
		d.inputBatch(rx, n, false)
		d.mu.Unlock()
		d.sendTx(q)
		d.wake() // parked retries and raw doorbells get a look
	}
}

// rxScratch is what a receiver reuses for every batch.
type rxScratch struct {
	pkts   []link.Packet
	opened link.Packet        // a sealed datagram's plain form
	aad    [seal.AADSize]byte // opening's scratch
	q      *txq
}

func (d *Device) newRxScratch() *rxScratch {
	size := max(d.maxDatagram(), d.cfg.MTU+wire.DatagramHeaderSize+wire.FrameHeaderSize+wire.DataHeaderSize) + seal.Overhead
	rx := &rxScratch{pkts: make([]link.Packet, 32), opened: link.Packet{Buf: make([]byte, size)}, q: newTxq(d.maxDatagram(), 64)}
	for i := range rx.pkts {
		rx.pkts[i].Buf = make([]byte, size)
	}
	return rx
}

// inputBatch handles the first n datagrams of rx.pkts and acknowledges what they brought; lazy
// (a busy poll) leaves the acknowledgements owed for up to ackDelay, so that the application's
// answer can carry them (room). Called with d.mu held.
func (d *Device) inputBatch(rx *rxScratch, n int, lazy bool) {
	now := d.now
	for i := range rx.pkts[:n] {
		pk := &rx.pkts[i]
		if d.seal == nil {
			d.input(pk, now, nil)
			continue
		}
		from := pk.Addr.Addr().Unmap().As16()
		plain, salt, ctr, ok := d.seal.Open(rx.opened.Buf[:0], pk.Buf[:pk.N], &rx.aad, &from, &d.gid)
		if !ok {
			d.counts.AuthFailures.Add(1)
			continue
		}
		rx.opened.N, rx.opened.Addr = len(plain), pk.Addr
		rx.opened.Buf = plain[:cap(plain)]
		d.input(&rx.opened, now, &nonce{salt, ctr})
	}
	if lazy {
		d.flushAcks(now, ackDelay)
	} else {
		d.flushAcks(now, 0)
	}
}

// ackDelay is how long a busy poll leaves an acknowledgement owed: long enough for the
// application to answer what it received (the answer's datagram carries the ACK), short next
// to the peer's retransmission timeout (2 ms at least).
const (
	ackDelay   = 50 * time.Microsecond
	talkWindow = 10 * time.Millisecond
)

// flushAcks sends the ACKs owed for at least minAge; younger ones stay owed, but only to a peer
// we sent data to within talkWindow (an answer is likely to carry the ACK: a peer that only
// sends to us, or that we reach by another address, as through a relay, gets it at once).
// Called with d.mu held, by every holder of the lock: whoever comes by first after ackDelay
// sends them, and the engine loop keeps ticking while any are owed (step).
func (d *Device) flushAcks(now, minAge time.Duration) {
	keep := 0
	for _, p := range d.ackList {
		switch r := &p.rx; {
		case !r.ackDue: // sent already, or a second entry for the peer
		case now-r.ackSince >= minAge || p.tx.sentAt == 0 || now-p.tx.sentAt > talkWindow:
			d.sendAck(p)
		default:
			d.ackList[keep] = p
			keep++
		}
	}
	clear(d.ackList[keep:])
	d.ackList = d.ackList[:keep]
	d.acksOwed.Store(keep > 0)
}

// nonce is a sealed datagram's salt and counter, for the replay check.
type nonce struct {
	salt uint32
	ctr  uint64
}

// input handles one datagram from the network. Anything malformed, from a source the named peer
// has not proved its own (admit), addressed to another incarnation of this device, or beyond the
// peer table is dropped and counted.
func (d *Device) input(pk *link.Packet, now time.Duration, n *nonce) {
	d.counts.RxPkts.Add(1)
	d.counts.RxBytes.Add(uint64(pk.N))
	h, frames, err := wire.ParseHeader(pk.Buf[:pk.N])
	if err != nil {
		d.counts.BadPackets.Add(1)
		return
	}
	from := netip.AddrPortFrom(pk.Addr.Addr().Unmap(), pk.Addr.Port())
	gid := GIDFromAddr(netip.AddrPortFrom(from.Addr(), h.SrcPort))
	if gid == d.gid {
		d.counts.BadPackets.Add(1)
		return
	}
	p := d.peers[gid]
	if p == nil || !p.trusts(from.Port(), h.SrcPort) {
		if p = d.admit(p, gid, from, &h, frames, pk.N); p == nil {
			return
		}
	}
	if n != nil && !p.replay.Fresh(n.salt, n.ctr) {
		d.counts.Replays.Add(1)
		return
	}
	if h.DstInc != 0 && h.DstInc != d.inc {
		// Sent to an earlier life of this device: say so, so that the sender starts afresh.
		d.counts.StalePackets.Add(1)
		saved := p.inc
		p.inc = h.SrcInc
		d.commit(wire.AppendReset(d.room(p, p.pathRR, wire.FrameHeaderSize)))
		p.inc = saved
		return
	}
	if p.inc != 0 && h.SrcInc != p.inc {
		d.resetPeer(p, efaio.StatusRemoteAbort, h.SrcInc) // the peer restarted
	}
	p.inc, p.heard, p.seen = h.SrcInc, true, now
	var f wire.Frame
	answered, challenged := false, false
	for len(frames) > 0 {
		if frames, err = wire.NextFrame(frames, &f); err != nil {
			d.counts.BadPackets.Add(1)
			return
		}
		switch f.Type {
		case wire.TypeData:
			answered = true
			d.onData(p, &h, &f.Data, now)
		case wire.TypeAck:
			answered = true
			if h.RxEpoch == p.tx.epoch {
				d.onAck(p, &f.Ack, h.TxEpoch, now)
			}
		case wire.TypeProbe:
			d.commit(wire.AppendProbe(d.room(p, d.controlPath(p), wire.FrameHeaderSize+wire.ProbeSize), f.Nonce, true))
		case wire.TypeProbeAck:
			for i := range p.paths {
				if ps := &p.paths[i]; ps.failed && ps.probeSent && ps.nonce == f.Nonce {
					ps.failed, ps.losses, ps.probeSent = false, 0, false
				}
			}
		case wire.TypeReset, wire.TypeCookie:
			// Handled by the incarnation check and by admit.
		case wire.TypeChallenge:
			challenged = true
			d.onChallenge(p, f.Cookie)
		}
	}
	if answered && !challenged {
		p.echo = false // the peer takes our datagrams without a cookie: it knows our ports
	}
}

// onData takes a DATA frame: UD frames at once; stream frames once each, in any order.
func (d *Device) onData(p *peer, h *wire.Header, f *wire.Data, now time.Duration) {
	if f.Flags&wire.FlagUD != 0 {
		d.onUD(p, f)
		return
	}
	r := &p.rx
	if !r.started || h.TxEpoch != r.epoch {
		if r.started && int16(h.TxEpoch-r.epoch) < 0 {
			d.counts.StalePackets.Add(1) // from a stream the peer has since abandoned
			return
		}
		d.resetRx(p)
		r.started, r.epoch = true, h.TxEpoch
	}
	d.oweAck(p, now)
	r.ackPath = h.Path
	r.sinceAck++
	psn := f.PSN
	switch {
	case psnLess(psn, r.cum):
		return // a duplicate: the ACK tells the sender again
	case psn-r.cum >= rxWindow:
		d.counts.RxDrops.Add(1) // beyond the window: the sender must not have sent it yet
		return
	case r.test(psn):
		return // a duplicate
	}
	r.flip(psn)
	// New data from the peer is progress for our side too: the answers and read data we wait
	// for may be queued behind it in its stream, so the transport timeout must not run.
	p.tx.progress = now
	if psnLess(r.highest, psn) {
		r.highest = psn
	}
	for r.test(r.cum) {
		r.flip(r.cum)
		r.cum++
	}
	switch f.Op {
	case wire.OpSend, wire.OpWrite:
		d.onSegment(p, f)
	case wire.OpReadReq:
		d.onReadReq(p, f)
	case wire.OpReadResp:
		d.onReadResp(p, f, h.TxEpoch)
	case wire.OpResp:
		if o := p.tx.reqs[f.MsgID]; o != nil {
			d.completeReq(o, efaio.Status(f.Status), true)
		}
	case wire.OpAbort:
		if in := p.rx.in[f.MsgID]; in != nil {
			if in.hasWR {
				in.t.completeRecv(&efaio.Completion{ReqID: in.wr.reqID, Status: efaio.StatusRemoteAbort})
			}
			delete(p.rx.in, f.MsgID)
			d.freeIn = append(d.freeIn, in)
		}
	}
	// Only now, with the frame handled, may an ACK cover it: a failed message's RESP must lie
	// below the horizon of the ACK that covers its last segment.
	if r.sinceAck >= ackEvery {
		d.sendAck(p)
	}
	if len(p.tx.waiting) > 0 {
		d.settle(p) // our stream may have reached a horizon
	}
}

// oweAck notes that p is owed an acknowledgement of its stream (flushAcks sends it).
func (d *Device) oweAck(p *peer, now time.Duration) {
	if r := &p.rx; !r.ackDue {
		r.ackDue, r.ackSince = true, now
		d.ackList = append(d.ackList, p)
		d.acksOwed.Store(true)
	}
}

// message builds the responder's view of a request frame.
func (d *Device) message(p *peer, f *wire.Data, op efaio.OpType, typ int) message {
	return message{
		op: op, typ: typ, hasImm: f.Flags&wire.FlagImm != 0, imm: f.Imm, qkey: f.QKey,
		srcGID: p.gid, dstGID: d.gid, srcQPN: f.SrcQPN, dstQPN: f.DstQPN, length: uint64(f.Length),
		raddr: f.RAddr, rkey: f.RKey,
	}
}

// onSegment places a SEND or RDMA write segment; the message is answered when complete.
func (d *Device) onSegment(p *peer, f *wire.Data) {
	op := efaio.OpSend
	if f.Op == wire.OpWrite {
		op = efaio.OpRDMAWrite
	}
	m := d.message(p, f, op, uapi.QPTypeDriver)
	if f.Offset == 0 && len(f.Payload) == int(f.Length) { // the whole message in one frame
		m.src[0], m.nsrc = f.Payload, 1
		d.answer(p, f.MsgID, d.respond(&m))
		return
	}
	in := p.rx.in[f.MsgID]
	if in == nil {
		in = d.newInbound()
		p.rx.in[f.MsgID] = in
		d.accept(&m, in)
	}
	d.place(in, uint64(f.Offset), f.Payload)
	if in.got >= in.m.length {
		delete(p.rx.in, f.MsgID)
		d.answer(p, f.MsgID, d.finish(in))
		d.freeIn = append(d.freeIn, in)
	}
}

// onReadReq answers an RDMA read: the data as READ_RESP segments, or a RESP with the error.
func (d *Device) onReadReq(p *peer, f *wire.Data) {
	m := d.message(p, f, efaio.OpRDMARead, uapi.QPTypeDriver)
	var in inbound
	if st := d.accept(&m, &in); st != efaio.StatusOK {
		d.answer(p, f.MsgID, st)
		return
	}
	src, _ := d.remoteSpan(in.t.pd, m.rkey, m.raddr, m.length, uapi.AccessRemoteRead)
	o := d.newMsg(p, kindReadResp)
	o.hdr = wire.Data{MsgID: f.MsgID, Length: f.Length, Op: wire.OpReadResp, SrcQPN: f.DstQPN, DstQPN: f.SrcQPN}
	o.src[0], o.nsrc, o.length, o.done = src, 1, m.length, true
	d.counts.RDMAReadRespBytes.Add(m.length)
	d.enqueue(p, o)
}

// onReadResp places read data, which came in epoch of the responder's stream, at the
// requester; the read completes with its last byte. Data in a newer epoch than the read's earlier
// data is the whole answer again (the responder's stream timed out and it sent the read data
// anew, docs/wire.md "Completion"): the count starts over.
func (d *Device) onReadResp(p *peer, f *wire.Data, epoch uint16) {
	o := p.tx.reqs[f.MsgID]
	if o == nil || o.hdr.Op != wire.OpReadReq {
		return // answered already, or flushed
	}
	if o.got > 0 && o.hEpoch != epoch {
		o.got = 0
	}
	o.hEpoch = epoch
	end := uint64(f.Offset) + uint64(len(f.Payload))
	if end > uint64(len(o.sink)) || uint64(f.Length) != o.length {
		d.completeReq(o, efaio.StatusRemoteBadStatus, false)
		return
	}
	if o.q != nil { // a flushed read's memory is the application's again
		if !d.copyMem(o.sink[f.Offset:], f.Payload) {
			d.completeReq(o, efaio.StatusLocalInvalidLKey, false)
			return
		}
	}
	o.got += uint64(len(f.Payload))
	if o.got >= o.length {
		d.completeReq(o, efaio.StatusOK, false)
	}
}

// onUD delivers a UD datagram: no stream, no answer.
func (d *Device) onUD(p *peer, f *wire.Data) {
	if f.Op != wire.OpSend || f.Offset != 0 || len(f.Payload) != int(f.Length) {
		d.counts.BadPackets.Add(1)
		return
	}
	m := d.message(p, f, efaio.OpSend, uapi.QPTypeUD)
	m.src[0], m.nsrc = f.Payload, 1
	d.respond(&m)
}

// answer sends a RESP frame with a message's status on p's stream if it failed; success needs no
// frame of its own (the ACKs covering the message say it).
func (d *Device) answer(p *peer, msgID uint32, st efaio.Status) {
	if st == efaio.StatusOK {
		return
	}
	o := d.newMsg(p, kindResp)
	o.hdr = wire.Data{MsgID: msgID, Op: wire.OpResp, Status: uint8(st)}
	o.done = true
	d.enqueue(p, o)
}

func (d *Device) newInbound() *inbound {
	if n := len(d.freeIn); n > 0 {
		in := d.freeIn[n-1]
		d.freeIn = d.freeIn[:n-1]
		return in
	}
	return new(inbound)
}

// resetRx forgets the peer's stream: a message half received took a receive WR, which
// completes with REMOTE_ABORT.
func (d *Device) resetRx(p *peer) {
	r := &p.rx
	if d.txq != nil && d.txq.cur == p {
		d.txq.cur = nil // its header names the stream being forgotten
	}
	// In message-id order (not the map's), so that a replayed run completes them alike.
	for _, id := range slices.Sorted(maps.Keys(r.in)) {
		in := r.in[id]
		if in.hasWR {
			in.t.completeRecv(&efaio.Completion{ReqID: in.wr.reqID, Status: efaio.StatusRemoteAbort})
		}
		delete(r.in, id)
		d.freeIn = append(d.freeIn, in)
	}
	r.cum, r.highest, r.started = 0, 0, false
	if r.seen == nil {
		r.seen = make([]uint64, rxWindow/64)
	}
	clear(r.seen)
}

// sendAck acknowledges p's stream: the cumulative point, the next 256 PSNs bit by bit, the
// highest PSN seen, and the path of the newest frame.
func (d *Device) sendAck(p *peer) {
	a := p.ack()
	p.rx.ackDue, p.rx.sinceAck = false, 0 // before room, which would carry the ACK itself
	var path int
	if q := d.txq; q.cur == p && q.pkts[q.n-1].N+wire.FrameHeaderSize+wire.AckSize <= q.maxLen && d.proven(p, q.path) {
		path = q.path // ride in the datagram going to p already (an answer, data) on a path known to work
	} else {
		path = d.controlPath(p) // (only now: it moves the rotation)
	}
	d.commit(wire.AppendAck(d.room(p, path, wire.FrameHeaderSize+wire.AckSize), &a))
}

// ack is the acknowledgement of p's stream as it stands.
func (p *peer) ack() wire.Ack {
	r := &p.rx
	a := wire.Ack{Cum: r.cum, Highest: r.highest, Path: r.ackPath, Horizon: p.tx.respEnd}
	for i := range wire.SackWords * 64 {
		if psn := r.cum + 1 + uint32(i); !psnLess(r.highest, psn) && r.test(psn) {
			a.Sack[i/64] |= 1 << (i % 64)
		}
	}
	return a
}

// controlPath picks the path for an ACK or PROBE_ACK: the next healthy one each time. Nothing
// acknowledges these frames, so a device that only answers never learns that a path has gone
// dark; rotating keeps most of its answers getting through, and its data frames (which are
// acknowledged) mark the path failed as soon as it sends any.
//
// Better than healthy is proven: when some of our recent data was acknowledged, the rotation keeps
// to the paths that carried it (a packet sent within a few RTTs of the newest acknowledged one).
// A path that swallows everything may never carry data of ours and so never be marked failed;
// without this, every ACK sent on it is lost and the peer waits for its timer. Proof goes stale
// as fast, though: a device that only receives (successes get no RESP) sends no data to refresh
// it, and a proven path that has since died would take every ACK; with no recent proof, every
// healthy path takes its turn.
func (d *Device) controlPath(p *peer) int {
	n := len(p.paths)
	newest, recent := p.provenSince(d.now)
	for _, proven := range [2]bool{true, false} {
		for range n {
			p.ctrlRR = (p.ctrlRR + 1) % n
			ps := &p.paths[p.ctrlRR]
			if !ps.failed && (!proven || newest > 0 && ps.ackedAt >= recent) {
				return p.ctrlRR
			}
		}
	}
	return p.ctrlRR
}

// provenSince returns when p's newest acknowledged packet was sent, and the time from which an
// acknowledged packet proves its path: within a few RTTs of the newest; (0, 0) if even the newest
// is older than that now.
func (p *peer) provenSince(now time.Duration) (newest, recent time.Duration) {
	for i := range p.paths {
		newest = max(newest, p.paths[i].ackedAt)
	}
	window := 4 * max(p.tx.srtt, minRTO)
	if now-newest > window {
		return 0, 0
	}
	return newest, newest - window
}

// proven reports whether path carried recently acknowledged data to p (see controlPath).
func (d *Device) proven(p *peer, path int) bool {
	newest, recent := p.provenSince(d.now)
	ps := &p.paths[path]
	return !ps.failed && newest > 0 && ps.ackedAt >= recent
}

// onAck takes an acknowledgement of our stream: it frees acknowledged packets, samples the RTT,
// counts as lost the packets that later ones overtook, adjusts the window and sends what it
// allows.
func (d *Device) onAck(p *peer, a *wire.Ack, epoch uint16, now time.Duration) {
	s := &p.tx
	switch {
	case psnLess(s.next, a.Cum):
		d.counts.BadPackets.Add(1) // acknowledges what we never sent
		return
	case psnLess(a.Cum, s.una-rxWindow):
		// Older than the window: a datagram held back, by the network or by a receiving
		// goroutine that lost the processor for a while with its batch read (the receive loop
		// and a busy poller read side by side).
		d.counts.StalePackets.Add(1)
		return
	}
	s.newly, s.rtt, s.hzn, s.hznEpoch = 0, -1, a.Horizon, epoch
	ack := func(psn uint32) { d.ackSlot(p, s.slot(psn), now) }
	for psn := s.una; psnLess(psn, a.Cum); psn++ {
		ack(psn)
	}
	for w, word := range a.Sack {
		for word != 0 {
			i := bits.TrailingZeros64(word)
			word &^= 1 << i
			psn := a.Cum + 1 + uint32(w*64+i)
			if psnLess(psn, s.next) && !psnLess(psn, s.una) {
				ack(psn)
			}
		}
	}
	for s.una != s.next && s.slot(s.una).acked {
		*s.slot(s.una) = sentPkt{}
		s.una++
	}
	if s.newly > 0 {
		s.progress = now
	}
	if s.rtt >= 0 {
		d.sampleRTT(s, s.rtt)
	} else if s.newly > 0 {
		// Only retransmitted packets acknowledged (no RTT sample, Karn's rule), but acknowledged:
		// the backoff has done its job. Left doubled, it would pace every loss that follows at
		// up to maxRTO while the window is too small for acknowledgements to reveal losses.
		s.resetRTO()
	}
	// A packet is lost when one sent after it on the same path has been acknowledged (each path
	// is taken to keep its own order, with a reordering allowance of an eighth of the RTT), or
	// when one sent no earlier on any path has and the packet has waited two of its own path's
	// RTTs (paths differ in delay, but one that far behind has dropped it: this is what finds a
	// dead path within a few RTTs).
	lost := 0
	reo := s.reorderWindow()
	var anyAcked time.Duration
	for i := range p.paths {
		anyAcked = max(anyAcked, p.paths[i].ackedAt)
	}
	for psn := s.una; psnLess(psn, s.next); psn++ {
		e := s.slot(psn)
		if e.acked || e.lost || e.msg == nil {
			continue
		}
		ps := &p.paths[e.path]
		if e.at+reo >= ps.ackedAt && (anyAcked < e.at || now-e.at <= 2*cmp.Or(ps.srtt, s.srtt)+reo) {
			continue
		}
		e.lost = true
		s.inflight--
		s.retx = append(s.retx, psn)
		s.countFate(true)
		lost++
		d.pathLoss(p, int(e.path), now)
	}
	if lost > 0 {
		s.lossAt = now
	}
	if len(s.waiting) > 0 {
		d.settle(p)
	}
	d.congestion(s, s.newly, lost)
	d.pump(p)
}

// ackSlot records the acknowledgement of one stream slot: the packet leaves the flight, credits
// its path, gives an RTT sample unless it was sent twice, and lets go of its message.
func (d *Device) ackSlot(p *peer, e *sentPkt, now time.Duration) {
	s := &p.tx
	if e.acked || e.msg == nil {
		return
	}
	e.acked = true
	if !e.lost {
		s.inflight--
	}
	spurious := e.lost || e.retx > 0 && now-e.at < s.minRTT/2
	if spurious {
		// Counted lost, but the packet (not a copy sent again) arrived: the loss was reordering.
		s.reoSteps = min(s.reoSteps+1, 64)
		s.reoClean = 0
		d.counts.SpuriousRetrans.Add(1)
		s.lossRate = max(s.lossRate-1.0/lossGain, 0) // take the loss back
		// Nor was it the path's fault: take back the count, and the failure if it was the last.
		if ps := &p.paths[e.path]; ps.losses > 0 {
			ps.losses--
			if ps.failed && ps.losses < pathFailLoss {
				ps.failed = false
			}
		}
	} else if e.suspect != 0 && e.suspect-1 != e.path {
		d.pathLoss(p, int(e.suspect-1), now) // it timed out on that path and came through on this one
	}
	s.newly++
	switch {
	case spurious:
	case e.copied:
		// Either copy may be the one that came: the arrival says little about loss. Counted
		// in full, the copies would hide the losses that turned them on and turn themselves off
		// within a few hundred packets; not counted, they would never turn off. A quarter.
		s.lossRate -= s.lossRate / (4 * lossGain)
	default:
		s.countFate(false)
	}
	if e.retx == 0 {
		s.rtt = now - e.at // a copy left with the packet: its arrival times the round trip as well
	}
	if !e.copied { // either copy of a copied packet may be the one that arrived: credit no path
		creditPath(&p.paths[e.path], e, now)
	}
	m := e.msg
	e.msg = nil
	m.pending--
	if m.pending == 0 && m.sent == m.nseg && m.kind == kindRequest && m.q != nil && !m.answered && !m.faulted &&
		(m.hdr.Op == wire.OpSend || m.hdr.Op == wire.OpWrite) {
		// Every segment is in: it succeeded unless a RESP below the peer's horizon says not.
		m.waits, m.horizon, m.hEpoch = true, s.hzn, s.hznEpoch
		s.waiting = append(s.waiting, m)
	}
	d.release(m)
}

// creditPath records on the path that carried e that it was acknowledged: the path is healthy
// again, and (if e went once) an RTT sample and the send time of its latest acknowledged packet.
func creditPath(ps *pathState, e *sentPkt, now time.Duration) {
	if !ps.failed || e.at >= ps.failedAt { // an acknowledgement of a packet from before the failure proves nothing
		ps.losses, ps.failed = 0, false
	}
	if e.retx != 0 {
		return
	}
	if rtt := now - e.at; ps.srtt == 0 {
		ps.srtt = rtt
	} else {
		ps.srtt = (7*ps.srtt + rtt) / 8
	}
	ps.ackedAt = max(ps.ackedAt, e.at)
}

func (d *Device) sampleRTT(s *txStream, rtt time.Duration) {
	if s.srtt == 0 {
		s.srtt, s.rttvar, s.minRTT = rtt, rtt/2, rtt
	} else {
		dev := s.srtt - rtt
		if dev < 0 {
			dev = -dev
		}
		s.rttvar = (3*s.rttvar + dev) / 4
		s.srtt = (7*s.srtt + rtt) / 8
		s.minRTT = min(s.minRTT, rtt)
	}
	s.rto = min(max(s.srtt+4*s.rttvar, minRTO), maxRTO)
}

// congestion is the window rule (docs/congestion.md): additive increase per acknowledged packet
// (one per packet in slow start), halving once per round trip with losses.
func (d *Device) congestion(s *txStream, newly, lost int) {
	if s.recovering && !psnLess(s.una, s.recoverPSN) {
		s.recovering = false
	}
	if lost > 0 && !s.recovering {
		if s.reoClean++; s.reoClean >= 16 {
			s.reoSteps, s.reoClean = 1, 0
		}
		s.ssthresh = max(s.cwnd/2, 2)
		s.cwnd = s.ssthresh
		s.recovering, s.recoverPSN = true, s.next
		return
	}
	for range newly {
		if s.cwnd < s.ssthresh {
			s.cwnd++
		} else {
			s.cwnd += 1 / s.cwnd
		}
	}
	s.cwnd = min(s.cwnd, maxCwnd)
}

// pathLoss counts a loss against one of our paths; consecutive losses mark it failed (as long as
// another path is left), and it is probed until it answers again. Only losses that later
// acknowledgements reveal count: they show the packet, not an acknowledgement, went missing.
func (d *Device) pathLoss(p *peer, i int, now time.Duration) {
	ps := &p.paths[i]
	ps.losses++
	ps.lost++
	if ps.failed || ps.losses < pathFailLoss {
		return
	}
	healthy := 0
	for j := range p.paths {
		if j != i && !p.paths[j].failed {
			healthy++
		}
	}
	if healthy > 0 {
		ps.failed, ps.failedAt, ps.probeAt, ps.probeSent = true, now, now+probeInterval, false
		d.counts.ImpairedRemoteConnEvents.Add(1)
	}
}

// transportTick runs on the engine loop's timer: path probes, transport timeouts and
// retransmission timeouts. It reports whether any stream has something outstanding.
func (d *Device) transportTick(now time.Duration) bool {
	d.expirePeers(now)
	busy := false
	for _, p := range d.peerList {
		for i := range p.paths {
			if ps := &p.paths[i]; ps.failed && now >= ps.probeAt {
				ps.nonce, ps.probeSent, ps.probeAt = uint32(now)^uint32(i)<<24|1, true, now+probeInterval
				d.commit(wire.AppendProbe(d.room(p, i, wire.FrameHeaderSize+wire.ProbeSize), ps.nonce, false))
			}
		}
		s := &p.tx
		if !s.busy() {
			s.progress = now
			continue
		}
		if now-s.progress > d.cfg.TransportTimeout {
			st := efaio.StatusLocalUnreachRemote
			if p.heard {
				st = efaio.StatusLocalUnrespRemote
				d.counts.UnresponsiveRemoteEvents.Add(1)
			}
			d.resetTx(p, st, resetTimeout)
			busy = busy || s.busy() // answers queued again in the new stream
			continue
		}
		busy = true
		d.checkRTO(p, now)
		d.pump(p)
	}
	return busy
}

// checkRTO counts as lost every packet that has waited longer than the retransmission timeout:
// the fallback for losses no later acknowledgement reveals (the last packets of a burst).
func (d *Device) checkRTO(p *peer, now time.Duration) {
	s := &p.tx
	fired := false
	for psn := s.una; psn != s.next; psn++ {
		e := s.slot(psn)
		if e.acked || e.lost || e.msg == nil || now-e.at < s.rto {
			continue
		}
		// Not held against the packet's path yet: the timeout may as well be a lost
		// acknowledgement (they travel on the peer's paths), a peer gone, or a scheduler's
		// delay. If the packet then arrives by another path, ackSlot blames this one. Without
		// that, a path that swallows whole bursts is never marked failed (no later packet on it
		// is acknowledged to reveal the losses), and every timeout goes back to it in turn.
		e.suspect = e.path + 1
		e.lost = true
		s.inflight--
		s.retx = append(s.retx, psn)
		s.countFate(true)
		fired = true
	}
	if fired {
		s.lossAt = now
		d.counts.RetransTimeoutEvents.Add(1)
		s.rto = min(2*s.rto, maxRTO)
		s.ssthresh = max(s.cwnd/2, 2)
		s.cwnd = s.ssthresh
		s.recovering, s.recoverPSN = true, s.next
	}
}
