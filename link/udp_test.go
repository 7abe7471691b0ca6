package link

import (
	"bytes"
	"net/netip"
	"runtime"
	"testing"
	"time"
)

// Datagrams of mixed sizes, sent in runs that GSO can take and received through GRO, arrive
// whole, in order, from the right address, with offload and without.
func TestUDPBatches(t *testing.T) {
	for _, off := range []bool{true, false} {
		lo := netip.MustParseAddrPort("127.0.0.1:0")
		o := UDPOptions{NoOffload: !off}
		a, err := ListenUDPOptions(lo, 3, o)
		if err != nil {
			t.Fatal(err)
		}
		b, err := ListenUDPOptions(lo, 1, o)
		if err != nil {
			t.Fatal(err)
		}
		sizes := []int{1200, 1200, 1200, 700, 1200, 1200, 5, 9000, 1200, 1200, 1200}
		var out []Packet
		for i, n := range sizes {
			buf := bytes.Repeat([]byte{byte(i)}, n)
			out = append(out, Packet{Buf: buf, N: n, Addr: b.LocalAddr(), Path: i / 4})
		}
		if err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		in := make([]Packet, 4)
		for i := range in {
			in[i].Buf = make([]byte, 9100)
		}
		got := 0
		deadline := time.Now().Add(5 * time.Second)
		for got < len(sizes) && time.Now().Before(deadline) {
			n, err := b.Receive(in)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range in[:n] {
				if p.N != sizes[got] || p.Buf[0] != byte(got) || p.Buf[p.N-1] != byte(got) {
					t.Fatalf("offload %v: datagram %d: %d bytes of %d, want %d of %d", off, got, p.N, p.Buf[0], sizes[got], got)
				}
				if p.Addr.Addr() != a.LocalAddr().Addr() {
					t.Fatalf("from %v", p.Addr)
				}
				got++
			}
		}
		if got != len(sizes) {
			t.Fatalf("offload %v: %d of %d datagrams", off, got, len(sizes))
		}
		if n, err := b.TryReceive(in); n != 0 || err != nil {
			t.Fatalf("TryReceive on an empty socket: %d, %v", n, err)
		}
		a.Close()
		b.Close()
		if _, err := b.Receive(in); err != ErrClosed {
			t.Fatalf("Receive after Close: %v", err)
		}
	}
}

