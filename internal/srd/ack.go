package srd

import (
	"cmp"
	"math"
	"math/bits"
	"time"

	"github.com/softefa/softefa/internal/wire"
)

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
// Called by every goroutine doing the device's work (under its lock): whoever comes by first after ackDelay
// sends them, and the device's timer keeps ticking while any are owed (AcksOwed).
func (t *Transport) flushAcks(now, minAge time.Duration) {
	keep := 0
	for _, p := range t.ackList {
		switch r := &p.rx; {
		case !r.ackDue: // sent already, or a second entry for the peer
		case now-r.ackSince >= minAge || p.tx.sentAt == 0 || now-p.tx.sentAt > talkWindow:
			t.sendAck(p)
		default:
			t.ackList[keep] = p
			keep++
		}
	}
	clear(t.ackList[keep:])
	t.ackList = t.ackList[:keep]
	t.acksOwed.Store(keep > 0)
}

// oweAck notes that p is owed an acknowledgement of its stream (flushAcks sends it).
func (t *Transport) oweAck(p *peer, now time.Duration) {
	if r := &p.rx; !r.ackDue {
		r.ackDue, r.ackSince = true, now
		t.ackList = append(t.ackList, p)
		t.acksOwed.Store(true)
	}
}

// sendAck acknowledges p's stream: the cumulative point, the next 256 PSNs bit by bit, the
// highest PSN seen, and the path of the newest frame.
func (t *Transport) sendAck(p *peer) {
	a := p.ack()
	p.rx.ackDue, p.rx.sinceAck = false, 0 // before room, which would carry the ACK itself
	var path int
	if q := t.txq; q.cur == p && q.pkts[q.n-1].N+wire.FrameHeaderSize+wire.AckSize <= q.maxLen && t.carriesAck(p, q.path) {
		path = q.path // ride in the datagram going to p already (an answer, data) on a path fit for it
	} else {
		path = t.controlPath(p) // (only now: it moves the rotation)
	}
	t.commit(wire.AppendAck(t.room(p, path, wire.FrameHeaderSize+wire.AckSize), &a))
}

// ack is the acknowledgement of p's stream as it stands.
func (p *peer) ack() wire.Ack {
	r := &p.rx
	a := wire.Ack{Cum: r.cum, Highest: r.highest, Path: r.ackPath}
	a.Horizon, a.HasHorizon = p.tx.horizon()
	for i := range wire.SackWords * 64 {
		if psn := r.cum + 1 + wire.PSN(i); !r.highest.Less(psn) && r.seen != nil && r.seen.has(psn) {
			a.Sack[i/64] |= 1 << (i % 64)
		}
	}
	return a
}

