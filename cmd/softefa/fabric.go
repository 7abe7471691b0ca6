package main

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link/memlink"
)

// softefa fabric: a userspace multipath network between UDP clients and one server. Clients send
// to the fabric's address instead of the server's; the fabric gives each client an address of its
// own towards the server (like a NAT), picks a path for every datagram by hashing its source port
// (as ECMP hashes the 5-tuple), and applies that path's impairments in both directions. Hashing
// a handful of ports onto as many paths collides often (two or three of a device's ports on one
// path, another path idle); --spread instead gives each direction's flows the paths in turn, as a
// perfectly balanced ECMP would, so that "one of 4 paths down" means a quarter of the flows.
//
// softefa devices name their endpoint in the datagram header, and their source ports in COOKIE
// frames (docs/wire.md); the fabric rewrites both, and the checksum, so that each side sees the
// other at a fabric address, sending from it, and replies through the fabric. With --raw it forwards any UDP payload untouched (quic-go, kcp-go, ...).

type fabricOpts struct {
	listen, to string
	clientAddr string // where the first client appears to the server (empty: any free port)
	raw        bool
	spread     bool
	paths      int
	imp        memlink.Impairment
	down       string
	downAfter  time.Duration
	downPaths  []int
	configFile string
	statsEvery time.Duration
	duration   time.Duration
	seed       uint64
	out        io.Writer
}

// fabricConfig is the small file --config reads: the default impairment and per-path ones.
type fabricConfig struct {
	Paths   int                       `json:"paths"`
	Default impairmentJSON            `json:"default"`
	Path    map[string]impairmentJSON `json:"path"`
}

type impairmentJSON struct {
	Loss      float64 `json:"loss"`
	Duplicate float64 `json:"duplicate"`
	Corrupt   float64 `json:"corrupt"`
	Delay     string  `json:"delay"`
	Jitter    string  `json:"jitter"`
	Down      bool    `json:"down"`
	ToBad     float64 `json:"to_bad"`
	ToGood    float64 `json:"to_good"`
	BadLoss   float64 `json:"bad_loss"`
	Rate      float64 `json:"rate"`
	Queue     int     `json:"queue"`
}

func (j impairmentJSON) impairment() (memlink.Impairment, error) {
	imp := memlink.Impairment{Loss: j.Loss, Duplicate: j.Duplicate, Corrupt: j.Corrupt, Down: j.Down, ToBad: j.ToBad,
		ToGood: j.ToGood, BadLoss: j.BadLoss, Rate: j.Rate, Queue: j.Queue}
	var err error
	if j.Delay != "" {
		if imp.Delay, err = time.ParseDuration(j.Delay); err != nil {
			return imp, err
		}
	}
	if j.Jitter != "" {
		imp.Jitter, err = time.ParseDuration(j.Jitter)
	}
	return imp, err
}

