package srd

import (
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/seal"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link"
)

// rxStream is the receiving half of a peer context: which PSNs of the peer's stream have
// arrived, and the multi-segment messages being put together.
type rxStream struct {
	epoch    wire.Epoch
	started  bool
	cum      wire.PSN // every PSN below has arrived
	highest  wire.PSN // highest PSN seen (cum-1 while none beyond cum has)
	seen     window   // which PSNs in [cum, cum+rxWindow) arrived
	ackDue   bool
	ackSince time.Duration      // when the ACK became due
	ackPath  uint8              // the path of the latest DATA frame with a PSN not seen before
	sinceAck int                // datagrams with DATA of the stream since the last ACK
	in       map[uint32]Inbound // messages arriving in segments, by the peer's message id
	// aborted holds the messages whose ABORT came before some earlier PSN of the stream, by
	// message id, with the latest such ABORT's PSN: a segment of one that arrives after its ABORT
	// (by another path) must not start it anew. A message may have several ABORTs (a lost segment
	// of a cancelled message goes again as one); it is forgotten once the cumulative point passes
	// the latest, which abortQ, every ABORT kept earliest first, finds without a walk of the map
	// for every frame.
	aborted map[uint32]wire.PSN
	abortQ  abortHeap
}

// abortMark is an ABORT that came before some earlier PSN of the stream.
type abortMark struct {
	psn   wire.PSN
	msgID uint32
}

// abortHeap is a min-heap of marks by PSN. Every mark lies in [cum, cum+rxWindow) of its stream,
// where PSNs are ordered (wire.PSN.Less).
type abortHeap []abortMark

func (h *abortHeap) push(m abortMark) {
	q := append(*h, m)
	for i := len(q) - 1; i > 0; {
		up := (i - 1) / 2
		if !q[i].psn.Less(q[up].psn) {
			break
		}
		q[i], q[up] = q[up], q[i]
		i = up
	}
	*h = q
}

func (h *abortHeap) pop() abortMark {
	q := *h
	top, last := q[0], len(q)-1
	q[0] = q[last]
	q = q[:last]
	for i := 0; ; {
		least, l, r := i, 2*i+1, 2*i+2
		if l < len(q) && q[l].psn.Less(q[least].psn) {
			least = l
		}
		if r < len(q) && q[r].psn.Less(q[least].psn) {
			least = r
		}
		if least == i {
			break
		}
		q[i], q[least] = q[least], q[i]
		i = least
	}
	*h = q
	return top
}

// maxInbound bounds the messages one peer may have arriving in segments at once. A sender has at
// most maxCwnd packets in flight, and a message in part has one of them still to come, so no honest
// peer comes near it; a hostile one that starts messages and never finishes them is refused
// past it (each held message keeps a receive WR or an RDMA write's state).
const maxInbound = maxCwnd + 64

// maxHeld bounds the messages all peers together may have arriving in segments (each held costs
// the host about a kilobyte): past it, as past maxInbound, a segment that would start one more
// is refused, so that many hostile peers cannot hold gigabytes between them.
const maxHeld = 16 * maxInbound

// maxBacklog bounds the answers (read data, RESPs) our stream to one peer holds not yet sent
// before the peer's requests wait (onData): each READ_REQ queues its read data, and a SEND or
// WRITE that fails its RESP. An honest peer's requests are only delayed; the answers take at most
// about 4 MB.
const maxBacklog = 4 * maxCwnd

// Inbox is what a goroutine receiving for the device reuses for every batch: Pkts to receive
// datagrams into, and Out, the queue for what handling them produces.
type Inbox struct {
	Pkts   []link.Packet
	Out    *Queue
	opened link.Packet        // a sealed datagram's plain form
	aad    [seal.AADSize]byte // opening's scratch
	held   int                // bytes of its own buffers and slots (Bytes)
}

// NewInbox makes what a goroutine that receives for the device reuses for every batch.
func (t *Transport) NewInbox() *Inbox {
	size := max(t.maxDatagram(), t.cfg.MTU+wire.DatagramHeaderSize+wire.FrameHeaderSize+wire.DataHeaderSize) + seal.Overhead
	rx := &Inbox{Pkts: make([]link.Packet, 32), opened: link.Packet{Buf: datagramBuf(size)}, Out: t.NewQueue()}
	rx.held = cap(rx.opened.Buf) + len(rx.Pkts)*packetSlot
	for i := range rx.Pkts {
		rx.Pkts[i].Buf = datagramBuf(size)
		rx.held += cap(rx.Pkts[i].Buf)
	}
	return rx
}

