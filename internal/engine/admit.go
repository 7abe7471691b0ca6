package engine

import (
	"crypto/sha256"
	"encoding/binary"
	"io"
	"net/netip"
	"time"

	"github.com/softefa/softefa/internal/wire"
)

// Address validation. A device keeps state for a peer only once it knows the peer receives at
// the address it claims: it contacted the peer itself, or the peer echoed a cookie. Until then a
// datagram from the peer is answered with one CHALLENGE frame carrying a cookie (no larger than
// the datagram, so no amplification), and nothing else happens but the delivery of UD messages,
// With a key, a datagram that authenticates is validation enough.
// which need no state and get no answer. Cookies are a keyed hash of the peer's address and a
// 10-second time bucket, so they cost the device no memory: a flood from forged addresses leaves
// no state behind.

const cookiePeriod = 10 * time.Second

// newSecret draws the device's cookie key.
func newSecret(rng io.Reader) (s [32]byte) {
	_, _ = io.ReadFull(rng, s[:])
	return s
}

// cookie is the cookie for addr in the given time bucket.
func (d *Device) cookie(addr netip.AddrPort, bucket int64) uint64 {
	var in [32 + 16 + 2 + 8]byte
	copy(in[:32], d.secret[:])
	a := addr.Addr().As16()
	copy(in[32:48], a[:])
	binary.BigEndian.PutUint16(in[48:], addr.Port())
	binary.BigEndian.PutUint64(in[50:], uint64(bucket))
	sum := sha256.Sum256(in[:])
	return binary.BigEndian.Uint64(sum[:8]) | 1 // never 0: 0 means "no cookie"
}

func (d *Device) cookieOK(addr netip.AddrPort, c uint64) bool {
	b := int64(d.clock() / cookiePeriod)
	return c == d.cookie(addr, b) || c == d.cookie(addr, b-1)
}

// admit decides what to do with a datagram from a device this one keeps no state for. It returns
// the new peer context if the datagram echoes a valid cookie; otherwise it delivers the
// datagram's UD messages, challenges the sender when anything else came, and returns nil.
func (d *Device) admit(gid [16]byte, h *wire.Header, frames []byte, n int, sealed bool) *peer {
	addr := AddrFromGID(gid, d.link.LocalAddr().Port())
	if sealed { // only holders of the key can seal: authentication is validation
		p := d.peerFor(gid)
		if p == nil {
			d.counts.RxDrops.Add(1)
		}
		return p
	}
	var f wire.Frame
	var stateful bool
	for rest := frames; len(rest) > 0; {
		var err error
		if rest, err = wire.NextFrame(rest, &f); err != nil {
			d.counts.BadPackets.Add(1)
			return nil
		}
		switch {
		case f.Type == wire.TypeCookie && d.cookieOK(addr, f.Cookie):
			p := d.peerFor(gid)
			if p == nil {
				d.counts.RxDrops.Add(1) // MaxPeers
			}
			return p
		case f.Type == wire.TypeData && f.Data.Flags&wire.FlagUD != 0:
		default:
			stateful = true
		}
	}
	s := &d.stranger
	*s = peer{gid: gid, addr: addr, inc: h.SrcInc, paths: s.paths[:0]}
	for rest := frames; len(rest) > 0; {
		rest, _ = wire.NextFrame(rest, &f)
		if f.Type == wire.TypeData && f.Data.Flags&wire.FlagUD != 0 {
			d.onUD(s, &f.Data)
		}
	}
	if stateful {
		d.counts.Unvalidated.Add(1)
		if n >= wire.DatagramHeaderSize+cookieFrameSize { // never answer with more than came
			s.paths = append(s.paths, pathState{})
			d.commit(wire.AppendCookie(d.room(s, 0, cookieFrameSize), d.cookie(addr, int64(d.clock()/cookiePeriod)), false))
			d.txq.cur = nil // no other frame joins a stranger's datagram
		}
	}
	return nil
}

// onChallenge takes a peer's cookie: it rides in every datagram to the peer until the peer
// answers, and what the peer dropped before goes again at once — once per cookie: the peer
// challenges every datagram that reaches it before the cookie does, and resending the whole
// flight for each of those challenges was a storm (thousands of packets in a short run).
func (d *Device) onChallenge(p *peer, cookie uint64, now time.Duration) {
	if p.cookie == cookie {
		return
	}
	p.cookie, p.confirmed = cookie, false
	s := &p.tx
	for psn := s.una; psn != s.next; psn++ {
		if e := s.slot(psn); !e.acked && !e.lost && e.msg != nil {
			e.lost = true
			s.inflight--
			s.retx = append(s.retx, psn)
		}
	}
	d.pump(p)
}