// A busy poller reads beside a Receive parked in the network poller: it never waits for it (a
// parked Receive holds the socket's read lock), and each datagram reaches exactly one of them.
func TestBusyPollerBesideReceive(t *testing.T) {
	a, b := loopbackPair(t, 1)
	newPkts := func() []Packet {
		p := make([]Packet, 8)
		for i := range p {
			p[i].Buf = make([]byte, 2048)
		}
		return p
	}
	got := make(chan byte, 64)
	go func() {
		in := newPkts()
		for {
			n, err := b.Receive(in)
			if err != nil {
				close(got)
				return
			}
			for _, p := range in[:n] {
				got <- p.Buf[0]
			}
		}
	}()
	poller := b.NewPoller()
	in := newPkts()
	var polled []byte
	// Thousands of empty polls while the receiver parks: each returns at once.
	for range 5000 {
		n, err := poller.TryReceive(in)
		if err != nil || n != 0 {
			t.Fatalf("an empty poll: %d, %v", n, err)
		}
		runtime.Gosched()
	}
	const count = 40
	for i := range count {
		if err := a.Send([]Packet{{Buf: []byte{byte(i)}, N: 1, Addr: b.LocalAddr()}}); err != nil {
			t.Fatal(err)
		}
		n, err := poller.TryReceive(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range in[:n] {
			polled = append(polled, p.Buf[0])
		}
	}
	seen := make(map[byte]int)
	for _, v := range polled {
		seen[v]++
	}
	for len(seen) < count {
		select {
		case v := <-got:
			seen[v]++
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d datagrams arrived", len(seen), count)
		}
	}
	for v, k := range seen {
		if k != 1 || int(v) >= count {
			t.Fatalf("datagram %d arrived %d times", v, k)
		}
	}
	t.Logf("%d of %d datagrams taken by the poller", len(polled), count)
}

// Senders do not share scratch: several goroutines send at once, every datagram arrives intact
// (run with -race), and a send allocates nothing once each sender's scratch exists.
func TestUDPConcurrentSenders(t *testing.T) {
	a, b := loopbackPair(t, 2)
	const senders, each = 4, 200
	done := make(chan error, senders)
	for s := range senders {
		go func() {
			out := make([]Packet, 2)
			for i := range out {
				out[i] = Packet{Buf: make([]byte, 64), N: 64, Addr: b.LocalAddr(), Path: i}
			}
			for i := 0; i < each; i += len(out) {
				for j := range out {
					out[j].Buf[0], out[j].Buf[63] = byte(s), byte(i+j)
				}
				if err := a.Send(out); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	in := make([]Packet, 32)
	for i := range in {
		in[i].Buf = make([]byte, 128)
	}
	var got [senders][each]bool
	for n := 0; n < senders*each; {
		k, err := b.Receive(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range in[:k] {
			s, i := int(p.Buf[0]), int(p.Buf[63])
			if p.N != 64 || s >= senders || i >= each || got[s][i] {
				t.Fatalf("datagram of %d bytes, sender %d, number %d: not one that was sent, or twice", p.N, s, i)
			}
			got[s][i] = true
			n++
		}
	}
	for range senders {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	out := []Packet{{Buf: make([]byte, 64), N: 64, Addr: b.LocalAddr()}}
	if n := testing.AllocsPerRun(100, func() { _ = a.Send(out) }); n != 0 {
		t.Errorf("Send: %.1f allocations per call, want 0", n)
	}
}

// loopbackPair binds a (with paths paths) and b (one path) on 127.0.0.1; both close with the test.
func loopbackPair(t *testing.T, paths int) (a, b *UDP) {
	t.Helper()
	lo := netip.MustParseAddrPort("127.0.0.1:0")
	a, err := ListenUDP(lo, paths)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if b, err = ListenUDP(lo, 1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return a, b
}

// A poller tells whether its last read may have left datagrams behind (Backlogger), with GRO and
// without: true after every read that filled its batch and left some (in a GRO run it holds, or
// in the socket), false after a read that found nothing. The receive loop reads on after its
// look while it says so.
func TestPollerTellsItsBacklog(t *testing.T) {
	for _, o := range []UDPOptions{{}, {NoOffload: true}} {
		lo := netip.MustParseAddrPort("127.0.0.1:0")
		a, err := ListenUDPOptions(lo, 1, o)
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := ListenUDPOptions(lo, 1, o)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		if !o.NoOffload && (!b.gro || !a.gso.Load()) {
			t.Fatalf("GSO %v, GRO %v where the offloads were asked for: the GRO half would go untested", a.gso.Load(), b.gro)
		}
		const count = 20
		out := make([]Packet, count)
		for i := range out {
			out[i] = Packet{Buf: bytes.Repeat([]byte{byte(i)}, 100), N: 100, Addr: b.LocalAddr()}
		}
		if err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		poller := b.NewPoller()
		backlog := poller.(Backlogger)
		in := make([]Packet, 4)
		for i := range in {
			in[i].Buf = make([]byte, 2048)
		}
		total := 0
		for deadline := time.Now().Add(5 * time.Second); total < count; {
			n, err := poller.TryReceive(in)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("offload off %v: %d of %d datagrams arrived", o.NoOffload, total, count)
				}
				runtime.Gosched()
				continue
			}
			total += n
			if n == len(in) && total < count && !backlog.Backlogged() {
				t.Fatalf("offload off %v: a read that filled its batch says it left nothing behind (%d of %d read)",
					o.NoOffload, total, count)
			}
		}
		if n, err := poller.TryReceive(in); n != 0 || err != nil {
			t.Fatalf("offload off %v: a read after all came: %d, %v", o.NoOffload, n, err)
		}
		if backlog.Backlogged() {
			t.Errorf("offload off %v: a read that found nothing says it left datagrams behind", o.NoOffload)
		}
	}
}
