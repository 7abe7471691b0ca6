// Package memlink is an in-memory network of links for tests: devices in one process exchange
// datagrams through a Fabric that can drop, duplicate, delay and reorder them, per path, with
// its randomness drawn from a seed. Delays use timers, so under testing/synctest a test runs in
// virtual time.
//
// A fabric made by NewSim instead keeps its own clock and starts no timers: delayed datagrams
// wait in an event queue until Advance moves the clock past them. Driven devices
// (config.Device.Driven) on Polled nodes, with the fabric's clock and seeded randomness, then run
// on one goroutine and a seed replays a run exactly (see sim.go).
package memlink

import (
	"net/netip"
	"sync"
	"time"

	"github.com/softefa/softefa/link"
)

// Impairment is what a path does to the datagrams sent on it.
type Impairment struct {
	Loss      float64       // probability a datagram is dropped (in the good state, with Gilbert–Elliott)
	Duplicate float64       // probability a datagram is delivered twice
	Corrupt   float64       // probability a datagram has one bit flipped
	Delay     time.Duration // added to every datagram
	Jitter    time.Duration // a uniform extra delay in [0, Jitter): reorders datagrams
	Down      bool          // every datagram is dropped

	// Gilbert–Elliott bursty loss: per datagram the path moves from good to bad with probability
	// ToBad and back with ToGood; in the bad state it drops with probability BadLoss.
	ToBad, ToGood, BadLoss float64

	// Rate (bytes/s) and Queue (bytes) make the path a rate-limited link with a drop-tail queue.
	Rate  float64
	Queue int
}

// Fabric joins Nodes. Each sender's path has its own impairment and random stream.
type Fabric struct {
	mu    sync.Mutex
	seed  uint64
	nodes map[netip.AddrPort]*Node
	paths map[int]Impairment // by sender path index; applies to every node
	// nodePaths overrides paths for one sender's path.
	nodePaths map[nodePath]Impairment
	stats     map[int]*PathStats
	necks     map[netip.AddrPort]*Bottleneck
	tap       func(from, to netip.AddrPort, b []byte)
	filter    func(from, to netip.AddrPort, b []byte) bool

	sim *simState // NewSim: the virtual clock and the deliveries waiting for it; nil otherwise
}

// Bottleneck is a link of limited rate with a drop-tail queue in front of one node: every
// datagram to the node waits its turn, and one that finds the queue full is dropped.
type Bottleneck struct {
	Rate  float64 // bytes per second
	Queue int     // bytes the queue holds

	busyUntil time.Time
	Delivered uint64        // datagrams through
	Dropped   uint64        // datagrams dropped at the full queue
	MaxDelay  time.Duration // longest queueing delay seen
	delaySum  time.Duration
}

// AvgDelay is the mean queueing delay of the datagrams through.
func (b *Bottleneck) AvgDelay() time.Duration {
	if b.Delivered == 0 {
		return 0
	}
	return b.delaySum / time.Duration(b.Delivered)
}

// SetBottleneck puts a bottleneck of rate bytes/s and a queue of queue bytes in front of dst.
func (f *Fabric) SetBottleneck(dst netip.AddrPort, rate float64, queue int) {
	f.mu.Lock()
	f.necks[dst] = &Bottleneck{Rate: rate, Queue: queue}
	f.mu.Unlock()
}

// BottleneckStats returns a copy of dst's bottleneck counters.
func (f *Fabric) BottleneckStats(dst netip.AddrPort) Bottleneck {
	f.mu.Lock()
	defer f.mu.Unlock()
	if b := f.necks[dst]; b != nil {
		return *b
	}
	return Bottleneck{}
}

// PathStats count what happened on a path (by sender path index).
type PathStats struct {
	Sent, Dropped, Duplicated, Corrupted uint64
}

// New returns an empty fabric whose randomness comes from seed.
func New(seed uint64) *Fabric {
	return &Fabric{seed: seed, nodes: make(map[netip.AddrPort]*Node), paths: make(map[int]Impairment), nodePaths: make(map[nodePath]Impairment),
		stats: make(map[int]*PathStats), necks: make(map[netip.AddrPort]*Bottleneck)}
}

// SetPath sets the impairment of every sender's path i.
func (f *Fabric) SetPath(i int, imp Impairment) {
	f.mu.Lock()
	f.paths[i] = imp
	f.mu.Unlock()
}