// datagramBuf makes a datagram buffer of size bytes whose capacity is all the heap gives it (its
// size class: 9,472 bytes for the 8,290 of MTU 8192's datagram), so that Bytes counts what the
// buffers hold.
func datagramBuf(size int) []byte { return slices.Grow([]byte(nil), size)[:size] }

// Bytes is what rx holds in datagram buffers and their slots, its queue's included (which grow
// with use). It is counted as they are made: a busy poller asks after every batch.
func (rx *Inbox) Bytes() int { return rx.held + rx.Out.held }

// inputBatch handles, at now, the first n datagrams of rx.Pkts and acknowledges what they
// brought; lazy (a busy poll) leaves the acknowledgements owed for up to ackDelay, so that the
// application's answer can carry them (room).
func (t *Transport) inputBatch(rx *Inbox, n int, now time.Duration, lazy bool) {
	for i := range rx.Pkts[:n] {
		pk := &rx.Pkts[i]
		if t.seal == nil {
			t.input(pk, now, nil)
			continue
		}
		from := pk.Addr.Addr().Unmap().As16()
		plain, salt, ctr, ok := t.seal.Open(rx.opened.Buf[:0], pk.Buf[:pk.N], &rx.aad, &from, &t.gid)
		if !ok {
			t.counts.AuthFailures.Add(1)
			continue
		}
		rx.opened.N, rx.opened.Addr = len(plain), pk.Addr
		rx.opened.Buf = plain[:cap(plain)]
		t.input(&rx.opened, now, &nonce{salt, ctr})
	}
	// What the batch's frames set going is framed only now: the answers its requests queued
	// (answer, onReadReq), what an ACK after DATA frames let out (onAck), a stream that waited
	// for the peer (onChallenge, a first answer); the timer's answered PING resends after the
	// datagram's frames (input). So an ACK riding with it covers whole datagrams of the peer's
	// (docs/congestion.md, "Reliability"): framed at the frame that set it going, the ACK would
	// cover the datagram's frames up to that one, and the peer, which stamped the whole datagram
	// once, would take the rest for lost if no other ACK came within minRTO.
	t.pumpDue()
	if lazy {
		t.flushAcks(now, ackDelay)
	} else {
		t.flushAcks(now, 0)
	}
}

// nonce is a sealed datagram's salt and counter, for the replay check.
type nonce struct {
	salt uint32
	ctr  uint64
}

