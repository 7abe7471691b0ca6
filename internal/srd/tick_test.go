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

// BenchmarkNewPeerFullTable is a new peer taking the place of idle ones in a full table of 65,536
// (the default MaxPeers): what each newcomer costs once the table is full.
func BenchmarkNewPeerFullTable(b *testing.B) {
	r := newTrace(b, 2, func(c *config.Device) { c.PeerIdleTimeout = -1 })
	gid := func(i int) [16]byte {
		return config.GIDFromAddr(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 4791))
	}
	max := r.tr.cfg.MaxPeers
	for i := range max {
		r.tr.slimPeer(r.tr.peerFor(gid(i)))
	}
	b.ResetTimer()
	for i := range b.N {
		if r.tr.peerFor(gid(max+i)) == nil {
			b.Fatal("no room for a newcomer among idle peers")
		}
	}
	b.StopTimer()
	if len(r.tr.peers) > max || len(r.tr.peerList) != len(r.tr.peers) {
		b.Fatalf("%d peers, %d listed, MaxPeers %d", len(r.tr.peers), len(r.tr.peerList), max)
	}
}
