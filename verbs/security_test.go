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
			if plain == nil && (b[0] != 0x83 || bytes.Contains(b, []byte{7, 14, 21, 28, 35, 42, 49, 56})) {
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
		a, b := memPair(t, f, 2, loopOpts{cfg: func(c *config.Device) { c.Key = testKey }})
		b.recv(0, 0, 1000)
		a.send(0, b, 0, 10) // meet (cookies) first: what is captured below, b took
		wantWC(t, a.one(), 0, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 0, verbs.WCSuccess, verbs.WCRecv)
		f.Tap(func(s, d netip.AddrPort, b []byte) {
			if s.Addr() == netip.MustParseAddr("10.0.0.1") && len(b) > 200 {
				captured = append(captured, append([]byte{}, b...))
				from, to = s, d
			}
		})
		b.recv(1, 0, 1000)
		a.send(2, b, 0, 500)
		wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 1, verbs.WCSuccess, verbs.WCRecv)
		if len(captured) == 0 {
			t.Fatal("captured nothing to replay")
		}
		b.recv(3, 0, 1000)
		before := b.ctx.Counters()
		for _, d := range captured {
			f.Inject(from, to, d)
		}
		forged := append([]byte{}, captured[0]...)
		forged[len(forged)/2] ^= 1
		f.Inject(from, to, forged)
		time.Sleep(10 * time.Millisecond)
		b.empty() // nothing delivered again
		c := b.ctx.Counters()
		if refused := c.Replays - before.Replays; refused < uint64(len(captured)) || c.AuthFailures != 1 {
			t.Fatalf("%d replays refused (want %d), authentication failures %d (want 1)", refused, len(captured), c.AuthFailures)
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
			d = wire.AppendData(d, &wire.Data{PSN: wire.PSN(i), Op: wire.OpWrite, Length: 64, DstQPN: uint16(b.qp.QPN()),
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

// A datagram that names a validated peer in its header but comes from another UDP port of the
// peer's IP (any local process can bind one) gets nothing but a CHALLENGE sent to the named
// endpoint, whatever it says: a captured READ_REQ moved ahead in the stream (and again with a
// new source incarnation) neither executes a read nor resets the real peer's state.
func TestInjectionFromAnotherPort(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(40)
		var reads [][]byte
		f.Tap(func(s, _ netip.AddrPort, d []byte) {
			if s == simA && carriesOp(d, wire.OpReadReq) {
				reads = append(reads, append([]byte(nil), d...))
			}
		})
		a, b := memPair(t, f, 2, loopOpts{})
		exchange(t, a, b, 2, 1000, 1000, 1)
		check(t, a.post(1, b, func(x *verbs.QPEx) {
			x.WRRDMARead(b.mr.RKey(), b.mr.Addr())
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 64<<10)
		}))
		wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend)
		if len(reads) == 0 {
			t.Fatal("captured no READ_REQ")
		}
		f.Tap(nil)
		before := b.ctx.Counters()
		var answers [][]byte
		f.Tap(func(s, _ netip.AddrPort, d []byte) {
			if s == simB {
				answers = append(answers, append([]byte(nil), d...))
			}
		})
		attacker := netip.AddrPortFrom(simA.Addr(), 9999)
		var forged []byte
		for i, newInc := range []bool{false, true} {
			forged = rewriteData(t, reads[0], func(h *wire.Header, d *wire.Data) {
				d.PSN += 50 + wire.PSN(i)
				d.MsgID += 1000 + uint32(i)
				if newInc {
					h.SrcInc ^= 0x5a5a
				}
			})
			f.Inject(attacker, simB, forged)
		}
		time.Sleep(10 * time.Millisecond)
		c := b.ctx.Counters()
		if c.RDMAReadRespBytes != before.RDMAReadRespBytes || c.Unvalidated-before.Unvalidated != 2 {
			t.Fatalf("read data sent %d bytes; %d datagrams challenged (want 0 and 2)",
				c.RDMAReadRespBytes-before.RDMAReadRespBytes, c.Unvalidated-before.Unvalidated)
		}
		for _, d := range answers {
			if len(d) > len(forged) || !onlyFrames(d, wire.TypeChallenge) {
				t.Fatalf("answered the forgery with % x", d)
			}
		}
		exchange(t, a, b, 2, 1000, 1000, 2) // the real peer's state is untouched
	})
}