// onAck takes an acknowledgement of our stream: it frees acknowledged packets, samples the RTT,
// counts as lost the packets that later ones overtook, adjusts the window and sends what it
// allows: at once, or, if afterData (the ACK came after DATA frames of the peer's stream in its
// datagram), once the batch is handled (inputBatch), so that an ACK riding with what it sends
// covers the whole datagram (docs/congestion.md, "Reliability"). At once otherwise: an ACK
// riding then covers only earlier datagrams, and sent later, the data would take an ACK along
// more often, on its own path, which may have gone dark (TestSimPathsDown).
func (t *Transport) onAck(p *peer, a *wire.Ack, epoch wire.Epoch, now time.Duration, afterData bool) {
	s := &p.tx
	switch {
	case s.next.Less(a.Cum):
		t.counts.BadPackets.Add(1) // acknowledges what we never sent
		return
	case a.Cum.Less(s.una - rxWindow):
		// Older than the window: a datagram held back, by the network or by a receiving
		// goroutine that lost the processor for a while with its batch read (the receive loop
		// and a busy poller read side by side).
		t.counts.StalePackets.Add(1)
		return
	}
	s.hzn, s.hasHzn, s.hznEpoch = a.Horizon, a.HasHorizon, epoch
	tally := ackTally{rtt: -1, early: s.rtoAt != 0 && s.acksEarly(a), answered: a.Path}
	if !a.Highest.Less(s.una) && a.Highest.Less(s.next) {
		tally.newest = s.slot(a.Highest)
	}
	ack := func(psn wire.PSN) { t.ackSlot(p, s.slot(psn), now, &tally) }
	for psn := s.una; psn.Less(a.Cum); psn++ {
		ack(psn)
	}
	for w, word := range a.Sack {
		for word != 0 {
			i := bits.TrailingZeros64(word)
			word &^= 1 << i
			psn := a.Cum + 1 + wire.PSN(w*64+i)
			if psn.Less(s.next) && !psn.Less(s.una) {
				ack(psn)
			}
		}
	}
	s.dropAcked()
	timedOut := time.Duration(-1)
	if tally.newly > 0 {
		if s.rtoAt != 0 && !tally.early {
			timedOut = s.rtoLine // (checkRTO)
		} else if s.rtoAt != 0 {
			// The timer fired, but a packet sent before it, and never again, has arrived: the
			// peer was slow to answer (a starved process reading its backlog), not losing. What
			// waited the timeout is left to the acknowledgements still to come (F-RTO, RFC
			// 5682); had it been lost, the timer fires again, and then counts it lost.
			t.counts.SpuriousTimeouts.Add(1)
			t.stalled(now, now-s.rtoLine) // (the packets sent up to rtoLine waited this long, at least)
		}
		s.progress, s.rtoAt, s.pings, s.ponged = now, 0, 0, false
	}
	if tally.rtt >= 0 {
		s.sampleRTT(tally.rtt)
	} else if tally.newly > 0 {
		// Only retransmitted packets acknowledged (no RTT sample, Karn's rule), but acknowledged:
		// the backoff has done its job. Left doubled, it would pace every loss that follows at
		// up to maxRTO while the window is too small for acknowledgements to reveal losses.
		s.resetRTO()
	}
	// A packet is lost when one sent after it on the same path has been acknowledged (each path
	// is taken to keep its own order, with the reordering allowance: reorderWindow), or when one
	// sent no earlier on any path has and the packet has waited two of its own path's RTTs (paths
	// differ in delay, but one that far behind has dropped it: this is what finds a dead path
	// within a few RTTs). A packet of the batch that sent the newest one acknowledged (the same
	// send time) went before it if its PSN is lower (a batch sends in PSN order: retransmissions,
	// then new packets); one that went after it waits at least minRTO, not two RTTs: the peer may
	// have read the first part of the batch while the rest was still going out. The first
	// acknowledgement of anything after the retransmission timer fired also counts as lost every
	// packet that had waited the timeout then (timedOut): the timer sent only the oldest again, as
	// a probe (checkRTO), unless that acknowledgement shows the timer spurious (acksEarly).
	lost := 0
	reo := s.reorderWindow()
	anyAcked := p.newestAcked()
	var batchTop wire.PSN // the highest PSN acknowledged of the newest batch acknowledged (found once needed)
	topKnown := false
	for psn := s.una; psn.Less(s.next); psn++ {
		e := s.slot(psn)
		if e.acked || e.lost || e.msg == nil {
			continue
		}
		ps := &p.paths[e.path]
		wait := 2*cmp.Or(ps.srtt, s.srtt) + reo
		if e.at == anyAcked {
			if !topKnown {
				batchTop, topKnown = s.batchTop(anyAcked), true
			}
			if batchTop.Less(psn) {
				wait = max(wait, minRTO)
			}
		}
		revealed := e.at+reo < ps.ackedAt || anyAcked >= e.at && now-e.at > wait
		if !revealed && e.at > timedOut {
			continue
		}
		e.lost, e.counted = true, true
		s.inflight--
		s.retx = append(s.retx, psn)
		s.countFate(true)
		lost++
		e.gap = 0
		if e.at+reo < ps.onceAt {
			e.gap = uint32(min(ps.onceAt-e.at, math.MaxUint32))
		}
		if revealed {
			t.pathLoss(p, int(e.path), now)
		} else {
			e.suspect = e.path + 1 // timed out: held against its path only if it turns up by another (ackSlot)
		}
	}
	if lost > 0 {
		s.lossAt = now
	}
	if len(s.waiting) > 0 {
		t.settle(p)
	}
	s.congestion(tally.newly, lost)
	if afterData {
		t.pumpLater(p)
	} else {
		t.pump(p)
	}
}

