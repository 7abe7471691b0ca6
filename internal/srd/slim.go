package srd

import "time"

// Idle peers are slimmed (docs/architecture.md, "Memory per peer"): a peer with nothing
// outstanding either way for slimAfter gives its stream buffers back — the transmit ring and
// request table, the receive window when nothing beyond the cumulative point has arrived, the
// empty queues — and keeps what the exchange goes on with: incarnation, epochs and PSNs, the
// round-trip and window estimates, the path scoreboards, the peer's validated ports. The buffers
// come back from small free lists with the next message, so a busy exchange allocates nothing.
// Until every idle peer is slim the transport asks for its timer (Lingering): a few ticks after
// the last traffic, then none.
const (
	slimAfter = 250 * time.Millisecond
	poolMax   = 64 // rings and windows kept for reuse
	ringStart = 64 // slots of a new transmit ring
)

// txReady gives p's stream its ring and request table before a message enters it.
func (t *Transport) txReady(p *peer) {
	s := &p.tx
	if s.ring == nil {
		if n := len(t.rings); n > 0 {
			s.ring, t.rings = t.rings[n-1], t.rings[:n-1]
		} else {
			s.ring = make([]sentPkt, ringStart)
		}
	}
	if s.reqs == nil {
		s.reqs = new(reqTable)
	}
	p.slim = false
	t.activate(p)
}

// rxReady gives p's receive stream its window before a DATA frame is looked up in it.
func (t *Transport) rxReady(p *peer) {
	r := &p.rx
	if r.seen == nil {
		if n := len(t.windows); n > 0 {
			r.seen, t.windows = t.windows[n-1], t.windows[:n-1]
		} else {
			r.seen = make(window, rxWindow/64)
		}
	}
	p.slim = false
	t.activate(p)
}

// activate lists p among the active peers, if it is not listed yet.
func (t *Transport) activate(p *peer) {
	if p.activeAt == 0 {
		t.active = append(t.active, p)
		p.activeAt = len(t.active)
	}
}

// deactivate takes p off the list of active peers, if it is on it.
func (t *Transport) deactivate(p *peer) {
	if p.activeAt == 0 {
		return
	}
	i, last := p.activeAt-1, len(t.active)-1
	t.active[i] = t.active[last]
	t.active[i].activeAt = i + 1
	t.active[last] = nil
	t.active = t.active[:last]
	p.activeAt = 0
}

// slimIdle slims the peers idle for slimAfter and reports whether any idle peer is left to slim
// later. Called by the timer (transportTick).
func (t *Transport) slimIdle(now time.Duration) (later bool) {
	for i := len(t.active) - 1; i >= 0; i-- { // (slimPeer moves the last into i: seen already)
		p := t.active[i]
		switch {
		case (len(p.rx.in) > 0 || p.rx.gap()) && t.cfg.PeerIdleTimeout > 0:
			later = true // messages in part, a gap: the timer must run for expirePeers to end them
		case p.slim || !p.idle():
		case now-p.seen >= slimAfter:
			t.slimPeer(p)
		default:
			later = true
		}
	}
	return later
}

// slimPeer gives idle p's buffers back.
func (t *Transport) slimPeer(p *peer) {
	s, r := &p.tx, &p.rx
	if len(s.ring) == ringStart && len(t.rings) < poolMax {
		clear(s.ring) // (idle: no slot is in use)
		t.rings = append(t.rings, s.ring)
	}
	s.ring, s.reqs, s.queue, s.retx, s.waiting = nil, nil, nil, nil, nil
	if r.seen != nil && (!r.started || r.highest.Less(r.cum)) {
		// Nothing beyond the cumulative point arrived: every bit is clear (window).
		if len(t.windows) < poolMax {
			t.windows = append(t.windows, r.seen)
		}
		r.seen = nil
	}
	r.in = nil
	p.slim = true // (a window with bits set stays: the next message keeps it)
	t.deactivate(p)
}

// Lingering reports whether idle peers are waiting to be slimmed: the device's timer should tick
// (at its slowest) until they are.
func (t *Transport) Lingering() bool { return t.linger }