// Sealed datagrams replayed from another address fail authentication (the sender's IP and the
// receiver's GID are authenticated with them), and from another port of the sender's IP they are
// replays: either way nothing executes.
func TestSealedReplayFromElsewhere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(41)
		a, b := memPair(t, f, 2, loopOpts{cfg: func(c *config.Device) { c.Key = testKey }})
		exchange(t, a, b, 2, 1000, 1000, 1)
		var captured [][]byte
		f.Tap(func(s, _ netip.AddrPort, d []byte) {
			if s == simA {
				captured = append(captured, append([]byte(nil), d...))
			}
		})
		check(t, a.post(1, b, func(x *verbs.QPEx) {
			x.WRRDMARead(b.mr.RKey(), b.mr.Addr())
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 64<<10)
		}))
		wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend)
		f.Tap(nil)
		before := b.ctx.Counters()
		otherIP := netip.AddrPortFrom(netip.MustParseAddr("10.0.0.9"), simA.Port())
		otherPort := netip.AddrPortFrom(simA.Addr(), 9999)
		for _, d := range captured {
			f.Inject(otherIP, simB, d)
			f.Inject(otherPort, simB, d)
		}
		time.Sleep(10 * time.Millisecond)
		c := b.ctx.Counters()
		n := uint64(len(captured))
		if c.RDMAReadRespBytes != before.RDMAReadRespBytes || c.AuthFailures-before.AuthFailures != n ||
			c.Replays+c.Unvalidated-before.Replays-before.Unvalidated != n {
			t.Fatalf("%d datagrams replayed twice: read bytes %d, auth failures %d, replays %d, challenged %d",
				n, c.RDMAReadRespBytes-before.RDMAReadRespBytes, c.AuthFailures-before.AuthFailures,
				c.Replays-before.Replays, c.Unvalidated-before.Unvalidated)
		}
		exchange(t, a, b, 2, 1000, 1000, 2)
	})
}

// carriesOp reports whether datagram d has a DATA frame with operation op.
func carriesOp(d []byte, op wire.Op) bool {
	_, frames, err := wire.ParseHeader(d)
	var f wire.Frame
	for err == nil && len(frames) > 0 {
		if frames, err = wire.NextFrame(frames, &f); err == nil && f.Type == wire.TypeData && f.Data.Op == op {
			return true
		}
	}
	return false
}

// onlyFrames reports whether every frame of datagram d is of type typ.
func onlyFrames(d []byte, typ wire.FrameType) bool {
	_, frames, err := wire.ParseHeader(d)
	var f wire.Frame
	for err == nil && len(frames) > 0 {
		if frames, err = wire.NextFrame(frames, &f); err != nil || f.Type != typ {
			return false
		}
	}
	return err == nil
}

// rewriteData rebuilds datagram d with only its DATA frames, changed by mod, as a forger would.
func rewriteData(t *testing.T, d []byte, mod func(*wire.Header, *wire.Data)) []byte {
	t.Helper()
	h, frames, err := wire.ParseHeader(d)
	if err != nil {
		t.Fatal(err)
	}
	var body []byte
	var f wire.Frame
	for len(frames) > 0 {
		if frames, err = wire.NextFrame(frames, &f); err != nil {
			t.Fatal(err)
		}
		if f.Type == wire.TypeData {
			mod(&h, &f.Data)
			body = wire.AppendData(body, &f.Data)
		}
	}
	out := append(wire.AppendHeader(nil, &h), body...)
	wire.PutChecksum(out)
	return out
}

