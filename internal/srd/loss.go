package srd

import (
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/wire"
)

// reorderWindow is how much later than a packet another may be sent and still be acknowledged
// first without the packet counting as lost. It is the more of two allowances, both of which fall
// back after 16 loss episodes without a spurious loss:
//   - a quarter of the least RTT seen, times reoSteps, which grows each time a loss proves
//     spurious (the packet was acknowledged after all), up to the smoothed RTT plus four
//     deviations (RFC 8985 stops at the smoothed RTT; under jitter, the RTT samples of
//     cumulative acknowledgements come from the packets that arrived early, and run low);
//   - the widest reordering acknowledgements have shown within a path (reoSeen), up to half the
//     retransmission timeout, so that acknowledgements still find a loss before the timer does.
//     A path whose delay varies by 0–200 µs reorders by up to 200 µs, whatever the mean.
func (s *txStream) reorderWindow() time.Duration {
	base := max(s.minRTT/4, minReorder)
	return max(min(base*time.Duration(s.reoSteps), s.srtt+4*s.rttvar), min(s.reoSeen, s.rto/2), minReorder)
}

// sawReorder notes that a packet arrived after one sent gap later on its own path: the window
// covers that much from then on, with an eighth to spare. Reordering is measured only between
// packets sent once (pathState.onceAt): from a packet counted lost that then proves spurious
// (the gap that counted it lost, sentPkt.gap), and from one acknowledged after a later one,
// within the allowance, before anything counts lost.
func (s *txStream) sawReorder(gap time.Duration) {
	s.reoSeen = max(s.reoSeen, gap+gap/8)
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

// transportTick runs on the device's timer (Tick): path probes, transport timeouts and
// retransmission timeouts. It reports whether any stream has something outstanding.
func (t *Transport) transportTick(now time.Duration) bool {
	t.expirePeers(now)
	t.forgetStalls(now)
	t.linger = t.slimIdle(now)
	busy := false
	for _, p := range t.active { // (a slim peer is idle: no timer of its runs, no path is probed)
		for i := range p.paths {
			// Unproven paths only for a stream, ours or the peer's (UD alone keeps no state at
			// the peer): a device that only acknowledges must prove them too, or its ACKs all
			// take the endpoint's path, and are lost with it.
			// And not before the peer is heard from: it challenges our endpoint's port first (hello),
			// and the stream goes on that path with its cookie.
			if ps := &p.paths[i]; (ps.failed || ps.unproven && p.heard && (p.tx.busy() || p.rx.started)) && now >= ps.probeAt {
				t.probe(p, i, now)
			}
		}
		s := &p.tx
		if !s.busy() {
			s.progress = now
			continue
		}
		if now-s.progress > t.cfg.TransportTimeout {
			st := efaio.StatusLocalUnreachRemote
			if p.heard {
				st = efaio.StatusLocalUnrespRemote
				t.counts.UnresponsiveRemoteEvents.Add(1)
			}
			t.resetTx(p, st, resetTimeout)
			busy = busy || s.busy() // answers queued again in the new stream
			continue
		}
		busy = true
		t.checkRTO(p, now)
		t.pump(p)
	}
	return busy
}

// probe sends a PROBE on path i of p, in a datagram of its own, and schedules the next.
// The nonce stays until a PROBE_ACK carries it, so that an answer later than probeInterval (a
// round trip that long) still counts.
func (t *Transport) probe(p *peer, i int, now time.Duration) {
	ps := &p.paths[i]
	if !ps.probeSent {
		ps.nonce = uint32(now) ^ uint32(i)<<24 | 1
	}
	ps.probeSent, ps.probeAt = true, now+probeInterval
	t.txq.cur = nil // a datagram of its own
	t.commit(wire.AppendProbe(t.room(p, i, wire.FrameHeaderSize+wire.ProbeSize), ps.nonce, false))
	t.txq.cur = nil
}

// checkRTO is the fallback for losses no later acknowledgement reveals (the last packets of a
// burst, or a peer that went quiet): the timer fires when the packet sent longest ago has waited
// the retransmission timeout since it was sent, or since the timer last fired.
//
// A firing sends no data until the peer shows that the data is missing: it asks. A PING (a PROBE
// whose nonce is even, docs/wire.md "PROBE") goes on the path an ACK would take (a recently proven
// one if there is one), and the peer answers it with its acknowledgement of our stream in front
// of the PROBE_ACK. If that acknowledgement covers what waited, the peer (or our own process) was
// held up, not the network, and nothing went twice; if the PROBE_ACK comes with nothing acknowledged since the timer fired, the peer is
// there and the packet is not: it goes again at once (onPong). On this 2-vCPU machine nearly every
// timeout of a loss-free run was a stall of a process off its core for longer than the timer
// (ticks 6 to 8 ms late), so a firing that sent data sent it twice; a real loss of the last
// packets of a burst pays one round trip more; a stream that lost packets lately (losing) skips
// the PINGs, and its first firing sends the data at once, its later ones on two paths. Each
// firing backs the timer off and PINGs again; once a PING has been answered (the data sent again is lost too), or after maxPings unanswered
// (a peer that does not answer PINGs, or they are lost), a firing sends the data, on two paths,
// and no PING.
func (t *Transport) checkRTO(p *peer, now time.Duration) {
	s := &p.tx
	var oldest *sentPkt // the outstanding packet sent longest ago: the timer's
	for psn := s.una; psn != s.next; psn++ {
		e := s.slot(psn)
		if e.acked || e.msg == nil {
			continue
		}
		if e.msg.answeredReq() {
			// Taken as acknowledged (the acknowledgement was lost): in flight, with nothing sent
			// after it to bring another, it would hold the window shut for good.
			t.ackAnswered(p, e, now)
			continue
		}
		if !e.lost && (oldest == nil || e.at < oldest.at) {
			oldest = e
		}
	}
	s.dropAcked()
	if s.una == s.next {
		// Nothing outstanding, with no acknowledgement to end the timer's round (answered
		// requests): it ends here, or the next message's timer would go on from it.
		s.rtoAt, s.pings, s.ponged = 0, 0, false
	}
	if oldest == nil || now-max(oldest.at, s.rtoAt) < max(s.rto, t.stallFloor) {
		return
	}
	t.counts.RetransTimeoutEvents.Add(1)
	rto := max(s.rto, t.stallFloor)
	s.rto = min(2*rto, maxRTO)
	first := s.rtoAt == 0
	if first {
		s.rtoLine = now - rto
	}
	s.rtoAt = now
	switch {
	case s.losing(now):
		t.resendLowest(p, now, !first)
	case s.pings < maxPings && !s.ponged:
		s.pings++
		t.ping(p)
	default:
		t.resendLowest(p, now, true)
	}
}

// losing reports whether the stream lost packets lately (its loss rate at least sparseLoss, a
// loss within lossMemory): it sends sparse copies (pump), and its timer sends the data at once,
// not a PING first (checkRTO): on a stream that really loses, a timeout is a loss more often
// than a stall, and the PING's round trip lengthened the tail (ping-pong through the fabric with
// 1% loss, p99.9 5.0 ms against 3.1, 2026-12-05).
func (s *txStream) losing(now time.Duration) bool {
	return s.lossRate >= sparseLoss && now-s.lossAt < lossMemory
}

// maxPings is how many of the timer's expiries in a row PING a peer that does not answer before
// the next sends the data (checkRTO): at the least timer, PINGs 2, 6 and 14 ms after the packet
// went and the data at 30 ms, past the stalls seen here.
const maxPings = 3

// pingNonce is the nonce of the timer's PINGs in the round that began when the packets sent up
// to line had waited the timeout: even, unlike a path's PROBE's.
func pingNonce(line time.Duration) uint32 { return uint32(line) &^ 1 }

// isPing reports whether a PROBE's nonce is a timer's PING's (pingNonce) rather than a path
// PROBE's (probe: odd).
func isPing(nonce uint32) bool { return nonce&1 == 0 }

// ping sends the timer's PING (checkRTO), in a datagram of its own.
func (t *Transport) ping(p *peer) {
	t.txq.cur = nil
	t.commit(wire.AppendProbe(t.room(p, t.controlPath(p), wire.FrameHeaderSize+wire.ProbeSize), pingNonce(p.tx.rtoLine), false))
	t.txq.cur = nil
}

// onPong takes a PROBE_ACK with the nonce of the timer's PINGs. The peer's acknowledgement came in
// front of it (input) and acknowledged nothing that waited (it would have ended the timer's round,
// onAck): the lowest packet is lost, and goes again at once, once a round.
func (t *Transport) onPong(p *peer, now time.Duration) {
	s := &p.tx
	if s.ponged {
		return
	}
	s.ponged = true
	t.resendLowest(p, now, false)
}

// resendLowest sends again, as a probe (RACK-TLP's, RFC 8985), the lowest PSN not acknowledged,
// whether counted lost already (waiting for room in the window) or not: an acknowledgement's
// selective bits reach only 256 PSNs past the peer's cumulative point, so only a probe at that
// point is sure to be acknowledged, and to move it. It goes now, whatever the window: a window
// full of packets that were lost (a receiver's socket overflowing) frees no room until an
// acknowledgement shows them lost, and only the probe's can. Its acknowledgement shows which of
// the others are lost too (ackSlot takes a retransmission's acknowledgement for the
// retransmission's once a round trip has passed since it went), and the first acknowledgement of
// anything after the timer fired counts as lost every packet that had waited the timeout then
// and is still not acknowledged (onAck). On both paths with twice: the timer fired before with
// nothing acknowledged since, and a path gone dark for a while (that no loss of a probe marks
// failed) would otherwise take every probe the rotation gives it, at backed-off intervals, until
// the transport timeout.
//
// Not held against the packet's path yet: the loss may as well be of an acknowledgement (they
// travel on the peer's paths). If the packet then arrives by another path, ackSlot blames this
// one. Without that, a path that swallows whole bursts is never marked failed (no later packet on
// it is acknowledged to reveal the losses), and every timeout goes back to it in turn.
//
// No loss is counted before the stream's first RTT sample (the initial timer is a guess, and a
// peer slow to answer its first datagrams, a process starting, is the common cause: counted, it cut
// the window and turned sparse copies on for thousands of packets of a loss-free ping-pong), nor
// for a packet that went twice, on two paths, as a sparse copy: both lost is far less likely than
// a peer slow to answer, and counted, a loaded machine's stalls kept the copies on for good (a
// ping-pong on 2 busy vCPUs: 18,000 copies in 20,000 round trips).
func (t *Transport) resendLowest(p *peer, now time.Duration, twice bool) {
	s := &p.tx
	psn := s.una
	for ; psn != s.next; psn++ {
		if e := s.slot(psn); !e.acked && e.msg != nil {
			break
		}
	}
	if psn == s.next {
		return
	}
	e := s.slot(psn)
	noLoss := s.srtt == 0 || e.copied
	if !e.lost {
		e.suspect = e.path + 1
		e.lost, e.counted, e.gap = true, !noLoss, 0
		s.inflight--
	}
	t.sendAgain(p, psn, e, t.sendTime())
	if twice && !e.acked {
		t.copySeg(p, psn, e)
	}
	if !noLoss {
		s.countFate(true)
		s.lossAt = now
		s.cut(1)
	}
}
