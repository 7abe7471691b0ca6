package srd

import (
	"encoding/binary"
	"io"
	"math"
	"net/netip"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/seal"
)

// peer is this device's context for one other device.
type peer struct {
	gid   [16]byte
	addr  netip.AddrPort
	inc   uint32 // the peer's incarnation; 0 until heard from
	heard bool   // the peer has sent us something: a timeout means unresponsive, not unreachable
	due   bool   // in Transport.due: requests queued wait for the batch's end to be framed
	// runTick: when (cookieNow, modulo 2^16) the context was made or its current run (salt,
	// incarnation) was taken: an older cookie does not take another run (cookieTakes).
	runTick uint16

	tx txStream
	rx rxStream

	paths  []pathState
	pathRR int // path of the current data burst
	ctrlRR int // path of the last ACK or PROBE_ACK

	replay *seal.Replay // sealed datagrams seen from the peer (with a key only)
	// Address validation (admit.go). ports: the UDP source ports of the peer, other than its
	// endpoint's, proven its own; portsHeard: when a datagram of the peer was last taken. echo:
	// per path of ours, the peer's challenge to its port.
	ports      []uint16
	portsHeard time.Duration
	echo       []pathEcho
	lastTx     time.Duration // when a datagram to the peer was last begun (revalidate)
	seen       time.Duration // when the peer last sent us a datagram we took, or we queued it work
	slim       bool          // its stream buffers are given back (slim.go)
	activeAt   int           // 1 + its index in Transport.active; 0 while slim
}

// pathState is the scoreboard of one of our paths towards a peer.
type pathState struct {
	srtt     time.Duration
	ackedAt  time.Duration // send time of the latest packet on this path acknowledged
	onceAt   time.Duration // the same, of packets sent once: what reordering is measured against (sawReorder)
	failedAt time.Duration // when it was marked failed
	probeAt  time.Duration // when to probe a failed or unproven path next
	sent     uint64
	// lost counts the packets counted lost on the path, up to 2^32-1 (it stops there): a
	// uint32, so that the struct stays at 72 bytes, and a peer's four paths in their size
	// class (an idle peer's context is held to 1 KiB: TestOneQPManyPeers).
	lost      uint32
	losses    int32 // consecutive packets lost on this path
	nonce     uint32
	failed    bool
	probeSent bool
	// unproven: the path's UDP source port is not known to be proven to the peer (admit.go): it
	// carries nothing but PROBEs until the peer answers one, or acknowledges a packet it carried.
	unproven   bool
	unprovenAt time.Duration // when it was marked unproven: an acknowledgement of an older packet proves nothing
}

// usable reports whether new packets may go on the path.
func (ps *pathState) usable() bool { return !ps.failed && !ps.unproven }

// unprove takes the path out of use until it proves itself again, probing it at once.
func (ps *pathState) unprove(now time.Duration) {
	if !ps.unproven {
		ps.unproven, ps.unprovenAt, ps.probeSent = true, now, false
	}
	ps.probeAt = now
}

// NewIncarnation draws a device's incarnation: random, never 0.
func NewIncarnation(rng io.Reader) uint32 {
	var b [4]byte
	for {
		_, _ = io.ReadFull(rng, b[:])
		if v := binary.BigEndian.Uint32(b[:]); v != 0 {
			return v
		}
	}
}

// peerFor returns the context for gid, creating it (nil if MaxPeers are in use and none is idle).
func (t *Transport) peerFor(gid [16]byte) *peer {
	if p := t.peers[gid]; p != nil {
		return p
	}
	if len(t.peers) >= t.cfg.MaxPeers && !t.makeRoom(gid) {
		return nil
	}
	p := &peer{gid: gid, addr: config.AddrFromGID(gid, t.link.LocalAddr().Port()), runTick: uint16(t.cookieNow()), paths: make([]pathState, t.link.Paths()),
		seen: t.now}
	p.tx.init()
	if t.seal != nil {
		p.replay = new(seal.Replay)
	}
	t.recall(p)
	t.unprove(p)
	t.peers[gid] = p
	t.peerList = append(t.peerList, p)
	t.activate(p)
	return p
}

// resetPeer forgets everything about the peer's streams when it restarts as incarnation inc:
// partly received messages from it are dropped; requests its earlier life had any of fail with
// st (REMOTE_ABORT), the others go to the new life (resetRestart).
func (t *Transport) resetPeer(p *peer, st efaio.Status, inc uint32) {
	t.resetRx(p)
	p.inc = inc // before resetTx: the requests it sends again are for the new life
	p.rx.epoch = 0
	// Heard: its datagram is being taken, and it made a context for us by sending it, so that
	// the requests sent again go at once, not after a first contact's PROBE (hello).
	p.heard = true
	p.ports, p.echo = nil, nil     // the new life sends from ports of its own, and challenges anew
	t.resetTx(p, st, resetRestart) // the answers were for the peer's earlier life
}