// Peer contexts are bounded: with MaxPeers in use, a new validated peer takes the place of the
// one idle longest, which (forgotten to a memo) comes back later and carries on where its
// streams were; peers with traffic in flight are never given up for a newcomer, which then gets
// nothing; and peers idle past PeerIdleTimeout are forgotten.
func TestPeerStateBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(42)
		hubDev := newDevice(t, func(c *config.Device) {
			*c = config.Device{Link: f.Listen(netip.MustParseAddrPort("10.2.0.1:4791"), 2), Paths: 2, MaxPeers: 4,
				PeerIdleTimeout: time.Second, TransportTimeout: 10 * time.Second}
		})
		opts := loopOpts{size: 1 << 16, typ: verbs.QPTDriver, access: verbs.AccessRemoteRead,
			cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}}
		hub := newEnd(t, openCtx(t, hubDev), opts)
		clients := make([]*end, 6)
		addrs := make([]netip.AddrPort, 6)
		for i := range clients {
			addrs[i] = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, 1, byte(i)}), 4791)
			d := newDevice(t, func(c *config.Device) {
				*c = config.Device{Link: f.Listen(addrs[i], 2), Paths: 2, TransportTimeout: 2 * time.Second}
			})
			clients[i] = newEnd(t, openCtx(t, d), opts)
			clients[i].ah = clients[i].makeAH(hubDev.GID())
		}
		talk := func(i int, wrid uint64) { // a SEND and a READ from client i to the hub
			t.Helper()
			c := clients[i]
			hub.recv(wrid, 0, 64)
			c.send(wrid, hub, 0, 64)
			wantWC(t, c.one(), wrid, verbs.WCSuccess, verbs.WCSend)
			wantWC(t, hub.one(), wrid, verbs.WCSuccess, verbs.WCRecv)
			check(t, c.post(wrid+1, hub, func(x *verbs.QPEx) {
				x.WRRDMARead(hub.mr.RKey(), hub.mr.Addr())
				x.WRSetSGE(c.mr.LKey(), c.mr.Addr(), 4096)
			}))
			wantWC(t, c.one(), wrid+1, verbs.WCSuccess, verbs.WCSend)
		}
		for i := range 4 {
			talk(i, uint64(10*i))
			time.Sleep(time.Millisecond) // distinct ages
		}
		talk(4, 40) // the fifth: client 0, idle longest, gives way
		talk(0, 50) // and comes back, where its streams were (client 1 gives way)
		if n := hub.ctx.Counters().PeersForgotten; n != 2 {
			t.Fatalf("%d peers forgotten, want 2", n)
		}

		// Every peer busy: the hub's sends to them wait (their answers are lost), and a
		// newcomer gets no context.
		var ahs []*verbs.AH
		for _, i := range []int{0, 2, 3, 4} {
			for p := range 2 {
				f.SetNodePath(addrs[i], p, memlink.Impairment{Down: true})
			}
			clients[i].recv(uint64(60+i), 0, 64)
			ahs = append(ahs, hub.makeAH(clients[i].ctx.Device().GID()))
			hub.sendAH(uint64(60+i), ahs[len(ahs)-1], clients[i].qp.QPN(), 64)
		}
		clients[5].send(70, hub, 0, 64)
		if wc := clients[5].one(); wc.WRID != 70 || wc.Status != verbs.WCRespTimeoutErr {
			t.Fatalf("newcomer with every peer busy: %+v, want a response timeout", wc)
		}
		for _, i := range []int{0, 2, 3, 4} {
			for p := range 2 {
				f.SetNodePath(addrs[i], p, memlink.Impairment{})
			}
		}
		for range 4 {
			if wc := hub.one(); wc.Status != verbs.WCSuccess {
				t.Fatalf("send to a busy peer: %+v", wc)
			}
		}
		for _, i := range []int{0, 2, 3, 4} {
			wantWC(t, clients[i].one(), uint64(60+i), verbs.WCSuccess, verbs.WCRecv)
		}

		// Idle past PeerIdleTimeout: forgotten at the next tick of traffic.
		before := hub.ctx.Counters().PeersForgotten
		time.Sleep(3 * time.Second)
		talk(5, 80)
		time.Sleep(10 * time.Millisecond) // the transport's next tick
		if n := hub.ctx.Counters().PeersForgotten - before; n < 3 {
			t.Fatalf("%d idle peers forgotten after their timeout, want at least 3", n)
		}
		for _, ah := range ahs {
			check(t, ah.Destroy())
		}
	})
}

// A sealed datagram captured from a peer's earlier run and replayed after the peer has restarted
// more often than a receiver remembers old salts for is refused: a datagram with a salt other than
// the peer's current one is taken only with a fresh cookie, as from a new peer. Before, it was
// taken for the peer's restart (its requests in flight aborted) and its salt became current, so
// that the receiver refused the peer's real datagrams as replays until the peer restarted again.
// A new run that challenges the receiver before proving itself gets the receiver's cookie: the
// two do not only challenge each other.
func TestSealedReplayOfAnEarlierRun(t *testing.T) {
	inWorlds(t, 43, func(t *testing.T, w *world) {
		key := func(c *config.Device) { c.Key = testKey }
		a, b := w.pair(2, loopOpts{cfg: key})
		// The run's first large datagram to a, which carries a's cookie (it answers a's
		// challenge): the cookie is still valid when it is replayed, but older than b's run then.
		var captured []byte
		w.f.Tap(func(s, d netip.AddrPort, x []byte) {
			if s == simB && d == simA && len(x) > 200 && captured == nil {
				captured = append([]byte(nil), x...)
			}
		})
		exchange(t, b, a, 2, 1000, 1000, 1)
		w.f.Tap(nil)
		if captured == nil {
			t.Fatal("captured nothing to replay")
		}
		for i := range 6 { // b's process dies and a new one takes its address, six times
			w.sleep(1100 * time.Millisecond) // (a second apart: the cookie's unit)
			b.close()
			check(t, b.ctx.Close())
			check(t, b.ctx.Device().Close())
			nd := w.device(simB, 2, key)
			qpn := b.qp.QPN()
			b = newEnd(t, openCtx(t, nd), loopOpts{size: 1 << 20, iova: w.iova(), access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead,
				typ: verbs.QPTDriver, cap: verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 2, MaxRecvSGE: 2}})
			b.ah = b.makeAH(a.ctx.Device().GID())
			if b.qp.QPN() != qpn {
				t.Fatalf("the new life's QP is %d, the old one's %d: the test needs the same number", b.qp.QPN(), qpn)
			}
			if i%2 == 0 {
				exchange(t, b, a, 1, 1000, 1000, 2) // the new run speaks first
			} else {
				exchange(t, a, b, 1, 1000, 1000, 2) // a speaks first: the new run challenges it
			}
		}
		before := a.ctx.Counters()
		w.f.Inject(simB, simA, captured)
		w.sleep(10 * time.Millisecond)
		if c := a.ctx.Counters(); c.Replays+c.Unvalidated == before.Replays+before.Unvalidated {
			t.Error("the replay of the first run was neither refused nor challenged")
		}
		exchange(t, a, b, 3, 1000, 1000, 3) // the real peer is still heard
		exchange(t, b, a, 3, 1000, 1000, 4)
	})
}

