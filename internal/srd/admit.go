package srd

import (
	"crypto/sha256"
	"encoding/binary"
	"io"
	"net/netip"
	"slices"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/wire"
)

// Address validation (docs/security.md, docs/wire.md "Address validation"). A device takes a
// datagram only from a source it knows belongs to the peer the header names:
//
//   - the peer's endpoint itself (the UDP source port is the header's source port): only the
//     peer can send from the port it receives on;
//   - another UDP source port of the peer's IP that proved itself the peer's, each port on its
//     own: the device sent the peer's endpoint a CHALLENGE naming that port, with a cookie bound
//     to the endpoint and the port, and the cookie came back in a COOKIE frame from that port.
//     Only the peer reads what goes to its endpoint, and only the holder of a port sends from
//     it, so the answer shows that the port's holder is the peer. A proven port stays trusted
//     for the peer's incarnation and context, and while the peer keeps sending: after portQuiet
//     with nothing taken from the peer, its ports prove themselves again, since the peer may
//     have exited and another process bound them.
//
// A datagram from any other source — a device never validated, or a port of a known peer's IP
// not proven — gets nothing but one CHALLENGE, sent to the endpoint the header names and never
// longer than the datagram, whatever its frames say; its UD messages, which need no state and get
// no answer, are delivered. A peer context is created only by a valid COOKIE, or by the device
// itself when it sends to a peer. Cookies are the second they were issued in and a keyed hash of
// the endpoint, the port and that second, so they cost no memory: a flood from forged addresses leaves no state
// behind, and a cookie captured from one port proves nothing from another. Sealing adds
// authenticity on top of this, not instead of it: a peer context forgotten (or never made) is
// made again only through a fresh cookie, so replayed sealed datagrams from an earlier exchange
// create nothing.

// A cookie names the second it was issued in (cookieTick) and is taken for cookieLife ticks.
const (
	cookieTick = time.Second
	cookieLife = 20
)

// newSecret draws the device's cookie key.
func newSecret(rng io.Reader) (s [32]byte) {
	_, _ = io.ReadFull(rng, s[:])
	return s
}

// portQuiet is how long a peer may stay silent with its proven ports still trusted.
const portQuiet = time.Second

// cookie is the cookie for endpoint addr's source port port issued at tick (the device's clock
// in cookieTicks): the tick modulo 2^16 in the top 16 bits, then 48 bits of SHA-256 over the
// device's secret, the endpoint, the port and the whole tick, with bit 0 set (0 is no cookie).
func (t *Transport) cookie(addr netip.AddrPort, port uint16, tick int64) uint64 {
	var in [32 + 16 + 2 + 2 + 8]byte
	copy(in[:32], t.secret[:])
	a := addr.Addr().As16()
	copy(in[32:48], a[:])
	binary.BigEndian.PutUint16(in[48:], addr.Port())
	binary.BigEndian.PutUint16(in[50:], port)
	binary.BigEndian.PutUint64(in[52:], uint64(tick))
	sum := sha256.Sum256(in[:])
	return uint64(uint16(tick))<<48 | binary.BigEndian.Uint64(sum[:8])>>16 | 1
}

// cookieNow is the device's clock in cookieTicks.
func (t *Transport) cookieNow() int64 { return int64(t.now / cookieTick) }

// cookieOK reports whether c is a cookie of ours for addr's port port, issued at most cookieLife
// ticks ago, and the tick it was issued at.
func (t *Transport) cookieOK(addr netip.AddrPort, port uint16, c uint64) (int64, bool) {
	now := t.cookieNow()
	age := int64(uint16(uint64(now) - c>>48))
	return now - age, age <= cookieLife && c == t.cookie(addr, port, now-age)
}

// cookieTakes reports whether c, the first cookie of a datagram from addr's port port, makes or
// revives the context p for it (cookieOK). For a datagram sealed by another run of a peer we
// know or have forgotten (otherRun), the cookie must not be older than the peer's current run
// (p.runTick, or its memo's): a
// capture of an earlier run's datagram carries that run's cookie, and would otherwise pass for
// a restart for as long as the cookie lasts once the salts we remember no longer name it.
func (t *Transport) cookieTakes(p *peer, gid [16]byte, addr netip.AddrPort, port uint16, c uint64, otherRun bool) bool {
	tick, ok := t.cookieOK(addr, port, c)
	if !ok || !otherRun {
		return ok
	}
	var run uint16
	if p != nil {
		run = p.runTick
	} else if m, known := t.memos[gid]; known {
		run = m.runTick // (a forgotten peer's)
	} else {
		return true
	}
	now := uint16(t.cookieNow())
	return now-uint16(tick) <= now-run
}

