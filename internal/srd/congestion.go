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