// newestAcked is the send time of the latest-sent packet acknowledged on any path.
func (p *peer) newestAcked() (at time.Duration) {
	for i := range p.paths {
		at = max(at, p.paths[i].ackedAt)
	}
	return at
}

// batchTop returns the highest PSN in the window acknowledged among those sent at at, or the PSN
// below the window if none is (they were all below it).
func (s *txStream) batchTop(at time.Duration) wire.PSN {
	for psn := s.next - 1; !psn.Less(s.una); psn-- {
		if e := s.slot(psn); e.acked && e.at == at {
			return psn
		}
	}
	return s.una - 1
}

// dropAcked moves una past the packets acknowledged at the window's start.
func (s *txStream) dropAcked() {
	for s.una != s.next && s.slot(s.una).acked {
		*s.slot(s.una) = sentPkt{}
		s.una++
	}
}

// ackAnswered acknowledges slot e, of a request the peer has answered (checkRTO, sendAgain).
func (t *Transport) ackAnswered(p *peer, e *sentPkt, now time.Duration) {
	if e.lost {
		e.lost = false // (waiting to go again: not in flight, and no spurious loss)
		p.tx.inflight++
	}
	t.ackSlot(p, e, now, &ackTally{byAnswer: true})
}

// ackTally is what one acknowledgement did: how many packets it newly acknowledged, the latest
// RTT sample it gave (-1: none), and whether one of them was sent once, before the
// retransmission timer last fired, or arrived by its first transmission (early: the timer was
// spurious).
type ackTally struct {
	newly int
	rtt   time.Duration
	early bool

	answered uint8    // the path of the newest DATA frame the acknowledgement answers
	newest   *sentPkt // the slot of the highest PSN the peer has, if still in the window

	// byAnswer: no acknowledgement came, but the peer's answer to the request showed that it
	// had the packet (ackAnswered): no RTT sample, no credit to a path.
	byAnswer bool
}

// ackSlot records the acknowledgement of one stream slot: the packet leaves the flight, credits
// its path, gives an RTT sample unless it was sent twice, and lets go of its message.
func (t *Transport) ackSlot(p *peer, e *sentPkt, now time.Duration, tally *ackTally) {
	s := &p.tx
	if e.acked || e.msg == nil {
		return
	}
	e.acked = true
	if !e.lost {
		s.inflight--
	}
	// The timer sent e again on another path, and the acknowledgement answers a frame that came
	// on e's first path, e being the newest the peer has: the first transmission arrived (a peer
	// slow to answer, not a loss). This is what tells a ping-pong's spurious timeouts, where no
	// other packet is out to show it (acksEarly).
	originalCame := e.suspect != 0 && e.retx > 0 && !e.copied && e == tally.newest && tally.answered == e.suspect-1 && e.suspect-1 != e.path
	if originalCame && s.rtoAt != 0 {
		tally.early = true // (onAck counts the spurious timeout)
	}
	spurious := e.lost || e.retx > 0 && now-e.at < s.minRTT/2 || originalCame
	if spurious {
		// Counted lost, but the packet (not a copy sent again) arrived: the loss was reordering.
		s.reoSteps = min(s.reoSteps+1, 64)
		s.reoClean = 0
		s.sawReorder(time.Duration(e.gap))
		t.counts.SpuriousRetrans.Add(1)
		s.lossRate = max(s.lossRate-1.0/lossGain, 0) // take the loss back
		if e.counted {
			s.undoSpurious()
		}
		// Nor was it the path's fault: take back the count, and the failure if it was the last.
		if ps := &p.paths[e.path]; ps.losses > 0 {
			ps.losses--
			if ps.failed && ps.losses < pathFailLoss {
				ps.failed = false
			}
		}
	} else if e.suspect != 0 && e.suspect-1 != e.path && !e.copied {
		t.pathLoss(p, int(e.suspect-1), now) // it timed out on that path and came through on this one
	}
	tally.newly++
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
	if e.retx == 0 && !tally.byAnswer {
		tally.rtt = now - e.at // a copy left with the packet: its arrival times the round trip as well
	}
	if !e.copied && !tally.byAnswer { // either copy of a copied packet may be the one that arrived: credit no path
		// Packets sent once leave in PSN order, and an acknowledgement is taken in PSN order:
		// one sent earlier on the path taken after one sent later arrived after it (creditPath
		// moves onceAt). A packet sent again leaves out of PSN order, and which copy arrived is
		// unknown: no measure.
		ps := &p.paths[e.path]
		if e.retx == 0 && e.at < ps.onceAt {
			s.sawReorder(ps.onceAt - e.at)
		}
		// A copy sent again counts as arrived if its acknowledgement came a round trip after
		// it went (creditPath), unless the retransmission timer fired and this acknowledgement
		// shows it spurious: then the receiver is reading a backlog, and the original came.
		minRTT := s.minRTT
		if tally.early {
			minRTT = -1
		}
		creditPath(ps, e, now, minRTT)
		p.echoed(e)
	}
	m := e.msg
	e.msg = nil
	m.pending--
	if m.pending == 0 && m.sent == m.nseg && m.kind == kindRequest && m.owner != nil && !m.answered && !m.faulted &&
		(m.hdr.Op == wire.OpSend || m.hdr.Op == wire.OpWrite) {
		// Every segment is in: it succeeded unless a RESP below the peer's horizon says not.
		m.waits, m.hasHzn, m.horizon, m.hEpoch = true, s.hasHzn, s.hzn, s.hznEpoch
		s.waiting = append(s.waiting, m)
	}
	t.release(m)
}

