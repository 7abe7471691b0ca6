package verbs_test

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link/memlink"
	"github.com/softefa/softefa/verbs"
)

var testKey = bytes.Repeat([]byte{0x42}, 32)

// Devices with the same key exchange everything; the wire carries no plaintext.
func TestEncryptedExchange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(31)
		var plain []byte
		f.Tap(func(_, _ netip.AddrPort, b []byte) {
			if plain == nil && (b[0] != 0x81 || bytes.Contains(b, []byte{7, 14, 21, 28, 35, 42, 49, 56})) {
				plain = append([]byte{}, b...)
			}
		})
		a, b := memPair(t, f, 2, loopOpts{cfg: func(c *config.Device) { c.Key = testKey }})
		exchange(t, a, b, 10, 8192, 64<<10, 1)
		if plain != nil {
			t.Fatalf("a datagram went out unsealed, or with recognisable payload: % x", plain[:min(len(plain), 64)])
		}
	})
}

// Devices with different keys cannot exchange anything: the sender's WR fails as unreachable,
// the receiver counts authentication failures.
func TestDifferentKeysCannotTalk(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(32)
		other := bytes.Repeat([]byte{0x43}, 32)
		na := f.Listen(netip.MustParseAddrPort("10.5.0.1:4791"), 2)
		nb := f.Listen(netip.MustParseAddrPort("10.5.0.2:4791"), 2)
		a, b := newRemotePair(t, config.Device{Link: na, Paths: 2, Key: testKey, TransportTimeout: time.Second},
			config.Device{Link: nb, Paths: 2, Key: other, TransportTimeout: time.Second},
			loopOpts{size: 1 << 16})
		b.recv(1, 0, 100)
		a.send(2, b, 0, 100)
		wc := a.one()
		if wc.WRID != 2 || efaio.Status(wc.VendorErr) != efaio.StatusLocalUnreachRemote {
			t.Fatalf("completion %+v, want UNREACH_REMOTE", wc)
		}
		b.empty()
		if b.ctx.Counters().AuthFailures == 0 {
			t.Fatal("the receiver counted no authentication failure")
		}
	})
}

// A replayed datagram is dropped and counted, a forged one fails authentication, and neither
// delivers anything twice.
func TestReplayAndForgery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(33)
		var captured [][]byte
		var from, to netip.AddrPort
		f.Tap(func(s, d netip.AddrPort, b []byte) {
			if s.Addr() == netip.MustParseAddr("10.0.0.1") && len(b) > 200 {
				captured = append(captured, append([]byte{}, b...))
				from, to = s, d
			}
		})
		a, b := memPair(t, f, 2, loopOpts{cfg: func(c *config.Device) { c.Key = testKey }})
		b.recv(1, 0, 1000)
		a.send(2, b, 0, 500)
		wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 1, verbs.WCSuccess, verbs.WCRecv)
		if len(captured) == 0 {
			t.Fatal("captured nothing to replay")
		}
		b.recv(3, 0, 1000)
		for _, d := range captured {
			f.Inject(from, to, d)
		}
		forged := append([]byte{}, captured[0]...)
		forged[len(forged)/2] ^= 1
		f.Inject(from, to, forged)
		time.Sleep(10 * time.Millisecond)
		b.empty() // nothing delivered again
		c := b.ctx.Counters()
		if c.Replays < uint64(len(captured)) || c.AuthFailures != 1 {
			t.Fatalf("replays %d (want %d), authentication failures %d (want 1)", c.Replays, len(captured), c.AuthFailures)
		}
		a.send(4, b, 0, 10) // and the two still talk: this lands in the receive the replays did not take
		wantWC(t, a.one(), 4, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 3, verbs.WCSuccess, verbs.WCRecv)
		exchange(t, a, b, 2, 1000, 1000, 2)
	})
}