func parseFabric(args []string, out io.Writer) (*fabricOpts, []memlink.Impairment, error) {
	o := &fabricOpts{out: out}
	fs := flag.NewFlagSet("fabric", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&o.listen, "listen", "127.0.0.1:20000", "the address clients send to")
	fs.StringVar(&o.to, "to", "", "the server's address")
	fs.StringVar(&o.clientAddr, "client-addr", "", "the address the first client appears at to the server (default: a free port), so that a server can answer through the fabric")
	fs.BoolVar(&o.raw, "raw", false, "forward any UDP payload untouched (for non-softefa peers)")
	fs.BoolVar(&o.spread, "spread", false, "give each direction's flows paths in turn as they appear (a perfectly balanced ECMP), not by hash")
	fs.IntVar(&o.paths, "paths", 4, "paths, 1 to 64")
	fs.Float64Var(&o.imp.Loss, "loss", 0, "drop probability on every path")
	fs.Float64Var(&o.imp.Duplicate, "dup", 0, "duplication probability")
	fs.Float64Var(&o.imp.Corrupt, "corrupt", 0, "probability of one flipped bit")
	fs.DurationVar(&o.imp.Delay, "delay", 0, "one-way delay")
	fs.DurationVar(&o.imp.Jitter, "jitter", 0, "extra uniform delay in [0, jitter): reorders")
	fs.Float64Var(&o.imp.Rate, "rate", 0, "bytes per second per path (0: unlimited)")
	fs.IntVar(&o.imp.Queue, "queue", 256<<10, "queue bytes per path with --rate")
	fs.StringVar(&o.down, "down", "", "paths that drop everything, e.g. 1,3; or busiest: the one that carried most so far (with --down-after)")
	fs.DurationVar(&o.downAfter, "down-after", 0, "take the --down paths down this long after start, not at once")
	fs.StringVar(&o.configFile, "config", "", "a JSON file with paths, default and per-path impairments (instead of the impairment flags)")
	fs.DurationVar(&o.statsEvery, "stats", 0, "print per-path counters this often to stderr")
	fs.DurationVar(&o.duration, "duration", 0, "stop after this long (0: until interrupted)")
	fs.Uint64Var(&o.seed, "seed", 1, "random seed")
	if err := parseFlags(fs, "softefa fabric --to SERVER [flags]", args); err != nil {
		return nil, nil, err
	}
	set := setFlags(fs)
	if o.to == "" {
		return nil, nil, errors.New("--to ADDR is required")
	}
	for _, a := range []struct{ flag, addr string }{{"--to", o.to}, {"--listen", o.listen}, {"--client-addr", o.clientAddr}} {
		if a.addr == "" && a.flag == "--client-addr" {
			continue
		}
		if err := checkHostPort(a.flag, a.addr); err != nil {
			return nil, nil, err
		}
	}
	switch {
	case o.statsEvery < 0:
		return nil, nil, fmt.Errorf("--stats %v: must not be negative", o.statsEvery)
	case o.duration < 0:
		return nil, nil, fmt.Errorf("--duration %v: must not be negative (0: until interrupted)", o.duration)
	case o.downAfter < 0:
		return nil, nil, fmt.Errorf("--down-after %v: must not be negative", o.downAfter)
	case set["down-after"] && o.down == "":
		return nil, nil, errors.New("--down-after: which paths? give --down too")
	}
	if o.configFile == "" {
		if err := checkImpairment(o.imp, "--"); err != nil {
			return nil, nil, err
		}
	} else {
		for _, f := range []string{"loss", "dup", "corrupt", "delay", "jitter", "rate", "queue"} {
			if set[f] {
				return nil, nil, fmt.Errorf("--%s with --config: give the impairments in the file or as flags, not both", f)
			}
		}
	}
	if o.paths < 1 || o.paths > 64 {
		return nil, nil, fmt.Errorf("--paths %d: 1 to 64", o.paths)
	}
	imps := make([]memlink.Impairment, o.paths)
	if o.configFile != "" {
		b, err := os.ReadFile(o.configFile)
		if err != nil {
			return nil, nil, fmt.Errorf("--config: %w", err)
		}
		var c fabricConfig
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return nil, nil, fmt.Errorf("--config %s: %w", o.configFile, err)
		}
		if c.Paths > 0 {
			if set["paths"] && c.Paths != o.paths {
				return nil, nil, fmt.Errorf("--paths %d with --config: the file says %d paths", o.paths, c.Paths)
			}
			o.paths = c.Paths
			imps = make([]memlink.Impairment, o.paths)
		}
		if c.Paths < 0 {
			return nil, nil, fmt.Errorf("--config %s: %d paths: 1 to 64", o.configFile, c.Paths)
		}
		for k := range c.Path {
			if i, err := strconv.Atoi(k); err != nil || i < 0 || i >= o.paths {
				return nil, nil, fmt.Errorf("--config %s: path %q: path numbers are 0 to %d", o.configFile, k, o.paths-1)
			}
		}
		def, err := c.Default.impairment()
		if err != nil {
			return nil, nil, fmt.Errorf("--config %s: default: %w", o.configFile, err)
		}
		o.imp = def
		for i := range imps {
			imps[i] = def
			if pj, ok := c.Path[strconv.Itoa(i)]; ok {
				if imps[i], err = pj.impairment(); err != nil {
					return nil, nil, fmt.Errorf("--config %s: path %d: %w", o.configFile, i, err)
				}
			}
		}
	} else {
		for i := range imps {
			imps[i] = o.imp
		}
	}
	if o.paths < 1 || o.paths > 64 {
		return nil, nil, fmt.Errorf("--config %s: %d paths: 1 to 64", o.configFile, o.paths)
	}
	if o.configFile != "" {
		for i, imp := range imps {
			if err := checkImpairment(imp, fmt.Sprintf("--config %s: path %d: ", o.configFile, i)); err != nil {
				return nil, nil, err
			}
		}
	}
	if o.down == "busiest" {
		if o.downAfter == 0 {
			return nil, nil, errors.New("--down busiest needs --down-after")
		}
		return o, imps, nil
	}
	for _, s := range strings.Split(o.down, ",") {
		if s == "" {
			continue
		}
		i, err := strconv.Atoi(s)
		if err != nil || i < 0 || i >= o.paths {
			return nil, nil, fmt.Errorf("--down %q: path numbers below %d", o.down, o.paths)
		}
		imps[i].Down = o.downAfter == 0
		o.downPaths = append(o.downPaths, i)
	}
	return o, imps, nil
}