type nodePath struct {
	addr netip.AddrPort
	path int
}

// SetNodePath sets the impairment of path i of the node at addr only, overriding SetPath's: the
// paths of a real network's two directions need not fail together (ECMP hashes each direction's
// ports on its own).
func (f *Fabric) SetNodePath(addr netip.AddrPort, i int, imp Impairment) {
	f.mu.Lock()
	f.nodePaths[nodePath{addr, i}] = imp
	f.mu.Unlock()
}

// Stats returns a copy of path i's counters.
func (f *Fabric) Stats(i int) PathStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.stats[i]; s != nil {
		return *s
	}
	return PathStats{}
}

// Listen adds a node at addr with the given number of paths.
func (f *Fabric) Listen(addr netip.AddrPort, paths int) *Node {
	n := &Node{f: f, addr: addr, paths: paths, sig: make(chan struct{}, 1), done: make(chan struct{})}
	n.sent = make([]uint64, paths)
	n.state = make([]*Path, paths)
	for i := range n.state {
		a := addr.Addr().As16()
		n.state[i] = NewPath(f.seed^uint64(addr.Port())<<32^uint64(i), uint64(a[15])|uint64(a[14])<<8)
	}
	f.mu.Lock()
	f.nodes[addr] = n
	f.mu.Unlock()
	return n
}

// Node is one device's Link on the fabric.
type Node struct {
	f     *Fabric
	addr  netip.AddrPort
	paths int
	state []*Path  // per path: random stream and impairment state, guarded by f.mu
	sent  []uint64 // per path, guarded by f.mu

	mu     sync.Mutex
	inbox  []delivery
	sig    chan struct{}
	done   chan struct{}
	closed bool
}

type delivery struct {
	buf  []byte
	from netip.AddrPort
}

// Sent returns how many datagrams the node has sent on path i.
func (n *Node) Sent(i int) uint64 {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	return n.sent[i]
}

// LocalAddr is the node's address.
func (n *Node) LocalAddr() netip.AddrPort { return n.addr }

// Paths is the node's path count.
func (n *Node) Paths() int { return n.paths }

// Close detaches the node; datagrams to it are dropped.
func (n *Node) Close() error {
	n.f.mu.Lock()
	if n.f.nodes[n.addr] == n {
		delete(n.f.nodes, n.addr)
	}
	n.f.mu.Unlock()
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		close(n.done)
	}
	n.mu.Unlock()
	return nil
}

// Send passes each datagram through its path's impairment to the destination node.
func (n *Node) Send(pkts []link.Packet) error {
	f := n.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range pkts {
		p := &pkts[i]
		path := min(max(p.Path, 0), n.paths-1)
		imp, ok := f.nodePaths[nodePath{n.addr, path}]
		if !ok {
			imp = f.paths[path]
		}
		st := f.stats[path]
		if st == nil {
			st = &PathStats{}
			f.stats[path] = st
		}
		st.Sent++
		n.sent[path]++
		if f.tap != nil {
			f.tap(n.addr, p.Addr, p.Buf[:p.N])
		}
		if f.filter != nil && !f.filter(n.addr, p.Addr, p.Buf[:p.N]) {
			st.Dropped++
			continue
		}
		dst := f.nodes[p.Addr]
		if dst == nil {
			st.Dropped++
			continue
		}
		var v Verdict
		n.state[path].Decide(&imp, p.N, f.now(), &v)
		st.Dropped += uint64(v.Dropped)
		if v.Copies == 2 {
			st.Duplicated++
		}
		for c := range v.Copies {
			d := v.Delay[c]
			b := append([]byte(nil), p.Buf[:p.N]...)
			if v.Flip[c] >= 0 {
				b[v.Flip[c]/8] ^= 1 << (v.Flip[c] % 8)
				st.Corrupted++
			}
			if b := f.necks[p.Addr]; b != nil {
				q, ok := b.admit(f.now(), p.N)
				if !ok {
					st.Dropped++
					continue
				}
				d += q
			}
			dst.deliver(b, n.addr, d)
		}
	}
	return nil
}