// trusts reports whether a datagram from UDP source port port, naming the peer's endpoint port
// gidPort in its header, is the peer's own at time now.
func (p *peer) trusts(port, gidPort uint16, now time.Duration) bool {
	return port == gidPort || now-p.portsHeard < portQuiet && slices.Contains(p.ports, port)
}

// heardFrom records that a datagram from the peer's UDP source port was taken at now (proving the
// port, if it was not yet); the ports proven before a silence of portQuiet are forgotten.
func (p *peer) heardFrom(port uint16, now time.Duration) {
	if now-p.portsHeard >= portQuiet {
		p.ports = p.ports[:0]
	}
	p.portsHeard = now
	if port != p.addr.Port() && !slices.Contains(p.ports, port) && len(p.ports) < wire.MaxPorts {
		p.ports = append(p.ports, port)
	}
}

// admit decides what to do with a datagram from src that names gid in its header, when the
// device keeps no context for gid (p nil), does not trust src for it, or the datagram is sealed
// by another run of the peer than the current one (otherRun). If the datagram has a COOKIE frame
// listing src's port, with a valid cookie for gid's endpoint and src's port, it returns the
// context (made if need be; the caller records src's port as proven). Otherwise it delivers the datagram's UD
// messages (not another run's: they may be replays), takes a CHALLENGE from a source it trusts
// for p (a new run of the peer challenging us: it must get our cookie, or the two would only
// challenge each other), challenges the endpoint if anything else came, and returns nil.
func (t *Transport) admit(p *peer, gid [16]byte, src netip.AddrPort, h *wire.Header, frames []byte, n int, otherRun bool) *peer {
	addr := config.AddrFromGID(gid, t.link.LocalAddr().Port())
	f := &t.strangerFrame
	var stateful, cookieTried bool
	for rest := frames; len(rest) > 0; {
		var err error
		if rest, err = wire.NextFrame(rest, f); err != nil {
			t.counts.BadPackets.Add(1)
			return nil
		}
		// Only a datagram's first COOKIE is checked: each check costs a hash, and a
		// datagram packed with cookies would cost hundreds.
		firstCookie := f.Type == wire.TypeCookie && !cookieTried
		cookieTried = cookieTried || f.Type == wire.TypeCookie
		switch {
		case firstCookie && f.Ports.Has(src.Port()) && t.cookieTakes(p, gid, addr, src.Port(), f.Cookie, otherRun):
			if p == nil {
				if p = t.peerFor(gid); p == nil {
					t.counts.RxDrops.Add(1) // MaxPeers, none idle to give way
					return nil
				}
			}
			return p
		case f.Type == wire.TypeData && f.Data.Flags&wire.FlagUD != 0:
		case f.Type == wire.TypeChallenge:
			if p != nil && p.trusts(src.Port(), h.SrcPort, t.now) {
				p.heard = p.heard || t.challengeOpens(f.Port)
				t.onChallenge(p, f.Cookie, f.Port, false)
			}
		default:
			stateful = true
		}
	}
	s := &t.stranger
	*s = peer{gid: gid, addr: addr, inc: h.SrcInc, paths: s.paths[:0]}
	for rest := frames; len(rest) > 0 && !otherRun; {
		rest, _ = wire.NextFrame(rest, f)
		if f.Type == wire.TypeData && f.Data.Flags&wire.FlagUD != 0 {
			t.onUD(s, &f.Data)
		}
	}
	if stateful {
		t.counts.Unvalidated.Add(1)
		// Never answer with more than came, unless the datagram is sealed by a new run of a peer
		// we know (its endpoint is validated, and a RESET from it is smaller than a challenge:
		// unchallenged, it could never prove itself).
		if n >= wire.DatagramHeaderSize+challengeFrameSize || otherRun {
			s.paths = append(s.paths, pathState{})
			c := t.cookie(addr, src.Port(), t.cookieNow())
			t.commit(wire.AppendChallenge(t.room(s, 0, challengeFrameSize), c, src.Port()))
			t.txq.cur = nil // no other frame joins a stranger's datagram
		}
	}
	return nil
}

const challengeFrameSize = wire.FrameHeaderSize + wire.ChallengeSize

// challengeOpens reports whether a peer's challenge to our UDP source port port, answering a first
// contact's PROBE (hello), lets our stream go: one to our endpoint's port does, the stream's first
// datagrams carrying its cookie; one to another path's port does not, since the peer takes nothing
// from our endpoint's port without its cookie, and the stream waits for the PROBE_ACK of the PROBE
// that echoes it on that path.
func (t *Transport) challengeOpens(port uint16) bool { return port == t.pathPort(0) }