// input handles one datagram from the network. Anything malformed, from a source the named peer
// has not proved its own (admit), addressed to another incarnation of this device, or beyond the
// peer table is dropped and counted.
func (t *Transport) input(pk *link.Packet, now time.Duration, n *nonce) {
	t.counts.RxPkts.Add(1)
	t.counts.RxBytes.Add(uint64(pk.N))
	h, frames, err := wire.ParseHeader(pk.Buf[:pk.N])
	if err != nil {
		t.counts.BadPackets.Add(1)
		return
	}
	from := netip.AddrPortFrom(pk.Addr.Addr().Unmap(), pk.Addr.Port())
	gid := config.GIDFromAddr(netip.AddrPortFrom(from.Addr(), h.SrcPort))
	if gid == t.gid {
		t.counts.BadPackets.Add(1)
		return
	}
	p := t.peers[gid]
	// A sealed datagram of another run than the peer's current one (another salt) is taken only
	// with a fresh cookie, as from a stranger: it may be a capture of an earlier run, and taken,
	// it would pass for the peer's restart and make its salt the current one (docs/security.md).
	// A port the peer proved is its own only for the life that proved it: a new life (another
	// source incarnation) proves its ports anew, all but its endpoint, so that a process that
	// binds a port the peer's earlier life proved cannot pass for its restart.
	otherRun := p != nil && n != nil && p.replay.OtherRun(n.salt)
	if p == nil && n != nil {
		if m, ok := t.memos[gid]; ok && m.salt != 0 && m.salt != n.salt {
			otherRun = true // (a forgotten peer's: its memo keeps the current run's salt and tick)
		}
	}
	newLife := p != nil && p.inc != 0 && h.SrcInc != p.inc && from.Port() != h.SrcPort
	run := false
	if p == nil || !p.trusts(from.Port(), h.SrcPort, now) || otherRun || newLife {
		run = p == nil || otherRun || newLife
		if p = t.admit(p, gid, from, &h, frames, pk.N, otherRun); p == nil {
			return
		}
	}
	if n != nil && !p.replay.Fresh(n.salt, n.ctr) {
		t.counts.Replays.Add(1)
		return
	}
	if run {
		p.runTick = uint16(t.cookieNow()) // (a context made, or another run taken: cookieTakes)
	}
	if h.DstInc != 0 && h.DstInc != t.inc {
		// Sent to an earlier life of this device: say so, so that the sender starts afresh.
		t.counts.StalePackets.Add(1)
		saved := p.inc
		p.inc = h.SrcInc
		t.commit(wire.AppendReset(t.room(p, p.pathRR, wire.FrameHeaderSize)))
		p.inc = saved
		return
	}
	if p.inc != 0 && h.SrcInc != p.inc {
		t.resetPeer(p, efaio.StatusRemoteAbort, h.SrcInc) // the peer restarted
	}
	p.heardFrom(from.Port(), now) // (proven by this datagram's cookie, if admitted)
	first := !p.heard
	p.inc, p.heard, p.seen = h.SrcInc, true, now
	if p.tx.epoch.Less(h.RxEpoch) {
		// The peer has had a later epoch of our stream than ours: we forgot it (our memo of
		// the peer was evicted) and started over below it, and the peer drops what we send as
		// stale. Move past it now, not after a transport timeout per epoch; what the peer never
		// acknowledged goes again, whole (docs/wire.md, "Epochs").
		p.tx.epoch = h.RxEpoch
		t.resetTx(p, efaio.StatusRemoteAbort, resetBehind)
	}
	f := &t.frame // (not on the stack: the host's methods take pointers into it)
	probed, data, ponged := false, false, false
	var probeNonce uint32
	for len(frames) > 0 {
		if frames, err = wire.NextFrame(frames, f); err != nil {
			t.counts.BadPackets.Add(1)
			return
		}
		switch f.Type {
		case wire.TypeData:
			data = data || f.Data.Flags&wire.FlagUD == 0
			t.onData(p, &h, &f.Data, now)
		case wire.TypeAck:
			if h.RxEpoch == p.tx.epoch {
				t.onAck(p, &f.Ack, h.TxEpoch, now, data)
			}
		case wire.TypeProbe:
			// One PROBE a datagram is answered (a sender probes each path in a datagram of its
			// own), once its frames are handled (below): a datagram full of them would otherwise
			// send as many PROBE_ACKs, each in a datagram of its own, to the peer whose endpoint
			// the header names.
			if !probed {
				probed, probeNonce = true, f.Nonce
			}
		case wire.TypeProbeAck:
			for i := range p.paths {
				if ps := &p.paths[i]; ps.probeSent && ps.nonce == f.Nonce {
					ps.probeSent = false // (a usable path's: a first contact's, see hello)
					if !ps.usable() {
						ps.failed, ps.unproven, ps.losses = false, false, 0
					}
				}
			}
			if s := &p.tx; s.rtoAt != 0 && f.Nonce == pingNonce(s.rtoLine) {
				ponged = true // (answered after the frames: what it sends may carry an ACK)
			}
		case wire.TypeReset, wire.TypeCookie:
			// Handled by the incarnation check and by admit.
		case wire.TypeChallenge:
			if first && !t.challengeOpens(f.Port) {
				p.heard = false
			}
			t.onChallenge(p, f.Cookie, f.Port, true)
		}
	}
	if ponged && p.tx.rtoAt != 0 { // (unless an ACK after the PROBE_ACK ended the timer's round)
		t.onPong(p, now)
	}
	if probed {
		// A PING (an even nonce: the peer's retransmission timer asks whether what it sent
		// arrived, checkRTO) is answered with our acknowledgement of its stream in front of the
		// PROBE_ACK: the peer takes a PROBE_ACK with nothing acknowledged for a loss.
		var path int
		if isPing(probeNonce) && p.rx.started {
			t.sendAck(p)
			path = t.txq.path
		} else {
			path = t.controlPath(p)
		}
		t.commit(wire.AppendProbe(t.room(p, path, wire.FrameHeaderSize+wire.ProbeSize), probeNonce, true))
	}
	// An ACK every ackEvery datagrams of the peer's stream within a batch (and one at its end:
	// inputBatch), counted in datagrams, not frames: small messages share datagrams, and an ACK
	// per 16 of them made ACK datagrams nearly as many as the data's. Only now, with the
	// datagram's frames handled, may an ACK cover them: a failed message's RESP must lie below
	// the horizon of the ACK that covers its last segment.
	if r := &p.rx; data {
		if r.sinceAck++; r.sinceAck >= ackEvery {
			t.sendAck(p)
		}
	}
	if first && p.heard && len(p.tx.queue) > 0 {
		t.pumpLater(p) // the stream that waited for the peer's first answer (hello)
	}
}