// A spoofed RDMA read request cannot turn a device into an amplifier: the spoofed address gets
// one CHALLENGE no larger than the request, and the device keeps no state for it.
func TestNoAmplification(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(34)
		_, b := memPair(t, f, 2, loopOpts{size: 1 << 20})
		victim := netip.MustParseAddrPort("10.0.0.9:4791")
		vnode := f.Listen(victim, 1)
		defer vnode.Close()
		req := wire.AppendHeader(nil, &wire.Header{SrcPort: victim.Port(), SrcInc: 77})
		req = wire.AppendData(req, &wire.Data{Op: wire.OpReadReq, Length: 1 << 20, DstQPN: uint16(b.qp.QPN()),
			QKey: qkey, RKey: b.mr.RKey(), RAddr: b.mr.Addr()})
		wire.PutChecksum(req)
		for range 10 {
			f.Inject(victim, b.ctx.Device().Addr(), req)
		}
		time.Sleep(50 * time.Millisecond)
		n, got := vnode.Queued()
		if got > 10*len(req) {
			t.Fatalf("the spoofed address received %d bytes in %d datagrams for %d bytes sent", got, n, 10*len(req))
		}
		if c := b.ctx.Counters(); c.Unvalidated != 10 || c.RDMAReadRespBytes != 0 {
			t.Fatalf("counters %+v", c)
		}
		if ps := b.ctx.PathStats(); len(ps) != 0 {
			t.Fatalf("path stats for %d paths: state was kept for the spoofed source", len(ps))
		}
	})
}

// A flood of datagrams from many forged sources grows no state.
func TestFloodFromForgedSources(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(35)
		_, b := memPair(t, f, 2, loopOpts{size: 1 << 16})
		dst := b.ctx.Device().Addr()
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		const n = 20000
		for i := range n {
			src := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}), uint16(1000+i%50000))
			d := wire.AppendHeader(nil, &wire.Header{SrcPort: src.Port(), SrcInc: uint32(i + 1)})
			d = wire.AppendData(d, &wire.Data{PSN: uint32(i), Op: wire.OpWrite, Length: 64, DstQPN: uint16(b.qp.QPN()),
				QKey: qkey, RKey: b.mr.RKey(), RAddr: b.mr.Addr(), Payload: make([]byte, 64)})
			wire.PutChecksum(d)
			f.Inject(src, dst, d)
			if i%1000 == 999 {
				time.Sleep(time.Millisecond)
			}
		}
		time.Sleep(10 * time.Millisecond)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if c := b.ctx.Counters(); c.Unvalidated != n || c.RDMAWriteRecvBytes != 0 {
			t.Fatalf("%d datagrams challenged, %d bytes written; want %d and 0", c.Unvalidated, c.RDMAWriteRecvBytes, n)
		}
		if len(b.ctx.PathStats()) != 0 {
			t.Fatalf("state for %d paths after the flood", len(b.ctx.PathStats()))
		}
		if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 4<<20 {
			t.Fatalf("heap grew by %d bytes under a flood of %d forged datagrams", grew, n)
		}
	})
}

func TestKeyFromFileAndEnv(t *testing.T) {
	dir := t.TempDir()
	hexKey := "4242424242424242424242424242424242424242424242424242424242424242\n"
	p := filepath.Join(dir, "key")
	if err := os.WriteFile(p, []byte(hexKey), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := config.KeyFromFile(p)
	if err != nil || !bytes.Equal(k, testKey) {
		t.Fatalf("key %x, %v", k, err)
	}
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := config.KeyFromFile(p); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("world-readable key file: %v", err)
	}
	t.Setenv("SOFTEFA_TEST_KEY", hexKey)
	if k, err := config.KeyFromEnv("SOFTEFA_TEST_KEY"); err != nil || !bytes.Equal(k, testKey) {
		t.Fatalf("env key %x, %v", k, err)
	}
	t.Setenv("SOFTEFA_TEST_KEY", "abc")
	if _, err := config.KeyFromEnv("SOFTEFA_TEST_KEY"); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("short key: %v", err)
	}
	if _, err := verbs.NewDevice(config.Device{Key: []byte("short")}); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("device with a 5-byte key: %v", err)
	}
}
