package srd

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
)

// BenchmarkTickManyIdlePeers is one timer tick of a transport that knows 10,000 slim (idle)
// peers while one stream is busy: what the engine pays every PollMin under its lock.
func BenchmarkTickManyIdlePeers(b *testing.B) {
	r := newTrace(b, 2, func(c *config.Device) { c.PeerIdleTimeout = time.Hour })
	r.meet()
	r.tr.Use(r.q, r.f.Now())
	for i := range 10000 {
		gid := config.GIDFromAddr(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 4791))
		r.tr.slimPeer(r.tr.peerFor(gid))
	}
	r.post(1, efaio.OpSend, 100) // one busy stream: the peer never acknowledges
	b.ResetTimer()
	for range b.N {
		r.tr.Use(r.q, r.f.Now())
		r.tr.Tick()
	}
}