// onChallenge takes a peer's challenge to our UDP source port port: a COOKIE frame with the
// cookie, naming the port, rides in the next echoBudget datagrams to the peer on the paths that
// send from it (on every path, if none does: a relay between us gives all our paths one port
// of its own), or until a packet sent there since is acknowledged. A path whose port is not our
// endpoint's carries it in a PROBE at once, and nothing else until the peer answers the PROBE.
// On a new cookie for one of our ports, what the paths sending from it sent that is not yet
// acknowledged goes again, at the end of the batch (pumpLater): the peer dropped it. Once per
// cookie (the peer's cookies change each second): the peer challenges every datagram that reaches
// it from the port before the cookie does, and resending the whole flight for each of those
// challenges was a storm (thousands of packets in a short run). A challenge to a port not ours is
// only echoed, on the paths not echoing one of ours: it may come of a datagram another process of
// our host sent the peer from a port of its own, naming us, and resending for it would let that
// process make us send our flight again at will. A challenge in a datagram not taken (!taken:
// sealed by another run of the peer, or a capture of one replayed) is only echoed, nothing resent
// and no path unproven: a replay could do either at will, and a new run, once taken, gets our
// requests again from the start (resetPeer). An ACK goes too if we receive the peer's stream: the
// peer may have dropped our ACKs as well.
func (t *Transport) onChallenge(p *peer, cookie uint64, port uint16, taken bool) {
	if len(p.echo) != len(p.paths) {
		p.echo = make([]pathEcho, len(p.paths))
	}
	all := !slices.Contains(t.ports, port)
	resend := false
	for i := range p.echo {
		e := &p.echo[i]
		if !all && t.pathPort(i) != port || all && e.left > 0 && e.port == t.pathPort(i) {
			continue // (a port not ours never displaces the echo of one that is)
		}
		if e.cookie != cookie && !all && taken {
			e.resend = true
			resend = true
		}
		e.cookie, e.port, e.since, e.left = cookie, port, t.now, echoBudget
		if !all && port != t.pathPort(0) && taken {
			// A path of its own: it carries nothing more until the peer has taken the cookie
			// and answered a PROBE, which carries the cookie now.
			ps := &p.paths[i]
			ps.unproven = true
			t.probe(p, i, t.now)
		}
	}
	if resend {
		s := &p.tx
		for psn := s.una; psn != s.next; psn++ {
			e := s.slot(psn)
			if e.acked || e.lost || e.msg == nil || int(e.path) >= len(p.echo) || !p.echo[e.path].resend {
				continue
			}
			e.lost, e.gap = true, 0
			s.inflight--
			s.retx = append(s.retx, psn)
		}
		for i := range p.echo {
			p.echo[i].resend = false
		}
	}
	if p.rx.started {
		t.oweAck(p, t.now)
	}
	t.pumpLater(p) // (once the batch is handled, as input's other pumps: inputBatch)
}

// unprove marks every path of ours to p whose port is not our endpoint's as not proven to p: a
// new peer knows none of them, and a peer that took nothing from us for portQuiet has forgotten
// them. They carry PROBEs, at the device's next tick, until the peer's challenge to each has been
// echoed and the PROBE answered.
func (t *Transport) unprove(p *peer) {
	for i := range p.paths {
		if t.pathPort(i) != t.pathPort(0) {
			p.paths[i].unprove(t.now)
		}
	}
	p.lastTx = t.now
}

// revalidate unproves p's paths when nothing went to p for portQuiet: p forgets our ports then.
func (t *Transport) revalidate(p *peer) {
	if t.now-p.lastTx >= portQuiet {
		t.unprove(p)
	}
}

// pathPort is the UDP source port our path i sends from: a link without ports of its own for its
// paths sends every path from its endpoint's (link.PathPorter).
func (t *Transport) pathPort(i int) uint16 {
	if i < len(t.ports) {
		return t.ports[i]
	}
	return t.ports[0]
}

// pathEcho is a peer's challenge to the UDP source port of one of our paths, echoed in COOKIE
// frames on that path.
type pathEcho struct {
	cookie uint64
	since  time.Duration // when the challenge came
	port   uint16        // the port it named
	left   uint8         // datagrams still to carry it
	resend bool          // (onChallenge's scratch)
}

// echoBudget is how many datagrams on a path carry a peer's cookie after its challenge, at most:
// the peer challenges again any datagram from the port that comes without one.
const echoBudget = 4

// echoOn returns the cookie to echo in a new datagram to p on path, and the port it names; a
// cookie of 0 means none. It counts the datagram against the echo's budget.
func (p *peer) echoOn(path int) (uint64, uint16) {
	if path >= len(p.echo) {
		return 0, 0
	}
	e := &p.echo[path]
	if e.left == 0 {
		return 0, 0
	}
	e.left--
	return e.cookie, e.port
}

// echoed ends the echo on the path of packet e, which the peer acknowledged, if the packet left
// after the peer's challenge: the peer takes datagrams from that port.
func (p *peer) echoed(e *sentPkt) {
	if int(e.path) < len(p.echo) && e.at >= p.echo[e.path].since {
		p.echo[e.path].left = 0
	}
}
