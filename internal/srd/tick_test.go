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
	r.tr.Use(r.q)
	for i := range 10000 {
		gid := config.GIDFromAddr(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 4791))
		r.tr.slimPeer(r.tr.peerFor(gid))
	}
	r.post(1, efaio.OpSend, 100) // one busy stream: the peer never acknowledges
	b.ResetTimer()
	for range b.N {
		r.tr.Tick(r.f.Now())
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

// wire.md "Forgotten peers": a peer that comes back to a full table finds its memo, even when
// making room for it forgets another peer into a full memo table (which then lets one memo go,
// any but the newcomer's). The map's order picks the memo that goes, so the case runs 40 times.
func TestComebackKeepsItsMemo(t *testing.T) {
	gid := func(i byte) [16]byte {
		return config.GIDFromAddr(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 9, 0, i}), 4791))
	}
	n, x, a, b := gid(1), gid(2), gid(3), gid(4)
	for range 40 {
		r := newTrace(t, 2, func(c *config.Device) { c.MaxPeers, c.PeerIdleTimeout = 2, -1 })
		r.tr.peerFor(n).tx.epoch = 7 // what its memo will keep
		r.tr.peerFor(x)
		r.tr.peerFor(a) // n goes (listed first), to a memo
		r.tr.peerFor(b) // x goes: the memo table is full
		if len(r.tr.memos) != 2 || r.tr.memos[n].txEpoch != 7 {
			t.Fatalf("memos %v, want n's (epoch 7) and x's", r.tr.memos)
		}
		if p := r.tr.peerFor(n); p.tx.epoch != 8 { // a goes, to a memo: one of n's and x's must go
			t.Fatalf("n came back at epoch %d, want 8: its memo was dropped to make room for another", p.tx.epoch)
		}
	}
}
