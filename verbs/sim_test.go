package verbs_test

import (
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/link/memlink"
	"github.com/softefa/softefa/verbs"
)

// Deterministic simulation: the soak's workload and impairments, plus link flaps, on a simulated
// fabric (memlink.NewSim), with both devices driven (config.Device.Driven) by the test's own goroutine,
// on the fabric's clock and with randomness from the seed. Nothing else runs, so a seed is a
// run: the same seed must produce the same datagrams, byte for byte, at the same virtual times,
// and the same completions in the same order. A failure prints its seed; to replay it:
//
//	go test ./verbs -run TestSimulation -sim.seed=N [-sim.msgs=M]
//
// and to look for failures, a run per seed from 1 to N:
//
//	go test ./verbs -run TestSimulation -sim.sweep=N
var (
	simSeed  = flag.Uint64("sim.seed", 0, "TestSimulation: run this seed only")
	simSweep = flag.Int("sim.sweep", 0, "TestSimulation: run seeds 1 to N")
	simMsgs  = flag.Int("sim.msgs", 1500, "TestSimulation: operations per run")
)

// simRun runs the soak once in simulation and returns a digest of everything that happened:
// every datagram sent (its virtual time, ends and bytes) and every completion.
func simRun(t *testing.T, seed uint64, n int) (digest [32]byte, datagrams int) {
	t.Logf("seed %d: replay with go test ./verbs -run TestSimulation -sim.seed=%d -sim.msgs=%d", seed, seed, n)
	f := memlink.NewSim(seed)
	soakPaths(f)
	h := sha256.New()
	var now time.Duration // the fabric's clock as the driver last moved it (Tap runs with the fabric locked)
	f.Tap(func(from, to netip.AddrPort, b []byte) {
		datagrams++
		var hdr [20]byte
		binary.LittleEndian.PutUint64(hdr[0:], uint64(now))
		binary.LittleEndian.PutUint16(hdr[8:], from.Port())
		binary.LittleEndian.PutUint16(hdr[10:], to.Port())
		binary.LittleEndian.PutUint64(hdr[12:], uint64(len(b)))
		h.Write(hdr[:])
		h.Write(b)
	})
	driven := func(c *config.Device) {
		node := c.Link.(*memlink.Node)
		var key [32]byte
		binary.LittleEndian.PutUint64(key[:], seed)
		binary.LittleEndian.PutUint16(key[8:], node.LocalAddr().Port())
		key[10] = node.LocalAddr().Addr().As4()[3]
		c.Link, c.Driven, c.Clock, c.Rand = memlink.Polled{Node: node}, true, f.Now, rand.NewChaCha8(key)
	}
	o := soakOpts(driven)
	o.iova = 1 << 40 // not the buffers' addresses, which differ from run to run and go on the wire
	a, b := memPair(t, f, 4, o)
	devs := []*verbs.Device{a.ctx.Device(), b.ctx.Device()}
	const limit = 10 * time.Minute // of virtual time: a run that takes longer is stuck
	// Besides the soak's impairments: every 50 ms one path, drawn from the seed, goes dark for
	// 20 ms (a link flap, which the path failure detection and probes must ride out).
	flaps := rand.New(rand.NewPCG(seed, 11))
	var nextFlap, healAt time.Duration
	down := -1
	flap := func() {
		if down >= 0 && now >= healAt {
			soakPaths(f) // all four healthy again
			down = -1
		}
		if now >= nextFlap {
			down, healAt, nextFlap = flaps.IntN(4), now+20*time.Millisecond, now+50*time.Millisecond
			imp := soakImpairment
			imp.Down = true
			f.SetPath(down, imp)
		}
	}
	soak(t, a, b, n, seed, soakHooks{
		step: func() {
			for _, d := range devs {
				d.Drive()
			}
		},
		idle: func() {
			if now = f.Advance(100 * time.Microsecond); now > limit {
				t.Fatalf("seed %d: still running after %v of virtual time", seed, limit)
			}
			flap()
		},
		seen: func(side byte, wc *verbs.WC) {
			fmt.Fprintf(h, "%c %d %d %d %d %d %d\n", side, now, wc.WRID, wc.Status, wc.Opcode, wc.ByteLen, wc.ImmData)
		},
	})
	copy(digest[:], h.Sum(nil))
	var c verbs.Counters
	for _, d := range []*end{a, b} {
		x := d.ctx.Counters()
		c.RetransPkts += x.RetransPkts
		c.BadPackets += x.BadPackets
	}
	t.Logf("seed %d: %d operations, %d datagrams, %d retransmitted, %d bad, %v of virtual time; digest %x",
		seed, n, datagrams, c.RetransPkts, c.BadPackets, now, digest[:8])
	return digest, datagrams
}

func TestSimulation(t *testing.T) {
	n := *simMsgs
	if *simSeed != 0 {
		simRun(t, *simSeed, n)
		return
	}
	if *simSweep > 0 {
		for seed := range uint64(*simSweep) {
			simRun(t, seed+1, n)
		}
		return
	}
	first, sent := simRun(t, 1, n)
	if sent < n {
		t.Fatalf("%d datagrams for %d operations", sent, n)
	}
	// The same seed is the same run.
	if again, _ := simRun(t, 1, n); again != first {
		t.Fatalf("seed 1 ran twice with different outcomes: digests %x and %x", first[:8], again[:8])
	}
	// And the seed matters: another one takes other losses, so another course.
	if other, _ := simRun(t, 2, n); other == first {
		t.Fatal("seeds 1 and 2 ran the same course")
	}
}
