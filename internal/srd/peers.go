package srd

import (
	"cmp"
	"slices"
	"time"

	"github.com/softefa/softefa/internal/wire"
)

// Peer contexts are bounded (config.Device.MaxPeers) and expire (PeerIdleTimeout): a peer with
// nothing outstanding either way is forgotten after its idle time, or sooner when a new peer
// needs the room (those idle longest go, makeRoom); a peer with anything outstanding is never given up.
// What a forgotten peer leaves is a memo, a few dozen bytes, so that the two devices go on with
// their packet streams where they were when it comes back (docs/wire.md, "Forgotten peers"); the
// memos are bounded by MaxPeers too.

// memo is what a forgotten peer leaves behind.
type memo struct {
	inc              uint32     // the peer's incarnation
	txEpoch, rxEpoch wire.Epoch // our stream's epoch and the peer's
	rxCum            wire.PSN   // the peer's stream: every PSN below has arrived
	rxStarted        bool
	runTick          uint16 // the peer's runTick (cookieTakes)
	salt             uint32 // sealed datagrams: the peer's salt, its highest counter, its old salts
	top              uint64
	old              [4]uint32
}

// idle reports whether nothing is outstanding between us and p: no message to or from it in
// flight or queued, no answer awaited, no acknowledgement owed.
func (p *peer) idle() bool {
	return !p.tx.busy() && len(p.rx.in) == 0 && !p.rx.ackDue && !p.rx.gap()
}

// gap reports whether PSNs beyond the cumulative point have arrived. A memo keeps only the
// cumulative point: a peer forgotten with a gap would take those PSNs again when they came again
// (a second completion), or wait for ever for those whose sender saw them acknowledged.
func (r *rxStream) gap() bool { return r.started && !r.highest.Less(r.cum) }

// dropGap gives up p's stream when it has a gap and p has been quiet past twice its transport
// timeout: the sender has most likely moved its stream to a new epoch, or is gone; if it is only
// cut off from us (its stream kept alive by our traffic to it), what it sends in the old epoch is
// answered as stale, and our ACK's rx epoch moves it past ours (docs/wire.md, "Forgotten peers").
// Either way no PSN is taken twice and none is waited for in vain.
func (t *Transport) dropGap(p *peer) {
	epoch := p.rx.epoch + 1
	t.resetRx(p)
	p.rx.started, p.rx.epoch = true, epoch
}

// forget drops idle peer p's context, keeping its memo. The caller takes p out of peerList.
// keep is a peer whose memo must stay (the newcomer being made room for, about to recall it).
func (t *Transport) forget(p *peer, keep [16]byte) {
	if len(t.memos) >= t.cfg.MaxPeers {
		for k := range t.memos { // full: any one goes (the map's order is as good as any)
			if k != keep {
				delete(t.memos, k)
				break
			}
		}
	}
	var salt uint32
	var top uint64
	var old [4]uint32
	if p.replay != nil {
		salt, top, old = p.replay.State()
	}
	t.memos[p.gid] = memo{inc: p.inc, txEpoch: p.tx.epoch, rxEpoch: p.rx.epoch, rxCum: p.rx.cum,
		rxStarted: p.rx.started, salt: salt, top: top, old: old, runTick: p.runTick}
	delete(t.peers, p.gid)
	t.deactivate(p)
	if t.txq != nil && t.txq.cur == p {
		t.txq.cur = nil
	}
	t.counts.PeersForgotten.Add(1)
}

// recall gives new context p what its memo kept, if it has one: the peer's incarnation, the
// peer's stream where it was, its sealing state (everything up to the highest counter seen
// counts as seen: a replay of the earlier exchange is refused), and a new epoch for ours, which
// the peer takes as a new stream.
func (t *Transport) recall(p *peer) {
	m, ok := t.memos[p.gid]
	if !ok {
		return
	}
	delete(t.memos, p.gid)
	p.inc, p.runTick = m.inc, m.runTick
	p.tx.epoch = m.txEpoch + 1
	if m.rxStarted {
		t.resetRx(p)
		r := &p.rx
		r.started, r.epoch, r.cum, r.highest = true, m.rxEpoch, m.rxCum, m.rxCum-1
	}
	if m.salt != 0 && p.replay != nil {
		p.replay.Resume(m.salt, m.top, m.old)
	}
}

// makeRoom forgets the peers idle longest, to make room for newcomer; false if every peer has
// something outstanding. One sweep forgets a sixty-fourth of the table, but no more than half
// the idle peers (at least one), so that newcomers to a full table cost one sweep per
// MaxPeers/64 of them, not a walk of the whole table each, while a table of busy peers with a few
// idle ones does not lose them all to one newcomer.
func (t *Transport) makeRoom(newcomer [16]byte) bool {
	var idle []*peer
	for _, p := range t.peerList {
		if p.idle() {
			idle = append(idle, p)
		}
	}
	if len(idle) == 0 {
		return false
	}
	if n := max(1, min(t.cfg.MaxPeers/64, len(idle)/2)); len(idle) > n {
		slices.SortStableFunc(idle, func(a, b *peer) int { return cmp.Compare(a.seen, b.seen) })
		idle = idle[:n]
	}
	for _, p := range idle {
		t.forget(p, newcomer)
	}
	keep := t.peerList[:0]
	for _, p := range t.peerList {
		if t.peers[p.gid] == p {
			keep = append(keep, p)
		}
	}
	clear(t.peerList[len(keep):])
	t.peerList = keep
	return true
}

// expirePeers forgets the peers idle for longer than PeerIdleTimeout; it looks at most once a
// second (it runs on the transport's tick, which runs only while something is outstanding).
func (t *Transport) expirePeers(now time.Duration) {
	if t.cfg.PeerIdleTimeout <= 0 || now < t.nextExpiry {
		return
	}
	t.nextExpiry = now + time.Second
	keep := t.peerList[:0]
	// A peer quiet this long in the middle of its messages has given them up: a sender's
	// stream moves to a new epoch after its transport timeout, and the old one's segments are
	// dropped as stale.
	quiet := max(t.cfg.PeerIdleTimeout, 2*t.cfg.TransportTimeout)
	for _, p := range t.peerList {
		if now-p.seen > quiet && len(p.rx.in) > 0 {
			t.counts.RxDrops.Add(uint64(len(p.rx.in)))
			t.abortInbound(p)
		}
		if now-p.seen > quiet && p.rx.gap() {
			t.dropGap(p)
		}
		if now-p.seen > t.cfg.PeerIdleTimeout && p.idle() {
			t.forget(p, [16]byte{})
			continue
		}
		keep = append(keep, p)
	}
	clear(t.peerList[len(keep):])
	t.peerList = keep
}
