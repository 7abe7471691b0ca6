package memlink_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softefa/softefa/link"
	"github.com/softefa/softefa/link/memlink"
)

// A simulated fabric delivers nothing before its clock reaches a datagram's time, delivers in
// time order (send order at equal times), and its clock moves only in Advance.
func TestSimDeliversInVirtualTimeOrder(t *testing.T) {
	f := memlink.NewSim(1)
	f.SetPath(0, memlink.Impairment{Delay: 300 * time.Microsecond})
	f.SetPath(1, memlink.Impairment{Delay: 100 * time.Microsecond})
	a := f.Listen(netip.MustParseAddrPort("10.0.0.1:1"), 2)
	b := memlink.Polled{Node: f.Listen(netip.MustParseAddrPort("10.0.0.2:1"), 2)}
	send := func(path int, tag byte) {
		if err := a.Send([]link.Packet{{Buf: []byte{tag}, N: 1, Addr: b.LocalAddr(), Path: path}}); err != nil {
			t.Fatal(err)
		}
	}
	send(0, 'x') // due at 300 µs
	send(1, 'y') // due at 100 µs
	send(1, 'z') // also at 100 µs, after y
	pkts := []link.Packet{{Buf: make([]byte, 8)}, {Buf: make([]byte, 8)}, {Buf: make([]byte, 8)}}
	recv := func() string {
		n, err := b.TryReceive(pkts)
		if err != nil {
			t.Fatal(err)
		}
		s := ""
		for _, p := range pkts[:n] {
			s += string(p.Buf[:p.N])
		}
		return s
	}
	if got := recv(); got != "" || f.Now() != 0 || f.Pending() != 3 {
		t.Fatalf("before Advance: received %q, now %v, pending %d", got, f.Now(), f.Pending())
	}
	if now := f.Advance(50 * time.Microsecond); now != 50*time.Microsecond || recv() != "" {
		t.Fatalf("a step short of the first delivery: now %v", now)
	}
	if now := f.Advance(time.Second); now != 100*time.Microsecond {
		t.Fatalf("Advance went to %v, not to the next delivery at 100µs", now)
	}
	if got := recv(); got != "yz" {
		t.Fatalf("at 100µs received %q, want yz", got)
	}
	if now := f.Advance(time.Second); now != 300*time.Microsecond || recv() != "x" || f.Pending() != 0 {
		t.Fatalf("at %v: pending %d", now, f.Pending())
	}
	if now := f.Advance(time.Millisecond); now != 1300*time.Microsecond {
		t.Fatalf("an idle Advance went to %v", now)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.TryReceive(pkts); err != link.ErrClosed {
		t.Fatalf("TryReceive after Close: %v", err)
	}
}
