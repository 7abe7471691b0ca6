package memlink

import (
	"container/heap"
	"net/netip"
	"time"

	"github.com/softefa/softefa/link"
)

// NewSim returns an empty fabric on a virtual clock that starts at 0 and moves only in Advance.
// Its randomness comes from seed, like New's.
func NewSim(seed uint64) *Fabric {
	f := New(seed)
	f.sim = &simState{}
	return f
}

// simState is a simulated fabric's clock and its queue of deliveries in the future.
type simState struct {
	now    time.Duration
	seq    uint64 // breaks ties: deliveries due at the same time arrive in the order they were sent
	events eventHeap
}

type event struct {
	at   time.Duration
	seq  uint64
	dst  *Node
	buf  []byte
	from netip.AddrPort
}

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*h = old[:len(old)-1]
	return e
}

// schedule queues a delivery after the given delay. Called with f.mu held.
func (s *simState) schedule(n *Node, b []byte, from netip.AddrPort, after time.Duration) {
	s.seq++
	heap.Push(&s.events, event{at: s.now + after, seq: s.seq, dst: n, buf: b, from: from})
}

// now is the fabric's time as a time.Time: the wall clock, or the virtual clock from the Unix
// epoch. Called with f.mu held.
func (f *Fabric) now() time.Time {
	if f.sim != nil {
		return time.Unix(0, 0).Add(f.sim.now)
	}
	return time.Now()
}

// Now is a simulated fabric's clock: the time since it was made, moved only by Advance. It is
// what the driven devices on the fabric take as config.Device.Clock. On a fabric from New it
// is 0.
func (f *Fabric) Now() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sim == nil {
		return 0
	}
	return f.sim.now
}

// Advance moves a simulated fabric's clock to its next delivery, or by step if that is sooner,
// and hands every delivery due by then to its node, in time order. It returns the new time. On a
// fabric from New it does nothing.
func (f *Fabric) Advance(step time.Duration) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.sim
	if s == nil {
		return 0
	}
	to := s.now + step
	if len(s.events) > 0 && s.events[0].at < to {
		to = max(s.events[0].at, s.now)
	}
	s.now = to
	for len(s.events) > 0 && s.events[0].at <= to {
		e := heap.Pop(&s.events).(event)
		if f.nodes[e.dst.addr] == e.dst {
			e.dst.deliver(e.buf, e.from, 0)
		}
	}
	return to
}

// Pending is how many deliveries a simulated fabric holds for the future.
func (f *Fabric) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sim == nil {
		return 0
	}
	return len(f.sim.events)
}

// Polled is a Node that can also be read without waiting: a link.Poller, which a driven device
// needs. (A plain Node is not one, so that a device's receive loop never spins on it under
// testing/synctest, where spinning would keep the clock from moving.)
type Polled struct{ *Node }

// TryReceive is Receive that returns 0 at once when nothing is queued.
func (p Polled) TryReceive(pkts []link.Packet) (int, error) {
	n := p.Node
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return 0, link.ErrClosed
	}
	return n.take(pkts), nil
}