// pickPath chooses the path for the next packet to p: the current one for a burst of 16
// datagrams (counted by sendSeg and sendUD: small messages share datagrams, and a burst of 16
// packets cut their datagrams at 16 frames), so that GSO/GRO-style batching survives, then the
// next healthy one; never avoid if another healthy path exists.
func (t *Transport) pickPath(p *peer, avoid int) int {
	const burst = 16
	t.revalidate(p)
	n := len(p.paths)
	if n == 1 {
		return 0
	}
	if avoid < 0 && p.tx.burst < burst && p.paths[p.pathRR].usable() {
		return p.pathRR
	}
	for i := 1; i <= n; i++ {
		c := (p.pathRR + i) % n
		if p.paths[c].usable() && c != avoid {
			p.pathRR, p.tx.burst = c, 0
			return c
		}
	}
	if avoid >= 0 && p.paths[avoid].usable() {
		return avoid // the only usable path
	}
	// Every other path has failed: use them anyway, in turn, but not one whose port the peer
	// does not know (the endpoint's path is never such a one).
	for range n {
		if p.pathRR = (p.pathRR + 1) % n; !p.paths[p.pathRR].unproven {
			break
		}
	}
	return p.pathRR
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
func (t *Transport) controlPath(p *peer) int {
	t.revalidate(p)
	n := len(p.paths)
	newest, recent := p.provenSince(t.now)
	for _, proven := range [2]bool{true, false} {
		for range n {
			p.ctrlRR = (p.ctrlRR + 1) % n
			ps := &p.paths[p.ctrlRR]
			if ps.usable() && (!proven || newest > 0 && ps.ackedAt >= recent) {
				return p.ctrlRR
			}
		}
	}
	for range n { // every path has failed: any the peer knows
		if p.ctrlRR = (p.ctrlRR + 1) % n; !p.paths[p.ctrlRR].unproven {
			break
		}
	}
	return p.ctrlRR
}

// provenSince returns when p's newest acknowledged packet was sent, and the time from which an
// acknowledged packet proves its path: within a few RTTs of the newest; (0, 0) if even the newest
// is older than that now.
func (p *peer) provenSince(now time.Duration) (newest, recent time.Duration) {
	newest = p.newestAcked()
	window := 4 * max(p.tx.srtt, minRTO)
	if now-newest > window {
		return 0, 0
	}
	return newest, newest - window
}

// carriesAck reports whether an ACK to p may ride in a datagram on path (with data, or in a
// datagram already going to p): the path carried recently acknowledged data, or no path did and
// this one has not failed — the paths controlPath rotates an ACK of its own over. Acknowledgements
// of sparse copies credit no path, so a ping-pong whose copies are on has no proven path a few
// RTTs later; without the second rule its answers would stop carrying its ACKs, each going in a
// datagram of its own after the answer.
func (t *Transport) carriesAck(p *peer, path int) bool {
	newest, recent := p.provenSince(t.now)
	ps := &p.paths[path]
	return ps.usable() && (newest == 0 || ps.ackedAt >= recent)
}

// pathLoss counts a loss against one of our paths; consecutive losses mark it failed (as long as
// another path is left), and it is probed until it answers again. Only losses that later
// acknowledgements reveal count: they show the packet, not an acknowledgement, went missing.
func (t *Transport) pathLoss(p *peer, i int, now time.Duration) {
	ps := &p.paths[i]
	ps.losses++
	if ps.lost != math.MaxUint32 {
		ps.lost++
	}
	if ps.failed || ps.losses < pathFailLoss {
		return
	}
	healthy := 0
	for j := range p.paths {
		if j != i && p.paths[j].usable() {
			healthy++
		}
	}
	if healthy > 0 {
		ps.failed, ps.failedAt, ps.probeAt, ps.probeSent = true, now, now+probeInterval, false
		t.counts.ImpairedRemoteConnEvents.Add(1)
	}
}

// PathStat is one path's scoreboard towards one peer.
type PathStat struct {
	Peer   [16]byte
	Path   int
	SRTT   time.Duration
	Sent   uint64
	Lost   uint64 // stops at 2^32-1 (pathState.lost)
	Failed bool
	Cwnd   float64 // the peer's stream's window, in packets
}

// PathStats returns every peer's path scoreboards.
func (t *Transport) PathStats() []PathStat {
	var out []PathStat
	for _, p := range t.peerList {
		for i, ps := range p.paths {
			out = append(out, PathStat{Peer: p.gid, Path: i, SRTT: ps.srtt, Sent: ps.sent, Lost: uint64(ps.lost),
				Failed: ps.failed, Cwnd: p.tx.cwnd})
		}
	}
	return out
}