// checkImpairment refuses an impairment the paths cannot apply; prefix names where it came
// from ("--" for the flags, whose names it then gives).
func checkImpairment(imp memlink.Impairment, prefix string) error {
	name := func(flagName, field string) string {
		if prefix == "--" {
			return "--" + flagName
		}
		return prefix + field
	}
	for _, p := range []struct {
		flag, field string
		v           float64
	}{{"loss", "loss", imp.Loss}, {"dup", "duplicate", imp.Duplicate}, {"corrupt", "corrupt", imp.Corrupt},
		{"", "to_bad", imp.ToBad}, {"", "to_good", imp.ToGood}, {"", "bad_loss", imp.BadLoss}} {
		if !(p.v >= 0 && p.v <= 1) {
			return fmt.Errorf("%s %v: a probability is 0 to 1", name(p.flag, p.field), p.v)
		}
	}
	switch {
	case imp.Delay < 0:
		return fmt.Errorf("%s %v: must not be negative", name("delay", "delay"), imp.Delay)
	case imp.Jitter < 0:
		return fmt.Errorf("%s %v: must not be negative", name("jitter", "jitter"), imp.Jitter)
	case !(imp.Rate >= 0) || math.IsInf(imp.Rate, 0):
		return fmt.Errorf("%s %v: bytes per second, 0 for unlimited", name("rate", "rate"), imp.Rate)
	case imp.Queue < 0 || imp.Rate > 0 && imp.Queue == 0:
		return fmt.Errorf("%s %d: a rate-limited path needs a positive queue (bytes)", name("queue", "queue"), imp.Queue)
	}
	return nil
}

func runFabric(args []string) error {
	o, imps, err := parseFabric(args, os.Stdout)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	fb, err := newFabric(o, imps)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "softefa fabric: %s -> %s, %d paths\n", fb.front.LocalAddr(), o.to, o.paths)
	return fb.run(ctx)
}

// fabric is a running fabric.
type fabric struct {
	o             *fabricOpts
	server        netip.AddrPort
	front         *net.UDPConn
	frontOverflow overflowCounter
	line          *delayLine    // every path's delayed datagrams (its own lock)
	done          chan struct{} // closed when the fabric stops: the delay line ends

	mu      sync.Mutex // guards below
	paths   []*memlink.Path
	imps    []memlink.Impairment
	stats   []fabricPathStats
	clients map[netip.AddrPort]*fabricClient // by the client's endpoint
	flows   map[flowKey]int                  // --spread: each flow's path
	nflows  map[bool]int                     // --spread: flows seen per direction (towards the server or not)
	wg      sync.WaitGroup
}

