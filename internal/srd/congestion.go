package srd

import "time"

// resetRTO undoes the retransmission timer's backoff: the peer is acknowledging again.
func (s *txStream) resetRTO() {
	if s.srtt > 0 {
		s.rto = min(max(s.srtt+4*s.rttvar, minRTO), maxRTO)
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
			s.reoSteps, s.reoClean = 1, 0
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
