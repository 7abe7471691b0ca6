package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/verbs"
)

// The many-peers workload: one receiver device with one SRD QP, in a process of its own (a child
// with --serve=softefa/peers/64), and N sender devices, each with one QP, in the bench's process,
// driven by a few goroutines. Each sender SENDs one 64-byte message carrying its GID and QP
// number; the receiver answers each with a SEND of its own, through an AH it creates for the
// answer and destroys when the answer completes, so that what stays is the device's own state
// for an idle peer. Then the receiver reports how much CPU time it used, and how often its
// engine woke, while every peer stayed idle for --duration (at least a second, starting half a
// second after the last exchange), and its heap after that, after a GC (the figure is the growth
// over a baseline taken after one warm-up peer, per peer).
//
// The receiver keeps idle peers (PeerIdleTimeout negative): with the default, peers idle for 2
// minutes are forgotten, and a slow run would measure fewer peers than it claims.

const (
	peersMsg     = 64
	peersRecvs   = 1024 // receives the receiver keeps posted
	peersDepth   = 256  // answers in flight
	peersWorkers = 16   // goroutines driving the senders
)

// rxStats is the peers receiver's report.
type rxStats struct {
	Msgs      int64  `json:"msgs"`     // messages received
	Answered  int64  `json:"answered"` // answers completed
	Heap      uint64 `json:"heap"`     // HeapAlloc after a GC (asked for)
	CPU       int64  `json:"cpu"`      // the process's CPU time so far, user and system, ns
	Wakeups   uint64 `json:"wakeups"`  // the device's EngineWakeups counter
	RxPkts    uint64 `json:"rx_pkts"`
	Forgotten uint64 `json:"forgotten"` // PeersForgotten
}

// statser is a server that reports rxStats.
type statser interface {
	// Stats reports the counters and the CPU time; with gc, also the heap after a GC.
	Stats(gc bool) (rxStats, error)
}

// peersServer is the receiver. Its goroutine (serve) owns the QP and the CQ.
type peersServer struct {
	dev      *verbs.Device
	side     *sfSide
	cancel   context.CancelFunc
	done     chan struct{} // closed when serve has returned
	err      error         // what serve returned; read after done
	msgs     atomic.Int64
	answered atomic.Int64
	once     sync.Once
}

func servePeers(j job) (server, error) {
	dev, err := verbs.NewDevice(config.Device{Addr: loopback, Paths: 1, PeerIdleTimeout: -1})
	if err != nil {
		return nil, err
	}
	side, err := newSFSide(dev, peersRecvs*j.size, peersDepth, peersRecvs)
	if err != nil {
		dev.Close()
		return nil, err
	}
	s := &peersServer{dev: dev, side: side, done: make(chan struct{})}
	for i := range peersRecvs {
		if err := side.recv(i, j.size); err != nil {
			side.close()
			dev.Close()
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		s.err = s.serve(ctx, j.size)
	}()
	return s, nil
}

// serve answers every message, through an AH for its sender (GID and QP number are the
// message's first 20 bytes); answers beyond the send queue's room wait in a backlog.
func (s *peersServer) serve(ctx context.Context, size int) error {
	sv := s.side
	type peer struct {
		gid verbs.GID
		qpn uint32
	}
	var backlog []peer
	ahs := make([]*verbs.AH, peersDepth) // the AH of the answer with that WR ID
	free := make([]int, 0, peersDepth)
	for i := range peersDepth {
		free = append(free, i)
	}
	for {
		for len(backlog) > 0 && len(free) > 0 {
			p := backlog[0]
			backlog = backlog[1:]
			ah, err := sv.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: p.gid}, PortNum: 1})
			if err != nil {
				return err
			}
			slot := free[len(free)-1]
			free = free[:len(free)-1]
			ahs[slot] = ah
			if err := sv.postTo(ah, 1, p.qpn, uint64(slot), func(x *verbs.QPEx, _ int) {
				x.WRSend()
				x.WRSetSGE(sv.mr.LKey(), sv.mr.Addr(), uint32(size))
			}); err != nil {
				return err
			}
		}
		wcs, err := sv.wait(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for _, wc := range wcs {
			switch wc.Opcode {
			case verbs.WCRecv:
				off := int(wc.WRID) * size
				var p peer
				copy(p.gid[:], sv.buf[off:off+16])
				p.qpn = binary.LittleEndian.Uint32(sv.buf[off+16:])
				backlog = append(backlog, p)
				s.msgs.Add(1)
				if err := sv.recv(int(wc.WRID), size); err != nil {
					return err
				}
			case verbs.WCSend:
				ahs[wc.WRID].Destroy()
				ahs[wc.WRID] = nil
				free = append(free, int(wc.WRID))
				s.answered.Add(1)
			}
		}
	}
}