// A first contact, plain and sealed (docs/wire.md, "Address validation"): the sender's PROBE is
// challenged, its SEND goes with the cookie (sealed, the receiver's ACK is challenged in turn and
// comes again with the sender's cookie), and it completes at once: nothing is sent twice and no
// timer fires. Before, sealed, the stream waited two retransmission timeouts for the PROBE to go
// again (30 ms of the driven world's time).
func TestFirstContactSendsNothingTwice(t *testing.T) {
	for _, sealed := range []bool{false, true} {
		w := drivenWorld(t, 7)
		a, b := w.pair(2, loopOpts{cfg: func(c *config.Device) {
			if sealed {
				c.Key = testKey
			}
		}})
		start := w.now()
		b.recv(1, 0, 64)
		a.send(1, b, 0, 64)
		wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend)
		took := w.now() - start
		ca, cb := a.ctx.Counters(), b.ctx.Counters()
		if ca.RetransPkts+cb.RetransPkts != 0 || ca.RetransTimeoutEvents+cb.RetransTimeoutEvents != 0 || took >= 2*time.Millisecond {
			t.Errorf("sealed %v: first SEND completed after %v of the world's time, %d+%d packets sent again, %d+%d timeouts; want at once, none",
				sealed, took, ca.RetransPkts, cb.RetransPkts, ca.RetransTimeoutEvents, cb.RetransTimeoutEvents)
		}
	}
}

// TestSealedReplayOfAnEarlierRun after the receiver has forgotten the peer (its table holds one
// peer, and a third device takes the place): the memo keeps the peer's salts and when its
// current run was taken, so the first run's cookie-bearing datagram, replayed then, still passes
// for no restart, and the real peer is still heard. Before, recalled from the memo, it was taken
// as the peer's new run and the real peer's datagrams were refused as replays.
func TestSealedReplayAfterTheReceiverForgot(t *testing.T) {
	inWorlds(t, 43, func(t *testing.T, w *world) {
		key := func(c *config.Device) { c.Key = testKey; c.MaxPeers = 1 }
		a, b := w.pair(2, loopOpts{cfg: key})
		var captured []byte
		w.f.Tap(func(s, d netip.AddrPort, x []byte) {
			if s == simB && d == simA && len(x) > 200 && captured == nil {
				captured = append([]byte(nil), x...) // (it carries a's cookie)
			}
		})
		exchange(t, b, a, 2, 1000, 1000, 1)
		w.f.Tap(nil)
		opts := loopOpts{size: 1 << 20, access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead, typ: verbs.QPTDriver,
			cap: verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 2, MaxRecvSGE: 2}}
		for i := range 6 { // b's process dies and a new one takes its address, six times, a second apart
			w.sleep(1100 * time.Millisecond)
			b.close()
			check(t, b.ctx.Close())
			check(t, b.ctx.Device().Close())
			opts.iova = w.iova()
			b = newEnd(t, openCtx(t, w.device(simB, 2, key)), opts)
			b.ah = b.makeAH(a.ctx.Device().GID())
			if i%2 == 0 {
				exchange(t, b, a, 1, 1000, 1000, 2)
			} else {
				exchange(t, a, b, 1, 1000, 1000, 2)
			}
		}
		simC := netip.MustParseAddrPort("10.0.0.3:4791")
		opts.iova = w.iova()
		c := newEnd(t, openCtx(t, w.device(simC, 2, key)), opts)
		c.ah = c.makeAH(a.ctx.Device().GID())
		exchange(t, c, a, 1, 1000, 1000, 5) // a forgets b to make room for c
		if a.ctx.Counters().PeersForgotten == 0 {
			t.Fatal("a did not forget b: the test needs it")
		}
		w.f.Inject(simB, simA, captured)
		w.sleep(10 * time.Millisecond)
		exchange(t, a, b, 2, 1000, 1000, 3) // the real peer is still heard
		exchange(t, b, a, 2, 1000, 1000, 4)
	})
}