// onData takes a DATA frame: UD frames at once; stream frames once each, in any order.
func (t *Transport) onData(p *peer, h *wire.Header, f *wire.Data, now time.Duration) {
	if f.Flags&wire.FlagUD != 0 {
		t.onUD(p, f)
		return
	}
	r := &p.rx
	if !r.started || h.TxEpoch != r.epoch {
		if r.started && h.TxEpoch.Less(r.epoch) {
			// From a stream the peer has since abandoned; or the peer forgot its later epoch
			// (its memo of us was evicted) and started over below it. An ACK tells it which
			// epoch we are at (its header's rx epoch), so that it moves past it (input).
			t.counts.StalePackets.Add(1)
			t.oweAck(p, now)
			return
		}
		t.resetRx(p)
		r.started, r.epoch = true, h.TxEpoch
	}
	t.rxReady(p)
	t.oweAck(p, now)
	psn := f.PSN
	switch {
	case psn.Less(r.cum):
		return // a duplicate: the ACK tells the sender again
	case psn-r.cum >= rxWindow:
		t.counts.RxDrops.Add(1) // beyond the window: the sender must not have sent it yet
		return
	case r.seen.has(psn):
		return // a duplicate
	case f.Op <= wire.OpWrite && p.tx.answers >= maxBacklog:
		// A request that may need an answer (read data, a RESP) while our stream to the peer
		// holds maxBacklog answers not yet sent: refused, unacknowledged, until they drain (the
		// peer sends it again), so that a peer that asks and never acknowledges cannot grow our
		// queue without bound. Only answers count: with our own requests queued too, two
		// devices that each queue many for the other would refuse each other's for ever.
		t.counts.RxDrops.Add(1)
		return
	}
	r.seen.flip(psn)
	r.ackPath = h.Path // (a duplicate leaves it: the ACK names the path a PSN first came by)
	// New data from the peer is progress for our side too: the answers and read data we wait
	// for may be queued behind it in its stream, so the transport timeout must not run.
	p.tx.progress = now
	if r.highest.Less(psn) {
		r.highest = psn
	}
	for r.seen.has(r.cum) {
		r.seen.flip(r.cum)
		r.cum++
	}
	switch f.Op {
	case wire.OpSend, wire.OpWrite:
		t.onSegment(p, f)
	case wire.OpReadReq:
		t.onReadReq(p, f)
	case wire.OpReadResp:
		t.onReadResp(p, f, h.TxEpoch)
	case wire.OpResp:
		if o := p.tx.reqs.get(f.MsgID); o != nil {
			t.completeReq(o, respStatus(f.Status), true)
		}
	case wire.OpAbort:
		if in := p.rx.in[f.MsgID]; in != nil {
			delete(p.rx.in, f.MsgID)
			t.held--
			in.Abort()
		}
		if !psn.Less(r.cum) {
			// A PSN before the ABORT is still to come, perhaps a segment of this message.
			if r.aborted == nil {
				r.aborted = make(map[uint32]wire.PSN)
			}
			if at, ok := r.aborted[f.MsgID]; !ok || at.Less(psn) {
				r.aborted[f.MsgID] = psn
			}
			r.abortQ.push(abortMark{psn, f.MsgID})
		}
	}
	for len(r.abortQ) > 0 && r.abortQ[0].psn.Less(r.cum) {
		// Every segment sent before the ABORT is in (this one handled); a message is forgotten at
		// its latest ABORT.
		if m := r.abortQ.pop(); r.aborted[m.msgID] == m.psn {
			delete(r.aborted, m.msgID)
		}
	}
	if len(p.tx.waiting) > 0 {
		t.settle(p) // our stream may have reached a horizon
	}
}

// respStatus is the status a RESP's byte reports: one a responder sends (docs/wire.md, "Frames"),
// or else 12 (REMOTE_BAD_STATUS, an unexpected status from the responder). A byte from the network
// must not complete a WR with a local status, a success, or no EFA status at all.
func respStatus(b uint8) efaio.Status {
	switch st := efaio.Status(b); st {
	case efaio.StatusRemoteBadAddress, efaio.StatusRemoteBadDestQPN, efaio.StatusRemoteRNR,
		efaio.StatusRemoteBadLength, efaio.StatusRemoteBadStatus:
		return st
	}
	return efaio.StatusRemoteBadStatus
}