func (s *peersServer) Addr() netip.AddrPort              { return s.dev.Addr() }
func (s *peersServer) QPN() uint32                       { return s.side.qp.QPN() }
func (s *peersServer) Peer(netip.AddrPort, uint32) error { return nil }

// Finish waits until sent answers have completed.
func (s *peersServer) Finish(sent int64) (served, error) {
	deadline := time.Now().Add(ioTimeout)
	for s.answered.Load() < sent {
		select {
		case <-s.done:
			return served{Msgs: s.answered.Load()}, fmt.Errorf("peers receiver stopped: %v", s.err)
		case <-time.After(time.Millisecond):
		}
		if time.Now().After(deadline) {
			return served{Msgs: s.answered.Load()}, fmt.Errorf("%d of %d answers completed within %v", s.answered.Load(), sent, ioTimeout)
		}
	}
	return served{Msgs: s.answered.Load()}, nil
}

func (s *peersServer) Stats(gc bool) (rxStats, error) {
	c := s.side.ctx.Counters()
	r := rxStats{Msgs: s.msgs.Load(), Answered: s.answered.Load(), CPU: cpuTime(), Wakeups: c.EngineWakeups,
		RxPkts: c.RxPkts, Forgotten: c.PeersForgotten}
	if gc {
		runtime.GC()
		runtime.GC() // the first GC's finalizers and sweeping done, the second's heap is what is live
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		r.Heap = ms.HeapAlloc
	}
	return r, nil
}

func (s *peersServer) Close() error {
	s.once.Do(func() {
		s.cancel()
		<-s.done
		s.side.close()
		s.dev.Close()
	})
	return s.err
}

// cpuTime is this process's CPU time so far, user and system, in ns.
func cpuTime() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// ---- the senders ----

// peerSender is one sender device with its QP.
type peerSender struct {
	dev  *verbs.Device
	side *sfSide
}

// senderConfig makes sender devices small (one path, small tables, 1500-byte datagrams, no
// receive spinning, sockets without GSO and GRO, whose receive buffers are 64 KiB each): they are
// the harness, ten thousand of them in one process; the receiver has the defaults.
var senderConfig = config.Device{Addr: loopback, Paths: 1, RxSpin: -1, QPNTableSize: 256, MaxQP: 4, MaxCQ: 4,
	MaxPD: 4, MaxMR: 16, MaxAH: 16, PathMTU: 1500, MTU: 256, NoOffload: true}