// acksEarly reports whether a acknowledges, for the first time, a packet sent once that had
// waited the retransmission timeout when the timer fired (sent up to rtoLine): the timer was
// spurious. A packet sent later proves nothing of those that waited: acknowledged while one of
// them is not (copies on, which credit no path, hide its loss from the other rules), it shows
// that one lost (onAck's timedOut), and a PING round taking it for a stall never resent it.
func (s *txStream) acksEarly(a *wire.Ack) bool {
	early := func(psn wire.PSN) bool {
		e := s.slot(psn)
		return !e.acked && e.msg != nil && e.retx == 0 && e.at <= s.rtoLine
	}
	for psn := s.una; psn.Less(a.Cum); psn++ {
		if early(psn) {
			return true
		}
	}
	for w, word := range a.Sack {
		for word != 0 {
			i := bits.TrailingZeros64(word)
			word &^= 1 << i
			if psn := a.Cum + 1 + wire.PSN(w*64+i); psn.Less(s.next) && !psn.Less(s.una) && early(psn) {
				return true
			}
		}
	}
	return false
}

// creditPath records on the path that carried e that it was acknowledged: the path is healthy
// again, and (if e went once) an RTT sample and the send time of its latest acknowledged packet,
// of those sent once too (onceAt, which reordering is measured against: ackSlot).
// A packet that went more than once gives no RTT sample (which copy arrived is unknown, Karn's
// rule), but when its acknowledgement came at least minRTT after its latest copy went, that copy
// is taken to have arrived (RACK's rule, RFC 8985): its send time counts as acknowledged, so
// that packets sent before it and still unacknowledged count as lost (onAck). This is what
// makes a retransmission timeout's probe reveal the other losses of a tail (checkRTO). A
// negative minRTT takes no copy sent again to have arrived.
func creditPath(ps *pathState, e *sentPkt, now, minRTT time.Duration) {
	if !ps.failed || e.at >= ps.failedAt { // an acknowledgement of a packet from before the failure proves nothing
		ps.losses, ps.failed = 0, false
	}
	if e.at >= ps.unprovenAt {
		ps.unproven = false // the peer took a datagram from the path's port since it was in doubt
	}
	if e.retx != 0 {
		if minRTT >= 0 && now-e.at >= max(minRTT, 1) {
			ps.ackedAt = max(ps.ackedAt, e.at)
		}
		return
	}
	if rtt := now - e.at; ps.srtt == 0 {
		ps.srtt = rtt
	} else {
		ps.srtt = (7*ps.srtt + rtt) / 8
	}
	ps.ackedAt = max(ps.ackedAt, e.at)
	ps.onceAt = max(ps.onceAt, e.at)
}