// flowKey names a flow by its ports: the 4-tuple less the addresses, which are the same here.
type flowKey struct{ src, dst uint16 }

type fabricPathStats struct{ In, Delivered, Dropped, Duplicated, Corrupted uint64 }

// fabricSocketBuffer is each fabric socket's buffer, each way: the fabric reads every datagram
// with a system call of its own, so a sender's burst must fit in the buffer while it catches up.
const fabricSocketBuffer = 16 << 20

// overflowCounter keeps one socket's count of datagrams the kernel dropped for want of buffer.
type overflowCounter struct{ n atomic.Uint32 }

// read reads one datagram from c, noting the socket's overflow count as the kernel reports it.
func (o *overflowCounter) read(c *net.UDPConn, buf, oob []byte) (int, netip.AddrPort, error) {
	n, oobn, _, src, err := c.ReadMsgUDPAddrPort(buf, oob)
	if err == nil {
		if k, ok := socketOverflows(oob[:oobn]); ok {
			o.n.Store(k)
		}
	}
	return n, src, err
}

// fabricClient is one client's socket towards the server.
type fabricClient struct {
	endpoint netip.AddrPort // where the client receives (softefa: its device endpoint)
	conn     *net.UDPConn
	overflow overflowCounter
}

func newFabric(o *fabricOpts, imps []memlink.Impairment) (*fabric, error) {
	server, err := parseAddr(o.to)
	if err != nil {
		return nil, err
	}
	la, err := parseAddr(o.listen)
	if err != nil {
		return nil, err
	}
	front, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(la))
	if err != nil {
		return nil, err
	}
	tuneFabricSocket(front)
	fb := &fabric{o: o, server: server, front: front, imps: imps, stats: make([]fabricPathStats, o.paths),
		clients: make(map[netip.AddrPort]*fabricClient), flows: make(map[flowKey]int), nflows: make(map[bool]int),
		line: newDelayLine(), done: make(chan struct{})}
	for i := range o.paths {
		fb.paths = append(fb.paths, memlink.NewPath(o.seed, uint64(i)))
	}
	return fb, nil
}

func (fb *fabric) frontAddr() netip.AddrPort {
	ap := fb.front.LocalAddr().(*net.UDPAddr).AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

func (fb *fabric) run(ctx context.Context) error {
	fb.wg.Add(2)
	go fb.readFront()
	go func() {
		defer fb.wg.Done()
		fb.line.run(fb.done)
	}()
	var tick <-chan time.Time
	if fb.o.statsEvery > 0 {
		t := time.NewTicker(fb.o.statsEvery)
		defer t.Stop()
		tick = t.C
	}
	var down <-chan time.Time
	if fb.o.downAfter > 0 && (len(fb.o.downPaths) > 0 || fb.o.down == "busiest") {
		t := time.NewTimer(fb.o.downAfter)
		defer t.Stop()
		down = t.C
	}
	for {
		select {
		case <-down:
			fb.mu.Lock()
			if fb.o.down == "busiest" {
				busiest := 0
				for i, st := range fb.stats {
					if st.In > fb.stats[busiest].In {
						busiest = i
					}
				}
				fb.o.downPaths = []int{busiest}
			}
			for _, i := range fb.o.downPaths {
				fb.imps[i].Down = true
			}
			fb.mu.Unlock()
			fmt.Fprintf(os.Stderr, "softefa fabric: paths %v down\n", fb.o.downPaths)
		case <-ctx.Done():
			fb.close()
			fb.printStats(fb.o.out)
			return nil
		case <-tick:
			fb.printStats(os.Stderr)
		}
	}
}

func (fb *fabric) close() {
	close(fb.done)
	fb.front.Close()
	fb.mu.Lock()
	for _, c := range fb.clients {
		c.conn.Close()
	}
	fb.mu.Unlock()
	fb.wg.Wait()
}

func (fb *fabric) printStats(w io.Writer) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	fmt.Fprintf(w, "%-5s %10s %10s %10s %10s %10s\n", "path", "in", "delivered", "dropped", "duplicated", "corrupted")
	for i, s := range fb.stats {
		fmt.Fprintf(w, "%-5d %10d %10d %10d %10d %10d\n", i, s.In, s.Delivered, s.Dropped, s.Duplicated, s.Corrupted)
	}
	fmt.Fprintf(w, "overflowed %d\n", fb.overflowed())
}

