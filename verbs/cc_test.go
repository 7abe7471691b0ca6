package verbs_test

import (
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/link/memlink"
	"github.com/softefa/softefa/verbs"
)

// Congestion control at a bottleneck (docs/congestion.md): two senders writing into one receiver
// through a 100 Mbit/s link with a 100 KB drop-tail queue, in virtual time.

type ccResult struct {
	bytes [2]uint64
	neck  memlink.Bottleneck
}

func runBottleneck(t *testing.T, loss float64) ccResult {
	const (
		rate  = 12.5e6 // bytes/s
		queue = 100 << 10
		chunk = 64 << 10
		depth = 4
	)
	var res ccResult
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(21)
		for i := range 2 {
			f.SetPath(i, memlink.Impairment{Loss: loss})
		}
		sink := netip.MustParseAddrPort("10.2.0.3:4791")
		f.SetBottleneck(sink, rate, queue)
		mk := func(ap netip.AddrPort) *verbs.Device {
			return newDevice(t, func(c *config.Device) { *c = config.Device{Link: f.Listen(ap, 2), Paths: 2} })
		}
		cdev := mk(sink)
		c := newEnd(t, openCtx(t, cdev), loopOpts{size: 1 << 20, typ: verbs.QPTDriver, access: verbs.AccessRemoteWrite,
			cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
		var senders [2]*end
		for i := range senders {
			d := mk(netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 2, 0, byte(i + 1)}), 4791))
			senders[i] = newEnd(t, openCtx(t, d), loopOpts{size: chunk, typ: verbs.QPTDriver,
				cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
			senders[i].ah = senders[i].makeAH(cdev.GID())
		}
		var outstanding [2]int
		var wc [8]verbs.WC
		start := time.Now()
		for time.Since(start) < 8*time.Second {
			progress := false
			for i, s := range senders {
				for outstanding[i] < depth {
					check(t, s.post(uint64(i), c, func(x *verbs.QPEx) {
						x.WRRDMAWrite(c.mr.RKey(), c.mr.Addr()+uint64(i)*chunk)
						x.WRSetSGE(s.mr.LKey(), s.mr.Addr(), chunk)
					}))
					outstanding[i]++
				}
				n, err := s.cq.Poll(wc[:])
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range wc[:n] {
					if w.Status != verbs.WCSuccess {
						t.Fatalf("sender %d: %+v", i, w)
					}
					outstanding[i]--
					if time.Since(start) >= 2*time.Second { // count after two seconds of convergence
						res.bytes[i] += chunk
					}
					progress = true
				}
			}
			if !progress {
				time.Sleep(200 * time.Microsecond)
			}
		}
		res.neck = f.BottleneckStats(sink)
	})
	return res
}

func TestBottleneckFairShare(t *testing.T) {
	r := runBottleneck(t, 0)
	a, b := float64(r.bytes[0]), float64(r.bytes[1])
	goodput := (a + b) / 6 / 12.5e6 // over the 6 s measured
	jain := (a + b) * (a + b) / (2 * (a*a + b*b))
	t.Logf("goodput %.0f%% of the bottleneck, shares %.0f/%.0f KB, Jain index %.3f, queueing delay avg %v max %v, drops %d",
		100*goodput, a/1e3, b/1e3, jain, r.neck.AvgDelay(), r.neck.MaxDelay, r.neck.Dropped)
	if goodput < 0.8 {
		t.Errorf("goodput %.0f%% of the bottleneck, want at least 80%%", 100*goodput)
	}
	if jain < 0.95 {
		t.Errorf("Jain fairness index %.3f, want at least 0.95", jain)
	}
	// The window rule is loss-based: queueing delay is bounded by the bottleneck's buffer (8.2 ms
	// here), and losses keep it from sitting at the bound.
	if full := time.Duration(float64(100<<10) / 12.5e6 * float64(time.Second)); r.neck.MaxDelay > full+time.Millisecond ||
		r.neck.AvgDelay() >= full {
		t.Errorf("queueing delay avg %v max %v, bound %v", r.neck.AvgDelay(), r.neck.MaxDelay, full)
	}
}

func TestBottleneckUnderLoss(t *testing.T) {
	r := runBottleneck(t, 0.02)
	goodput := float64(r.bytes[0]+r.bytes[1]) / 6 / 12.5e6
	t.Logf("with 2%% random loss: goodput %.0f%% of the bottleneck", 100*goodput)
	if goodput < 0.5 {
		t.Errorf("goodput collapsed to %.0f%% of the bottleneck under 2%% loss", 100*goodput)
	}
}