// onSegment hands a SEND or RDMA write segment to the host; the message is answered when whole.
func (t *Transport) onSegment(p *peer, f *wire.Data) {
	in := p.rx.in[f.MsgID]
	if in == nil {
		if _, ok := p.rx.aborted[f.MsgID]; ok {
			return // a segment that came after its message's ABORT: the sender let it go
		}
		if !f.Whole() && (len(p.rx.in) >= maxInbound || t.held >= maxHeld) {
			t.counts.RxDrops.Add(1)
			t.answer(p, f.MsgID, efaio.StatusRemoteBadStatus) // (the sender's request fails, not lost unseen)
			return
		}
	}
	next, st, done := t.host.Receive(p.gid, f, in)
	switch {
	case done:
		if in != nil {
			delete(p.rx.in, f.MsgID)
			t.held--
		}
		t.answer(p, f.MsgID, st)
	case in == nil:
		if p.rx.in == nil {
			p.rx.in = make(map[uint32]Inbound)
		}
		p.rx.in[f.MsgID] = next
		t.held++
	}
}

// onReadReq answers an RDMA read: the data as READ_RESP segments, or a RESP with the error.
func (t *Transport) onReadReq(p *peer, f *wire.Data) {
	src, region, st := t.host.Read(p.gid, f)
	if st != efaio.StatusOK {
		t.answer(p, f.MsgID, st)
		return
	}
	o := t.newMsg(p, kindReadResp)
	o.hdr = wire.Data{MsgID: f.MsgID, Length: f.Length, Op: wire.OpReadResp, SrcQPN: f.DstQPN, DstQPN: f.SrcQPN}
	o.src[0], o.nsrc, o.region, o.length, o.done = src, 1, region, uint64(src.Len()), true
	t.queue(p, o)
	t.pumpLater(p) // (framed once the batch is handled: inputBatch)
}

// onReadResp places read data, which came in epoch of the responder's stream, at the
// requester; the read completes with its last byte. Data in a newer epoch than the read's earlier
// data is the whole answer again (the responder's stream timed out and it sent the read data
// anew, docs/wire.md "Completion"): the count starts over.
func (t *Transport) onReadResp(p *peer, f *wire.Data, epoch wire.Epoch) {
	o := p.tx.reqs.get(f.MsgID)
	if o == nil || o.hdr.Op != wire.OpReadReq {
		return // answered already, or flushed
	}
	if o.got > 0 && o.hEpoch != epoch {
		o.got = 0
	}
	o.hEpoch = epoch
	end := uint64(f.Offset) + uint64(len(f.Payload))
	if end > uint64(o.sink.Len()) || uint64(f.Length) != o.length {
		t.completeReq(o, efaio.StatusRemoteBadStatus, false)
		return
	}
	if o.owner != nil { // a cancelled read's memory is the application's again
		if !t.host.Copy(o.sink, int(f.Offset), f.Payload) {
			t.completeReq(o, efaio.StatusLocalInvalidLKey, false)
			return
		}
	}
	o.got += uint64(len(f.Payload))
	if o.got >= o.length {
		t.completeReq(o, efaio.StatusOK, false)
	}
}

// onUD delivers a UD datagram: no stream, no answer.
func (t *Transport) onUD(p *peer, f *wire.Data) {
	if f.Op != wire.OpSend || !f.Whole() {
		t.counts.BadPackets.Add(1)
		return
	}
	t.host.UD(p.gid, f)
}

// answer sends a RESP frame with a message's status on p's stream if it failed; success needs no
// frame of its own (the ACKs covering the message say it).
func (t *Transport) answer(p *peer, msgID uint32, st efaio.Status) {
	if st == efaio.StatusOK {
		return
	}
	o := t.newMsg(p, kindResp)
	o.hdr = wire.Data{MsgID: msgID, Op: wire.OpResp, Status: uint8(st)}
	o.done = true
	t.queue(p, o)
	t.pumpLater(p) // (framed once the batch is handled: inputBatch)
}

// abortInbound ends every message p has arriving in part: each Inbound is told to Abort.
func (t *Transport) abortInbound(p *peer) {
	r := &p.rx
	// In message-id order (not the map's), so that a replayed run completes them alike.
	for _, id := range slices.Sorted(maps.Keys(r.in)) {
		in := r.in[id]
		delete(r.in, id)
		t.held--
		in.Abort()
	}
}

// resetRx forgets the peer's stream: the messages half received are aborted (Inbound.Abort).
func (t *Transport) resetRx(p *peer) {
	r := &p.rx
	if t.txq != nil && t.txq.cur == p {
		t.txq.cur = nil // its header names the stream being forgotten
	}
	t.abortInbound(p)
	r.aborted, r.abortQ = nil, nil
	r.cum, r.highest, r.started = 0, ^wire.PSN(0), false // (highest cum-1: nothing beyond the cumulative point)
	if r.seen != nil {
		clear(r.seen)
	}
}
