package verbs_test

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"
	"testing/synctest"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/link/memlink"
	"github.com/softefa/softefa/verbs"
)

// world runs a transport test's body two ways: with the devices' own goroutines in a synctest
// bubble (their interleavings are part of what is tested), and driven on a simulated fabric
// (every run of the seed is the same run, so a failure there replays exactly). The body makes
// its fabric, ends, sleeps and timers through the world.
type world struct {
	t      *testing.T
	seed   uint64
	driven bool
	f      *memlink.Fabric
	devs   []*verbs.Device
	na     *memlink.Node
	timers []worldTimer
	start  time.Time     // goroutine world: when it began
	clock  time.Duration // driven world: the fabric's clock as step last moved it
	// held: driven world, devices not driven until the world's time given (their process held up)
	held map[*verbs.Device]time.Duration
}

type worldTimer struct {
	at time.Duration
	fn func()
}

// inWorlds runs body as subtests "goroutines" and "driven".
func inWorlds(t *testing.T, seed uint64, body func(t *testing.T, w *world)) {
	t.Run("goroutines", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			w := &world{t: t, seed: seed, f: memlink.New(seed), start: time.Now()}
			body(t, w)
		})
	})
	t.Run("driven", func(t *testing.T) {
		t.Logf("seed %d: every run is this run (go test ./verbs -run '%s')", seed, t.Name())
		body(t, drivenWorld(t, seed))
	})
}

// drivenWorld is a driven world on a simulated fabric; waitWC moves it until the test ends.
func drivenWorld(t *testing.T, seed uint64) *world {
	w := &world{t: t, seed: seed, driven: true, f: memlink.NewSim(seed)}
	waitHook = w.step
	t.Cleanup(func() { waitHook = nil })
	return w
}

// drivenConfig makes c, a device on a node of the simulated fabric f, driven: a pollable link,
// f's clock, and random bits from the seed, the node's address and salt (so that a device
// taking over an address draws other bits than its predecessor).
func drivenConfig(c *config.Device, f *memlink.Fabric, seed uint64, salt byte) {
	node := c.Link.(*memlink.Node)
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	binary.LittleEndian.PutUint16(key[8:], node.LocalAddr().Port())
	key[10] = node.LocalAddr().Addr().As4()[3]
	key[11] = salt
	c.Link, c.Driven, c.Clock, c.Rand = memlink.Polled{Node: node}, true, f.Now, rand.NewChaCha8(key)
}

// pair makes the world's two ends (memPair), driven in the driven world.
func (w *world) pair(paths int, o loopOpts) (a, b *end) {
	if w.driven {
		mod := o.cfg
		o.iova = w.iova() // the buffers' own addresses differ from run to run and go on the wire
		o.cfg = func(c *config.Device) {
			if mod != nil {
				mod(c)
			}
			w.drive(c)
		}
	}
	a, b, w.na = memPairNodes(w.t, w.f, paths, o)
	w.devs = append(w.devs, a.ctx.Device(), b.ctx.Device())
	return a, b
}

// drive makes c, a device on one of the world's nodes, driven in the driven world.
func (w *world) drive(c *config.Device) {
	if w.driven {
		drivenConfig(c, w.f, w.seed, byte(len(w.devs)))
	}
}

// device makes one more device of the world, on a new node at addr.
func (w *world) device(addr netip.AddrPort, paths int, mod func(*config.Device)) *verbs.Device {
	d := newDevice(w.t, func(c *config.Device) {
		*c = config.Device{Link: w.f.Listen(addr, paths), Paths: paths, TransportTimeout: time.Second}
		if mod != nil {
			mod(c)
		}
		w.drive(c)
	})
	w.devs = append(w.devs, d)
	return d
}

// iova is the address for a driven world's regions (0 otherwise: the buffer's own).
func (w *world) iova() uint64 {
	if w.driven {
		return 1 << 40
	}
	return 0
}

// nodeA is the fabric node of the last pair's end a.
func (w *world) nodeA() *memlink.Node { return w.na }

// step moves a driven world once: every device, then the clock if none had anything to do, then
// the timers that came due.
func (w *world) step() {
	worked := false
	for _, d := range w.devs {
		if until, ok := w.held[d]; ok && w.f.Now() < until {
			continue
		}
		worked = d.Drive() || worked
	}
	if !worked {
		w.clock = w.f.Advance(100 * time.Microsecond)
	}
	now := w.clock
	for i := 0; i < len(w.timers); {
		if tm := w.timers[i]; tm.at <= now {
			w.timers = append(w.timers[:i], w.timers[i+1:]...)
			tm.fn()
			continue
		}
		i++
	}
}

// hold stops driving d for the next dt of a driven world's time, as a process off its core.
func (w *world) hold(d *verbs.Device, dt time.Duration) {
	if w.held == nil {
		w.held = map[*verbs.Device]time.Duration{}
	}
	w.held[d] = w.f.Now() + dt
}

// now is the world's time since it began.
func (w *world) now() time.Duration {
	if w.driven {
		return w.f.Now()
	}
	return time.Since(w.start)
}

// sleep lets d of the world's time pass.
func (w *world) sleep(d time.Duration) {
	if !w.driven {
		time.Sleep(d)
		return
	}
	for end := w.f.Now() + d; w.f.Now() < end; {
		w.step()
	}
}

// afterFunc calls fn once d of the world's time has passed.
func (w *world) afterFunc(d time.Duration, fn func()) {
	if !w.driven {
		time.AfterFunc(d, fn)
		return
	}
	w.timers = append(w.timers, worldTimer{w.f.Now() + d, fn})
}