// overflowed counts the datagrams the kernel dropped at the fabric's own sockets, before the
// fabric read them: losses no path made, which a measurement through the fabric must not have.
// Caller holds fb.mu.
func (fb *fabric) overflowed() uint64 {
	n := uint64(fb.frontOverflow.n.Load())
	for _, c := range fb.clients {
		n += uint64(c.overflow.n.Load())
	}
	return n
}

// readFront carries datagrams from clients to the server.
func (fb *fabric) readFront() {
	defer fb.wg.Done()
	buf, oob := make([]byte, 65536), make([]byte, fabricOOBSize)
	for {
		n, src, err := fb.frontOverflow.read(fb.front, buf, oob)
		if err != nil {
			return
		}
		src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		endpoint := src
		if !fb.o.raw {
			h, _, err := wire.ParseHeader(buf[:n])
			if err != nil {
				continue // not a softefa datagram, or not one this fabric can rewrite (sealed)
			}
			endpoint = netip.AddrPortFrom(src.Addr(), h.SrcPort)
		}
		c, err := fb.client(endpoint)
		if err != nil {
			continue
		}
		if !fb.o.raw && !wire.RewriteSource(buf[:n], c.port()) {
			continue
		}
		fb.forward(buf[:n], src, c.conn, fb.server)
	}
}

func (c *fabricClient) port() uint16 { return uint16(c.conn.LocalAddr().(*net.UDPAddr).Port) }

// client returns the socket that stands for endpoint towards the server, making it on first use.
func (fb *fabric) client(endpoint netip.AddrPort) (*fabricClient, error) {
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if c := fb.clients[endpoint]; c != nil {
		return c, nil
	}
	at := netip.AddrPortFrom(fb.frontAddr().Addr(), 0)
	if fb.o.clientAddr != "" && len(fb.clients) == 0 {
		a, err := parseAddr(fb.o.clientAddr)
		if err != nil {
			return nil, err
		}
		at = a
	}
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(at))
	if err != nil {
		return nil, err
	}
	tuneFabricSocket(conn)
	c := &fabricClient{endpoint: endpoint, conn: conn}
	fb.clients[endpoint] = c
	fb.wg.Add(1)
	go fb.readBack(c)
	return c, nil
}

// readBack carries the server's datagrams to one client.
func (fb *fabric) readBack(c *fabricClient) {
	defer fb.wg.Done()
	buf, oob := make([]byte, 65536), make([]byte, fabricOOBSize)
	for {
		n, src, err := c.overflow.read(c.conn, buf, oob)
		if err != nil {
			return
		}
		if !fb.o.raw && !wire.RewriteSource(buf[:n], fb.frontAddr().Port()) {
			continue
		}
		fb.forward(buf[:n], src, fb.front, c.endpoint)
	}
}

