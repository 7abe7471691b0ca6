package verbs_test

import (
	"testing"
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/link/memlink"
	"github.com/softefa/softefa/verbs"
)

// The transport timeout counts from when a request is posted, however long the device has been
// up: the first WR to a peer after a quiet spell, or to a new peer, gets the whole timeout.
func TestTimeoutCountsFromPost(t *testing.T) {
	inWorlds(t, 3, func(t *testing.T, w *world) {
		a, b := w.pair(2, loopOpts{})
		exchange(t, a, b, 2, 100, 100, 1)
		w.sleep(3 * time.Second) // quiet, and three transport timeouts older

		// A peer that pauses for 200 ms: the WR waits for it and succeeds.
		down := memlink.Impairment{Down: true}
		w.f.SetPath(0, down)
		w.f.SetPath(1, down)
		w.afterFunc(200*time.Millisecond, func() {
			w.f.SetPath(0, memlink.Impairment{})
			w.f.SetPath(1, memlink.Impairment{})
		})
		b.recv(1, 0, 100)
		a.send(2, b, 0, 100)
		wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 1, verbs.WCSuccess, verbs.WCRecv)

		// An address nobody listens at: the failure comes after the whole timeout.
		w.sleep(3 * time.Second)
		ghost := a.makeAH(verbs.GID{10: 0xff, 11: 0xff, 12: 10, 13: 0, 14: 0, 15: 9, 8: 0x12, 9: 0xb7})
		start := w.now()
		a.x.WRStart()
		a.x.WRID, a.x.WRFlags = 3, verbs.SendSignaled
		a.x.WRSend()
		a.x.WRSetUDAddr(ghost, 5, qkey)
		a.x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 10)
		check(t, a.x.WRComplete())
		wc := a.one()
		if took := w.now() - start; wc.WRID != 3 || efaio.Status(wc.VendorErr) != efaio.StatusLocalUnreachRemote || took < time.Second {
			t.Fatalf("completion %+v after %v; want UNREACH_REMOTE after the 1 s transport timeout", wc, took)
		}
		check(t, ghost.Destroy())
	})
}
