package srd

import "time"

// resetRTO undoes the retransmission timer's backoff: the peer is acknowledging again.
func (s *txStream) resetRTO() {
	if s.srtt > 0 {
		s.rto = min(max(s.srtt+4*s.rttvar, minRTO), maxRTO)
	}
}

// stallMemory is how long the retransmission timer keeps a floor set by a stall (stalled) before
// halving it; maxStallFloor the highest floor a stall sets.
const (
	stallMemory   = time.Second
	maxStallFloor = 16 * time.Millisecond
)

// stalled records a retransmission timeout proved spurious at now, the acknowledgement having
// come stall after the packets it waited for were sent: a process off its core (ours, or a
// peer's), not a loss. The device's timers wait at least a quarter longer than that from now on
// (checkRTO), up to maxStallFloor, forgetting it by halves (forgetStalls): on a loaded machine
// the stalls recur, and the RTT estimator alone forgets one within a few fast acknowledgements,
// to fire spuriously at the next (the loaded bench's runs fired the timer about a hundred times
// each, 2026-12-05). The floor is the device's, not a peer's: our own process's stalls hold up
// every peer's acknowledgements alike, and a peer's context stays within its memory budget.
func (t *Transport) stalled(now, stall time.Duration) {
	t.stallFloor, t.stallAt = min(max(t.stallFloor, stall+stall/4), maxStallFloor), now
}

// forgetStalls halves the timer's floor for each stallMemory since a stall last raised or
// halved it.
func (t *Transport) forgetStalls(now time.Duration) {
	for t.stallFloor > 0 && now-t.stallAt >= stallMemory {
		t.stallAt += stallMemory
		if t.stallFloor /= 2; t.stallFloor < minRTO {
			t.stallFloor = 0
		}
	}
}

func (s *txStream) sampleRTT(rtt time.Duration) {
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
func (s *txStream) congestion(newly, lost int) {
	if s.recovering && !s.una.Less(s.recoverPSN) {
		s.recovering, s.undo = false, false // the episode is over: what it lost stays lost
	}
	if lost > 0 && !s.recovering {
		if s.reoClean++; s.reoClean >= 16 {
			s.reoSteps, s.reoClean, s.reoSeen = 1, 0, 0
		}
		s.cut(lost)
		return
	}
	if lost > 0 && s.undo {
		s.undoLeft += lost
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

// cut halves the window for a loss episode of lost packets so far (or the retransmission timer's
// expiry), keeping what it was for undoSpurious.
func (s *txStream) cut(lost int) {
	if !s.undo {
		s.undo, s.undoCwnd, s.undoSsthresh, s.undoRTO, s.undoLeft = true, s.cwnd, s.ssthresh, s.rto, 0
	}
	s.undoLeft += lost
	s.ssthresh = max(s.cwnd/2, 2)
	s.cwnd = s.ssthresh
	s.recovering, s.recoverPSN = true, s.next
}

// undoSpurious counts one packet of the current loss episode acknowledged as an original (the
// loss was spurious: reordering, or a timer that fired while an acknowledgement was on its way
// or waiting to be read by a starved process). When every packet the episode counted lost has
// proved spurious, nothing was lost: the window, the threshold and the timer's backoff are put
// back, as TCP's undo does (RFC 3522, RFC 5682).
func (s *txStream) undoSpurious() {
	if !s.undo {
		return
	}
	if s.undoLeft--; s.undoLeft > 0 {
		return
	}
	s.cwnd, s.ssthresh = max(s.cwnd, s.undoCwnd), max(s.ssthresh, s.undoSsthresh)
	s.rto = min(s.rto, s.undoRTO)
	s.recovering, s.undo = false, false
}
