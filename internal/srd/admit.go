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
//   - one of the source ports the peer listed in a COOKIE frame whose cookie proved that it
//     receives at its endpoint.
//
// A datagram from any other source — a device never validated, or another port of a known
// peer's IP — gets nothing but one CHALLENGE, sent to the endpoint the header names and never
// longer than the datagram, whatever its frames say; its UD messages, which need no state and
// get no answer, are delivered. A peer context is created only by a valid COOKIE, or by the
// device itself when it sends to a peer; then it challenges the peer in its own datagrams until
// the peer's COOKIE lists its ports. Cookies are a keyed hash of the endpoint and a 10-second
// time bucket, so they cost no memory: a flood from forged addresses leaves no state behind.
// Sealing adds authenticity on top of this, not instead of it: a peer context forgotten (or
// never made) is made again only through a fresh cookie, so replayed sealed datagrams from an
// earlier exchange create nothing.

const cookiePeriod = 10 * time.Second

// newSecret draws the device's cookie key.
func newSecret(rng io.Reader) (s [32]byte) {
	_, _ = io.ReadFull(rng, s[:])
	return s
}

// cookie is the cookie for endpoint addr in the given time bucket.
func (t *Transport) cookie(addr netip.AddrPort, bucket int64) uint64 {
	var in [32 + 16 + 2 + 8]byte
	copy(in[:32], t.secret[:])
	a := addr.Addr().As16()
	copy(in[32:48], a[:])
	binary.BigEndian.PutUint16(in[48:], addr.Port())
	binary.BigEndian.PutUint64(in[50:], uint64(bucket))
	sum := sha256.Sum256(in[:])
	return binary.BigEndian.Uint64(sum[:8]) | 1 // never 0: 0 means "no cookie"
}

func (t *Transport) cookieOK(addr netip.AddrPort, c uint64) bool {
	b := int64(t.now / cookiePeriod)
	return c == t.cookie(addr, b) || c == t.cookie(addr, b-1)
}

// challengeFor is the cookie this device challenges p with now (cached per bucket).
func (t *Transport) challengeFor(p *peer) uint64 {
	if b := int64(t.now / cookiePeriod); p.myCookie == 0 || p.myBucket != b {
		p.myCookie, p.myBucket = t.cookie(p.addr, b), b
	}
	return p.myCookie
}

// trusts reports whether a datagram from UDP source port port, naming the peer's endpoint port
// gidPort in its header, is the peer's own.
func (p *peer) trusts(port, gidPort uint16) bool {
	return port == gidPort || slices.Contains(p.ports, port)
}

// admit decides what to do with a datagram from src that names gid in its header, when the
// device keeps no context for gid (p nil), does not trust src for it, or the datagram is sealed
// by another run of the peer than the current one (otherRun). If the datagram has a COOKIE frame
// with a valid cookie for gid's endpoint, listing src's port, it returns the context (made if
// need be, with the listed ports trusted from now on). Otherwise it delivers the datagram's UD
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
		// Only a datagram's first COOKIE is checked: each check costs two hashes, and a
		// datagram packed with cookies would cost hundreds.
		firstCookie := f.Type == wire.TypeCookie && !cookieTried
		cookieTried = cookieTried || f.Type == wire.TypeCookie
		switch {
		case firstCookie && f.Ports.Has(src.Port()) && t.cookieOK(addr, f.Cookie):
			if p == nil {
				if p = t.peerFor(gid); p == nil {
					t.counts.RxDrops.Add(1) // MaxPeers, none idle to give way
					return nil
				}
			}
			p.ports = p.ports[:0]
			for i := range f.Ports.Len() {
				p.ports = append(p.ports, f.Ports.At(i))
			}
			return p
		case f.Type == wire.TypeData && f.Data.Flags&wire.FlagUD != 0:
		case f.Type == wire.TypeChallenge:
			if p != nil && p.trusts(src.Port(), h.SrcPort) {
				t.onChallenge(p, f.Cookie)
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
			t.commit(wire.AppendChallenge(t.room(s, 0, challengeFrameSize), t.cookie(addr, int64(t.now/cookiePeriod))))
			t.txq.cur = nil // no other frame joins a stranger's datagram
		}
	}
	return nil
}

const challengeFrameSize = wire.FrameHeaderSize + wire.CookieSize

// onChallenge takes a peer's cookie: a COOKIE frame with it and our source ports rides in every
// datagram to the peer until the peer answers without challenging us, and what the peer dropped
// before goes again at once — once per cookie: the peer challenges every datagram that reaches it
// before the cookie does, and resending the whole flight for each of those challenges was a
// storm (thousands of packets in a short run). An ACK goes too if we receive the peer's stream:
// the peer may have dropped our ACKs as well.
func (t *Transport) onChallenge(p *peer, cookie uint64) {
	p.echo = true
	if p.cookie == cookie {
		return
	}
	p.cookie = cookie
	s := &p.tx
	for psn := s.una; psn != s.next; psn++ {
		if e := s.slot(psn); !e.acked && !e.lost && e.msg != nil {
			e.lost = true
			s.inflight--
			s.retx = append(s.retx, psn)
		}
	}
	if p.rx.started {
		t.oweAck(p, t.now)
	}
	t.pump(p)
}