func (n *Node) deliver(b []byte, from netip.AddrPort, after time.Duration) {
	if after > 0 {
		if s := n.f.sim; s != nil { // f.mu is held (Send)
			s.schedule(n, b, from, after)
			return
		}
		time.AfterFunc(after, func() { n.deliver(b, from, 0) })
		return
	}
	n.mu.Lock()
	if !n.closed {
		n.inbox = append(n.inbox, delivery{b, from})
	}
	n.mu.Unlock()
	select {
	case n.sig <- struct{}{}:
	default:
	}
}

// Receive waits for datagrams and copies them into pkts. (A Node is not a link.Poller: a
// receiver spinning on it would keep a synctest bubble's clock from moving.)
func (n *Node) Receive(pkts []link.Packet) (int, error) {
	for {
		n.mu.Lock()
		if n.closed {
			n.mu.Unlock()
			return 0, link.ErrClosed
		}
		k := n.take(pkts)
		n.mu.Unlock()
		if k > 0 {
			return k, nil
		}
		select {
		case <-n.sig:
		case <-n.done:
		}
	}
}

// WaitReadable returns once the inbox holds datagrams, taking none, or ErrClosed after Close
// (link.ReadWaiter): a device's receive goroutine then reads through its poller, as on a UDP link.
func (n *Node) WaitReadable() error {
	for {
		n.mu.Lock()
		closed, ready := n.closed, len(n.inbox) > 0
		n.mu.Unlock()
		switch {
		case closed:
			return link.ErrClosed
		case ready:
			return nil
		}
		select {
		case <-n.sig:
		case <-n.done:
		}
	}
}

// NewPoller returns a receiver that takes what the inbox holds without waiting, beside Receive
// (link.BusyPoller): a device busy-polls through it when its application polls an empty CQ.
func (n *Node) NewPoller() link.Poller { return Polled{n} }

// take moves datagrams from the inbox into pkts and returns how many. Called with n.mu held.
func (n *Node) take(pkts []link.Packet) int {
	k := 0
	for k < len(pkts) && k < len(n.inbox) {
		d := n.inbox[k]
		pkts[k].N = copy(pkts[k].Buf, d.buf)
		pkts[k].Addr, pkts[k].Path = d.from, 0
		k++
	}
	n.inbox = n.inbox[k:]
	if len(n.inbox) == 0 {
		n.inbox = nil
	}
	return k
}

// admit queues a datagram of n bytes and returns when it leaves the bottleneck, relative to now;
// false if the queue has no room for it.
func (b *Bottleneck) admit(now time.Time, n int) (time.Duration, bool) {
	if b.busyUntil.Before(now) {
		b.busyUntil = now
	}
	wait := b.busyUntil.Sub(now)
	if float64(wait)/float64(time.Second)*b.Rate+float64(n) > float64(b.Queue) {
		b.Dropped++
		return 0, false
	}
	b.busyUntil = b.busyUntil.Add(time.Duration(float64(n) / b.Rate * float64(time.Second)))
	b.Delivered++
	b.delaySum += wait
	b.MaxDelay = max(b.MaxDelay, wait)
	return b.busyUntil.Sub(now), true
}

// Inject delivers b to the node at to as if from, on no path and with no impairment: a forged
// datagram, for tests of what a device does with what it did not ask for.
func (f *Fabric) Inject(from, to netip.AddrPort, b []byte) {
	f.mu.Lock()
	dst := f.nodes[to]
	f.mu.Unlock()
	if dst != nil {
		dst.deliver(append([]byte(nil), b...), from, 0)
	}
}

// Tap calls fn with every datagram sent on the fabric, before impairments (for capturing one to
// replay). fn runs with the fabric locked and must not call it.
func (f *Fabric) Tap(fn func(from, to netip.AddrPort, b []byte)) {
	f.mu.Lock()
	f.tap = fn
	f.mu.Unlock()
}

// Filter calls fn with every datagram sent on the fabric, before impairments; a datagram for
// which it returns false is dropped (a loss aimed at one kind of datagram, for tests). fn runs
// with the fabric locked and must not call it; nil removes the filter.
func (f *Fabric) Filter(fn func(from, to netip.AddrPort, b []byte) bool) {
	f.mu.Lock()
	f.filter = fn
	f.mu.Unlock()
}

// Queued reports the datagrams and bytes waiting in the node's inbox.
func (n *Node) Queued() (datagrams, bytes int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, d := range n.inbox {
		bytes += len(d.buf)
	}
	return len(n.inbox), bytes
}