// forward sends b from conn to dst through the path its source port hashes to.
func (fb *fabric) forward(b []byte, src netip.AddrPort, conn *net.UDPConn, dst netip.AddrPort) {
	h := fnv.New32a()
	var k [4]byte
	binary.BigEndian.PutUint16(k[:], src.Port())
	binary.BigEndian.PutUint16(k[2:], dst.Port())
	h.Write(k[:])
	path := int(h.Sum32() % uint32(len(fb.paths)))
	var v memlink.Verdict
	fb.mu.Lock()
	if fb.o.spread {
		k := flowKey{src.Port(), dst.Port()}
		p, ok := fb.flows[k]
		if !ok {
			up := dst == fb.server
			p = fb.nflows[up] % len(fb.paths)
			fb.nflows[up]++
			fb.flows[k] = p
		}
		path = p
	}
	fb.paths[path].Decide(&fb.imps[path], len(b), time.Now(), &v)
	st := &fb.stats[path]
	st.In++
	st.Dropped += uint64(v.Dropped)
	st.Delivered += uint64(v.Copies)
	if v.Copies == 2 {
		st.Duplicated++
	}
	fb.mu.Unlock()
	for c := range v.Copies {
		out := append([]byte(nil), b...)
		if v.Flip[c] >= 0 {
			out[v.Flip[c]/8] ^= 1 << (v.Flip[c] % 8)
			fb.mu.Lock()
			st.Corrupted++
			fb.mu.Unlock()
		}
		if v.Delay[c] > 0 {
			fb.line.add(delayed{due: time.Now().Add(v.Delay[c]), b: out, conn: conn, dst: dst})
		} else {
			_, _ = conn.WriteToUDPAddrPort(out, dst)
		}
	}
}

// delayed is a datagram held back by a path's delay.
type delayed struct {
	due  time.Time
	b    []byte
	conn *net.UDPConn
	dst  netip.AddrPort
}

// delayLine sends the fabric's delayed datagrams, of every path, in the order they fall due, from
// one goroutine: a timer per datagram sent them in whatever order the scheduler ran the timers'
// goroutines, and a goroutine per path let one path fall behind the others while its goroutine
// waited for a processor; on 2 busy cores either reordered datagrams by milliseconds where the
// paths' delays asked for 200 µs. Late, the one goroutine delays every datagram due by then
// alike, and reorders none.
type delayLine struct {
	send func(delayed) // sends a datagram that fell due
	mu   sync.Mutex
	q    delayHeap
	wake chan struct{} // a datagram was added (one slot: a wake-up pending is enough)
}

func newDelayLine() *delayLine {
	return &delayLine{send: func(d delayed) { _, _ = d.conn.WriteToUDPAddrPort(d.b, d.dst) }, wake: make(chan struct{}, 1)}
}

func (l *delayLine) add(d delayed) {
	l.mu.Lock()
	heap.Push(&l.q, d)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run sends datagrams as they fall due until done is closed.
func (l *delayLine) run(done <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		l.mu.Lock()
		var wait time.Duration = -1
		var now time.Time
		for l.q.Len() > 0 {
			if now.IsZero() {
				now = time.Now()
			}
			if wait = l.q[0].due.Sub(now); wait > 0 {
				break
			}
			d := heap.Pop(&l.q).(delayed)
			l.mu.Unlock()
			l.send(d)
			l.mu.Lock()
			wait, now = -1, time.Time{}
		}
		l.mu.Unlock()
		var fire <-chan time.Time
		if wait > 0 {
			t.Reset(wait)
			fire = t.C
		}
		select {
		case <-done:
			return
		case <-l.wake:
		case <-fire:
		}
	}
}

// delayHeap orders delayed datagrams by when they fall due, earliest first; datagrams due at
// the same instant keep no particular order (the clock's resolution makes that rare).
type delayHeap []delayed

func (h delayHeap) Len() int           { return len(h) }
func (h delayHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h delayHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)        { *h = append(*h, x.(delayed)) }
func (h *delayHeap) Pop() any {
	old := *h
	d := old[len(old)-1]
	old[len(old)-1] = delayed{}
	*h = old[:len(old)-1]
	return d
}
