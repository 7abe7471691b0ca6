package verbs_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/verbs"
)

// security.md "Authenticated encryption": a receiver that restarts knows no run of its peer. The
// peer's datagrams captured before the restart (the first of them addressed to no incarnation
// of the receiver), replayed once the new life has spoken to the peer, deliver nothing: the
// first datagram of the peer's run the new life takes carries a fresh cookie, and what the run
// sent before it counts as seen.
func TestSealedReplayAtARestartedReceiver(t *testing.T) {
	inWorlds(t, 44, func(t *testing.T, w *world) {
		key := func(c *config.Device) { c.Key = testKey }
		a, b := w.pair(2, loopOpts{cfg: key})
		var captured [][]byte
		w.f.Tap(func(s, d netip.AddrPort, x []byte) {
			if s == simB && d == simA && len(x) > 200 {
				captured = append(captured, append([]byte(nil), x...))
			}
		})
		exchange(t, b, a, 2, 1000, 1000, 1) // b speaks first
		w.f.Tap(nil)
		if len(captured) == 0 {
			t.Fatal("captured nothing to replay")
		}
		// a's process dies and a new one takes its address; it sends b one message.
		qpn := a.qp.QPN()
		a.close()
		check(t, a.ctx.Close())
		check(t, a.ctx.Device().Close())
		a = newEnd(t, openCtx(t, w.device(simA, 2, key)), loopOpts{size: 1 << 20, iova: w.iova(),
			access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead, typ: verbs.QPTDriver,
			cap: verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 2, MaxRecvSGE: 2}})
		a.ah = a.makeAH(b.ctx.Device().GID())
		if a.qp.QPN() != qpn {
			t.Fatalf("the new life's QP is %d, the old one's %d: the test needs the same number", a.qp.QPN(), qpn)
		}
		b.recv(1, 0, 1000)
		a.send(1, b, 0, 100)
		if wc := a.one(); wc.Status != verbs.WCSuccess {
			t.Fatalf("the new life's send: %+v", wc)
		}
		if wc := b.one(); wc.Status != verbs.WCSuccess {
			t.Fatalf("b's receive: %+v", wc)
		}
		before := a.ctx.Counters()
		for i := range 8 {
			a.recv(uint64(100+i), 0, 1000)
		}
		for _, x := range captured {
			w.f.Inject(simB, simA, x)
		}
		w.sleep(10 * time.Millisecond)
		a.empty()
		if c := a.ctx.Counters(); c.Replays+c.Unvalidated == before.Replays+before.Unvalidated {
			t.Error("the replays were neither refused nor challenged")
		}
		b.send(7, a, 0, 100) // the real peer is heard
		if wc := b.one(); wc.Status != verbs.WCSuccess {
			t.Fatalf("b's send: %+v", wc)
		}
		if wc := a.one(); wc.Status != verbs.WCSuccess || wc.WRID != 100 {
			t.Fatalf("a's receive: %+v", wc)
		}
	})
}