// newPeerSender makes a sender and exchanges one message with the receiver srv: a SEND
// carrying the sender's GID and QP number, and the answer.
func newPeerSender(srv server) (*peerSender, error) {
	dev, err := verbs.NewDevice(senderConfig)
	if err != nil {
		return nil, err
	}
	side, err := newSFSide(dev, 2*peersMsg, 1, 1)
	if err != nil {
		dev.Close()
		return nil, err
	}
	p := &peerSender{dev: dev, side: side}
	if err := p.exchange(srv); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *peerSender) exchange(srv server) error {
	s := p.side
	if err := s.connect(verbs.GID(config.GIDFromAddr(srv.Addr()))); err != nil {
		return err
	}
	if err := s.recv(1, peersMsg); err != nil {
		return err
	}
	gid := p.dev.GID()
	copy(s.buf, gid[:])
	binary.LittleEndian.PutUint32(s.buf[16:], s.qp.QPN())
	if err := s.post(1, srv.QPN(), 0, func(x *verbs.QPEx, _ int) {
		x.WRSend()
		x.WRSetSGE(s.mr.LKey(), s.mr.Addr(), peersMsg)
	}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	for need := 2; need > 0; { // the SEND's completion and the answer
		wcs, err := s.wait(ctx)
		if err != nil {
			return err
		}
		need -= len(wcs)
	}
	return nil
}

func (p *peerSender) close() {
	p.side.close()
	p.dev.Close()
}

// peersFigures runs the many-peers workload for each count of o.peers, o.runs times each.
func peersFigures(o *options) []figure {
	var figs []figure
next:
	for _, n := range o.peers {
		wl := fmt.Sprintf("%s-%d", wPeers, n)
		if !o.wants(wl) {
			continue
		}
		if err := raiseFDLimit(uint64(n) + 1024); err != nil {
			figs = append(figs, o.failure(wl, twoProc, "softefa", err)...)
			continue
		}
		done := o.progress(wl, twoProc, "softefa")
		var heap, cpu, wakeups []float64
		var idleRx uint64
		for range o.runs {
			r, err := peersRun(o, n)
			if err != nil {
				done()
				figs = append(figs, o.failure(wl, twoProc, "softefa", err)...)
				continue next
			}
			heap, cpu, wakeups = append(heap, r.heapPerPeer), append(cpu, r.idleCPU), append(wakeups, r.idleWakeups)
			idleRx = max(idleRx, r.idleRx)
			fmt.Fprintf(o.log, "%.0f B/peer (%v) ", r.heapPerPeer, r.setup.Round(time.Millisecond))
		}
		done()
		fig := func(metric, unit string, v []float64) figure {
			return figure{Transport: "softefa", Mode: twoProc, Workload: wl, Metric: metric, Value: median(v), Unit: unit, Runs: v}
		}
		idle := fig("idle-cpu", "ms/s", cpu)
		idle.Note = fmt.Sprintf("receiver's datagrams while idle: %d", idleRx)
		figs = append(figs, fig("heap/peer", "B", heap), idle, fig("idle-wakeups", "/s", wakeups))
	}
	return figs
}

type peersResult struct {
	heapPerPeer float64       // the receiver's heap growth per peer, bytes
	idleCPU     float64       // the receiver's CPU time while idle, ms per s
	idleWakeups float64       // its engine's wakeups while idle, per s
	idleRx      uint64        // datagrams it received while idle (none expected)
	setup       time.Duration // how long the n exchanges took
}

func peersRun(o *options, n int) (res peersResult, err error) {
	c, err := startChild(job{transport: "softefa", kind: kindPeers, size: peersMsg}, 0)
	if err != nil {
		return res, err
	}
	defer func() { err = closeServer(c, err) }()
	var senders []*peerSender
	defer func() {
		for _, p := range senders {
			p.close()
		}
	}()
	// One warm-up peer first: the receiver's first traffic allocates its receive buffers and
	// queues, which are the device's, not a peer's.
	p, err := newPeerSender(c)
	if err != nil {
		return res, err
	}
	senders = append(senders, p)
	if _, err := c.Finish(1); err != nil {
		return res, err
	}
	st0, err := c.Stats(true)
	if err != nil {
		return res, err
	}
	start := time.Now()
	all, err := startSenders(c, n)
	senders = append(senders, all...)
	if err != nil {
		return res, err
	}
	if _, err := c.Finish(int64(n + 1)); err != nil {
		return res, err
	}
	res.setup = time.Since(start)
	st1, err := c.Stats(false)
	if err != nil {
		return res, err
	}
	// The idle window starts once the receiver has had time to slim its idle peers (250 ms
	// after their last traffic: docs/architecture.md, "Memory per peer").
	time.Sleep(500 * time.Millisecond)
	sa, err := c.Stats(false)
	if err != nil {
		return res, err
	}
	window := max(o.duration, time.Second)
	time.Sleep(window) // the workload: every peer idle
	st2, err := c.Stats(false)
	if err != nil {
		return res, err
	}
	st3, err := c.Stats(true) // the heap, after GCs (not in the idle window: they cost CPU)
	if err != nil {
		return res, err
	}
	if st1.Msgs != int64(n+1) || st1.Forgotten != 0 {
		return res, fmt.Errorf("receiver got %d messages, forgot %d peers; want %d and none", st1.Msgs, st1.Forgotten, n+1)
	}
	idle := float64(st2.CPU-sa.CPU) / 1e6 // ms
	res.heapPerPeer = (float64(st3.Heap) - float64(st0.Heap)) / float64(n)
	res.idleCPU = idle / window.Seconds()
	res.idleWakeups = float64(st2.Wakeups-sa.Wakeups) / window.Seconds()
	res.idleRx = st2.RxPkts - sa.RxPkts
	return res, nil
}

// startSenders makes n senders, peersWorkers at a time, each exchanging one message with srv.
func startSenders(srv server, n int) ([]*peerSender, error) {
	out := make([]*peerSender, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, peersWorkers)
	for w := range peersWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				p, err := newPeerSender(srv)
				if err != nil {
					errs[w] = fmt.Errorf("sender %d: %w", i, err)
					next.Store(int64(n)) // the others stop too
					return
				}
				out[i] = p
			}
		}()
	}
	wg.Wait()
	var made []*peerSender
	for _, p := range out {
		if p != nil {
			made = append(made, p)
		}
	}
	return made, errors.Join(errs...)
}

// raiseFDLimit raises the limit on open files to need: each sender device holds a UDP socket (the
// epoll instance their receive loops wait through is the process's). The soft limit goes up to
// the hard one; the hard one too where the process may (CAP_SYS_RESOURCE).
func raiseFDLimit(need uint64) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return err
	}
	if lim.Cur >= need {
		return nil
	}
	lim.Cur = need
	if lim.Max < need {
		lim.Max = need
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return fmt.Errorf("the many-peers workload needs %d open files; the hard limit is lower, and raising it failed: %w", need, err)
		}
		return nil
	}
	return syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
}
