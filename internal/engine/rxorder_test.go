package engine

import (
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/link"
	"github.com/softefa/softefa/link/memlink"
)

// groLink is a memlink node read as a UDP socket with GRO is read: a read takes everything the
// socket holds into the reader's own buffers and hands it out one datagram a call, the rest
// waiting there for the next read, where no wait on the socket sees it. It counts the receive
// loop's waits that began while the loop's own last read had left datagrams behind (a busy poll
// of the timer loop may read beside it: what it leaves behind is its own to read again).
type groLink struct {
	*memlink.Node
	mu            sync.Mutex
	pend          []link.Packet
	leftByLoop    bool // the receive loop's last read left datagrams in pend
	waitedHolding atomic.Int32
}

func (g *groLink) NewPoller() link.Poller { return g }

func (g *groLink) TryReceive(pkts []link.Packet) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.pend) == 0 {
		buf := make([]link.Packet, 64)
		for i := range buf {
			buf[i].Buf = make([]byte, 9000)
		}
		n, err := g.Node.NewPoller().TryReceive(buf)
		if err != nil {
			return 0, err
		}
		g.pend = buf[:n]
	}
	n := 0
	if len(g.pend) > 0 && len(pkts) > 0 {
		p := g.pend[0]
		g.pend = g.pend[1:]
		pkts[0].N = copy(pkts[0].Buf, p.Buf[:p.N])
		pkts[0].Addr, pkts[0].Path = p.Addr, p.Path
		n = 1
	}
	if calledBy("rxOrdered") {
		g.leftByLoop = len(g.pend) > 0
	}
	return n, nil
}

func (g *groLink) WaitReadable() error {
	g.mu.Lock()
	if g.leftByLoop {
		g.waitedHolding.Add(1)
	}
	g.mu.Unlock()
	return g.Node.WaitReadable()
}

// calledBy reports whether a method of Device named fn is on the caller's stack.
func calledBy(fn string) bool {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(2, pcs)])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, ".(*Device)."+fn) {
			return true
		}
		if !more {
			return false
		}
	}
}

// The receive loop reads until a read finds nothing before it waits for the socket: a read that
// leaves datagrams in the reader's buffers (the rest of a GRO run) would otherwise leave them
// there until the next datagram came (a retransmission, when the sender has nothing more to send).
// (Spinning after traffic, as by default, the loop reads again anyway: this is the receiver with
// the spin off.) Three SENDs of 1 KiB (a datagram each) rung together arrive together at a device
// whose link hands out one datagram a read.
func TestReceiveLoopDrainsReaderBeforeWaiting(t *testing.T) {
	f := memlink.New(1)
	an := f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)
	bn := &groLink{Node: f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)}
	a := newAccessRigOn(t, config.Device{Addr: an.LocalAddr(), Link: an, Paths: 1})
	b := newAccessRigOn(t, config.Device{Addr: bn.LocalAddr(), Link: bn, Paths: 1, RxSpin: -1})
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	const sends, size = 3, 1024
	for i := range sends {
		efaio.RxDesc(b.q.rq.ring[i*efaio.RxDescSize:][:efaio.RxDescSize]).Encode(&efaio.RxDescFields{
			Addr: b.a.iova + uint64(size*i), ReqID: uint16(i), Length: size, LKey: b.a.lkey, First: true, Last: true})
		a.q.sq.slot(uint16(i)).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: uint16(i), Length: 1, AHN: ah.ahn, QKey: 9,
			DestQPN: uint16(b.q.qpn), CompReq: true, Phase: a.q.sq.phase,
			SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: size, LKey: a.a.lkey, Addr: a.a.iova}}})
	}
	atomic.StoreUint32(b.q.rq.db, sends)
	b.d.Ring(b.q)
	atomic.StoreUint32(a.q.sq.db, sends)
	a.d.Ring(a.q)
	for b.q.recvCQ.Written() < sends {
		runtime.Gosched()
	}
	if n := bn.waitedHolding.Load(); n != 0 {
		t.Fatalf("the receive loop waited for the socket %d times while its reader held datagrams", n)
	}
}

// emptyReads is a memlink node that counts the receive loop's reads: those that found nothing,
// and those that found datagrams.
type emptyReads struct {
	*memlink.Node
	n    atomic.Int64 // the receive loop's reads that found nothing
	full atomic.Int64 // and those that found datagrams
}

func (e *emptyReads) NewPoller() link.Poller { return e }

// shortReads is emptyReads that reads at most short datagrams a call, and tells whether it left
// some behind (link.Backlogger), as a UDP link with GRO does: a run's rest waits in its buffers,
// and a read takes at most 8 runs.
type shortReads struct {
	*emptyReads
	short int
}

func (s *shortReads) NewPoller() link.Poller { return s }

func (s *shortReads) TryReceive(pkts []link.Packet) (int, error) {
	return s.emptyReads.TryReceive(pkts[:min(len(pkts), s.short)])
}

func (s *shortReads) Backlogged() bool { q, _ := s.Queued(); return q > 0 }

func (e *emptyReads) TryReceive(pkts []link.Packet) (int, error) {
	n, err := e.Node.NewPoller().TryReceive(pkts)
	if err == nil && calledBy("rxOrdered") {
		if n == 0 {
			e.n.Add(1)
		} else {
			e.full.Add(1)
		}
	}
	return n, err
}

// With one Go processor the receive loop does not spin after traffic (spinnable): a goroutine
// that yields there is run again at once whenever nothing else is runnable, and the network poller
// is not asked, so every goroutine waiting for the network waited for the spin's end (the demo's
// two devices in one process with GOMAXPROCS 1: 236 µs a 4 KiB SEND, 74 without the spin).
func TestReceiveLoopLeavesTheOnlyProcessor(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	if n := emptyReadsAfterTraffic(t, false); n > 1 {
		t.Errorf("the receive loop read %d times more after traffic, finding nothing, on the only processor; want it waiting", n)
	}
}

// While a goroutine busy-polls the device (PollNetwork: it reads the socket itself whenever its
// CQ is empty), the receive loop neither spins after traffic nor waits on the socket, but parks:
// two threads spinning for one device took the cores of two processes on two cores. (With the
// rule taken out, the loop read 58-612 times more, finding nothing. Without a poller it spins, but
// stops when its yields take long, which a test cannot rule out: no control case.) Here the park
// lasts an hour, and the test's own polls take the SEND.
func TestReceiveLoopWaitsWhileBusyPolled(t *testing.T) {
	if n := emptyReadsAfterTraffic(t, true); n > 1 {
		t.Errorf("the receive loop read %d times more after traffic, finding nothing; want it waiting", n)
	}
}

// An arm of a CQ ends the receive loop's park beside a busy poller (EndBusy): the application is
// about to sleep, and a SEND that comes next is taken by the loop, with no poll, although the park
// would last an hour.
func TestReceiveLoopResumesOnArm(t *testing.T) {
	a, b, f, bn := parkablePair(t, func(*config.Device) {})
	b.d.busyAt.Store(monoNow() + int64(time.Hour)) // a poller that never stops, until the arm
	// A stray datagram wakes a loop that was already waiting on the socket: it then parks.
	stray := f.Listen(netip.MustParseAddrPort("10.0.0.3:4791"), 1)
	if err := stray.Send([]link.Packet{{Buf: []byte("stray"), N: 5, Addr: bn.LocalAddr()}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !b.d.parkedRx(); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("the receive loop does not park beside a busy poller")
		}
	}
	b.d.ArmCQ(b.q.recvCQ)
	sendOne(t, a, b)
	for deadline := time.Now().Add(10 * time.Second); b.q.recvCQ.Written() < 1; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("the SEND was not taken: the receive loop still parks after the arm")
		}
	}
}

// After the one read that ends a park (its look), the receive loop parks again while the poller
// polls, though the look found a datagram: in a stream every look finds some, and a loop that
// read on after one was a second thread busy for the device (a sender's loop did 30,000 reads a
// second beside its application). Here the park lasts an hour, the poller never stops, and the
// test ends the park itself, as the park's timer would, while a SEND waits in the socket.
func TestReceiveLoopParksAgainAfterItsLook(t *testing.T) {
	a, b, bn := parkedBesidePoller(t, time.Duration(0), 0)
	for i := 1; i <= 3; i++ { // (and again: each park ends with a look)
		sendNth(t, a, b, i) // it waits in b's socket: nobody reads while the loop parks
		lookUntilTaken(t, b, bn, uint32(i+1), func() {})
	}
}

// A poller that polled while the receive loop was parked, but not within busyQuiet when the loop
// looks (it was posting: a sender posts for longer between its polls), keeps the loop parked: a
// loop that went by busyQuiet alone spun after traffic beside the poller until its next poll.
// Here the loop would spin for an hour after traffic (RxSpin).
func TestReceiveLoopParksAgainWhenPolledDuringThePark(t *testing.T) {
	a, b, bn := parkedBesidePoller(t, time.Hour, 0)
	sendNth(t, a, b, 1)
	lookUntilTaken(t, b, bn, 2, pollDuringThePark(b))
}

// A poller that stops polling (without arming: nothing tells the loop) holds the loop in its park
// for one park more at most: the look after a park in which nobody polled leaves it, and a SEND
// that comes next is taken at once, although the park would last an hour.
func TestReceiveLoopLeavesTheParkWhenThePollerStops(t *testing.T) {
	a, b, bn := parkedBesidePoller(t, time.Duration(0), 0)
	pollDuringThePark(b)() // its last poll
	look(t, b, bn)
	waitRx(t, b, func() bool { return b.d.parkedRx() }, "park again after a park in which the application polled")
	look(t, b, bn) // nobody polled in this one
	waitRx(t, b, func() bool { return b.d.rxWaits.Load() == rxOnSocket }, "leave its park after a park in which nobody polled")
	sendNth(t, a, b, 1)
	waitRx(t, b, func() bool { return b.q.recvCQ.Written() == 2 }, "take the SEND that came after")
}

// Polls that find completions, and no read of the socket by the application (a sender's polls
// find the completions the loop made), have the loop park after the traffic it read, not wait on
// the socket for the next: with only busyQuiet to go by, it waited and was woken for every batch.
func TestReceiveLoopParksBesideAPollThatFoundCompletions(t *testing.T) {
	defer pollStale.Store(pollStale.Swap(int64(time.Hour))) // (the poll below comes during a wait)
	a, b, _, _ := parkablePair(t, func(c *config.Device) { c.PollMin, c.PollMax = time.Hour, time.Hour })
	sendOne(t, a, b)
	waitRx(t, b, func() bool { return settled(a, b) }, "take the first SEND and wait on the socket")
	b.d.Polled() // (and busyAt never set: no poll of the application read the socket)
	sendNth(t, a, b, 1)
	waitRx(t, b, func() bool { return b.q.recvCQ.Written() == 2 && b.d.parkedRx() }, "take the SEND and park")
}

// A poll made before a long wait on the socket (longer than pollStale, here any) is no busy
// polling beside the loop: the loop that a datagram wakes takes it and waits again, although the
// park would last an hour. A loop that kept the mark through its wait parked after the next
// burst for a millisecond, as long as the application polled at all between bursts.
func TestReceiveLoopForgetsPollsBeforeALongWait(t *testing.T) {
	defer pollStale.Store(pollStale.Swap(-1))
	a, b, _, _ := parkablePair(t, func(c *config.Device) { c.RxSpin, c.PollMin, c.PollMax = -1, time.Hour, time.Hour })
	sendOne(t, a, b)
	waitRx(t, b, func() bool { return settled(a, b) }, "take the first SEND and wait on the socket")
	b.d.Polled() // while the loop waits
	sendNth(t, a, b, 1)
	waitRx(t, b, func() bool { return b.q.recvCQ.Written() == 2 && b.d.rxWaits.Load() == rxOnSocket }, "take the SEND and wait on the socket again")
}

// A look that fills its batch goes on: more datagrams wait than one read takes, and the loop
// reads on while its reads leave some behind, however the application polls. Parked again after
// such a look beside an application whose CQ never runs dry (it never reads the socket itself),
// the loop would take one batch a park. Here 40 datagrams wait when the park ends
// (readsOnAfterTheLook).
func TestReceiveLoopReadsOnAfterALookThatFilledItsBatch(t *testing.T) {
	readsOnAfterTheLook(t, 0)
}

// settled reports whether b took a's first SEND and a its completion (nothing is outstanding:
// nothing more comes to b's socket), and b's receive loop waits on the socket.
func settled(a, b *accessRig) bool {
	return b.q.recvCQ.Written() == 1 && a.q.recvCQ.Written() == 1 && b.d.rxWaits.Load() == rxOnSocket
}

// parkablePair makes devices a and b on fabric f (b's node bn; set tunes b's configuration), and,
// for the test, a park of an hour and two Go processors (with one the loop never parks).
func parkablePair(t *testing.T, set func(*config.Device)) (a, b *accessRig, f *memlink.Fabric, bn *memlink.Node) {
	t.Helper()
	prev := busyPark.Swap(int64(time.Hour))
	procs := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { busyPark.Store(prev); runtime.GOMAXPROCS(procs) })
	f = memlink.New(1)
	an := f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)
	bn = f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)
	a = newAccessRigOn(t, config.Device{Addr: an.LocalAddr(), Link: an, Paths: 1})
	cfg := config.Device{Addr: bn.LocalAddr(), Link: bn, Paths: 1}
	set(&cfg)
	b = newAccessRigOn(t, cfg)
	return a, b, f, bn
}

// The same with a link whose reads take fewer than a batch and tell that they left datagrams
// behind (GRO: a read hands out the rest of a run, or takes 8 runs): the look goes on while its
// reads leave datagrams behind. Here a read takes 8 of the 40 waiting.
func TestReceiveLoopReadsOnAfterALookThatLeftDatagramsBehind(t *testing.T) {
	readsOnAfterTheLook(t, 8)
}

// readsOnAfterTheLook has 40 datagrams wait in b's socket when b's park ends, beside a poller
// that polled during the park and was posting when it ended (parkedBesidePoller, with short;
// pollDuringThePark), and checks that the loop reads them all before it parks again, and parks
// with the read that left none behind: a loop that read on until a read found nothing would, in
// a stream, never park.
func readsOnAfterTheLook(t *testing.T, short int) {
	t.Helper()
	a, b, bn := parkedBesidePoller(t, time.Duration(0), short)
	junk := make([]link.Packet, 40)
	for i := range junk {
		junk[i] = link.Packet{Buf: []byte("junk"), N: 4, Addr: bn.LocalAddr()}
	}
	if err := a.d.link.Send(junk); err != nil {
		t.Fatal(err)
	}
	pollDuringThePark(b)()
	empty := bn.n.Load()
	endPark(t, b)
	waitRx(t, b, func() bool { q, _ := bn.Queued(); return q == 0 && b.d.parkedRx() },
		"read every datagram after a look that left some behind, then park")
	if n := bn.n.Load() - empty; n != 0 {
		t.Errorf("the receive loop read %d times finding nothing before it parked again; want none", n)
	}
}

// pollDuringThePark returns what a poller does during b's park: it polls, and is posting when the
// park ends (its poll longer ago than busyQuiet).
func pollDuringThePark(b *accessRig) func() {
	return func() {
		b.d.busyAt.Store(monoNow() - 2*int64(busyQuiet))
		b.d.Polled()
	}
}

// endPark ends b's park, as the park's timer would, and waits until the loop has taken that.
func endPark(t *testing.T, b *accessRig) {
	t.Helper()
	b.d.rxResume <- struct{}{} // (one slot: an earlier end was taken, or the test waited for it)
	waitRx(t, b, func() bool { return len(b.d.rxResume) == 0 }, "take the end of its park")
}

// look ends b's park and waits until the loop has read once since (its look).
func look(t *testing.T, b *accessRig, bn *emptyReads) {
	t.Helper()
	reads := bn.n.Load() + bn.full.Load()
	endPark(t, b)
	waitRx(t, b, func() bool { return bn.n.Load()+bn.full.Load() != reads }, "look after its park")
}

// waitRx waits until cond holds (the receive loop's doing, which want describes).
func waitRx(t *testing.T, b *accessRig, cond func() bool, want string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("the receive loop does not %s (waiting for %d)", want, b.d.rxWaits.Load())
		}
	}
}

// lookUntilTaken ends b's park (after calling poll, the poller's doing meanwhile) whenever a
// datagram waits in its socket, until b has written n receive completions: each time the loop
// must look once and park again, whatever the look found. (a's first datagram there may be
// another than the SEND.)
func lookUntilTaken(t *testing.T, b *accessRig, bn *emptyReads, n uint32, poll func()) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.q.recvCQ.Written() < n; {
		if time.Now().After(deadline) {
			t.Fatal("the receive loop's looks never took the SEND")
		}
		if q, _ := bn.Queued(); q == 0 {
			runtime.Gosched()
			continue
		}
		empty, full := bn.n.Load(), bn.full.Load()
		poll()
		endPark(t, b)
		for !b.d.parkedRx() || bn.n.Load() == empty && bn.full.Load() == full {
			if time.Now().After(deadline) {
				t.Fatalf("the receive loop does not park again after its look (it read %d times finding datagrams, %d finding none)",
					bn.full.Load()-full, bn.n.Load()-empty)
			}
			runtime.Gosched()
		}
		if reads := bn.full.Load() - full + bn.n.Load() - empty; reads != 1 {
			t.Fatalf("the receive loop read %d times after its park (%d finding datagrams); want its look alone", reads, bn.full.Load()-full)
		}
	}
}

// An application's poll that found completions counts as busy polling (Polled), as one that
// found none and read the network does: a sender whose every poll found the completions the
// receive loop had made kept the loop reading beside it.
func TestPolledIsBusyPolling(t *testing.T) {
	f := memlink.New(1)
	n := f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)
	r := newAccessRigOn(t, config.Device{Addr: n.LocalAddr(), Link: n, Paths: 1})
	waitRx(t, r, func() bool { return r.d.rxWaits.Load() == rxOnSocket }, "wait on the socket") // (its first pass clears the mark)
	if r.d.BusyPolled() {
		t.Fatal("a device nobody polled counts as busy-polled")
	}
	r.d.Polled()
	if !r.d.BusyPolled() {
		t.Error("a poll that found completions does not count as busy polling")
	}
}

// parkedBesidePoller makes devices a and b on one fabric, b's receive loop spinning for rxSpin
// after traffic and counting the reads it finds nothing in, has a send b one SEND (the first,
// which makes them peers: the next SEND is one datagram), and then has b's loop park beside a
// poller that never stops, for an hour (until the test ends the park).
// With short, b's link reads at most short datagrams a call and tells when it left some behind
// (shortReads: as GRO's runs do).
func parkedBesidePoller(t *testing.T, rxSpin time.Duration, short int) (a, b *accessRig, bn *emptyReads) {
	t.Helper()
	prev := busyPark.Swap(int64(time.Hour))
	procs := runtime.GOMAXPROCS(2) // (with one processor the loop never parks)
	t.Cleanup(func() { busyPark.Store(prev); runtime.GOMAXPROCS(procs) })
	f := memlink.New(1)
	an := f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)
	bn = &emptyReads{Node: f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)}
	a = newAccessRigOn(t, config.Device{Addr: an.LocalAddr(), Link: an, Paths: 1})
	// (b's timer ticks hourly: its tick reads the socket too, and would take the SENDs.)
	var bl link.Link = bn
	if short > 0 {
		bl = &shortReads{emptyReads: bn, short: short}
	}
	b = newAccessRigOn(t, config.Device{Addr: bn.LocalAddr(), Link: bl, Paths: 1, RxSpin: rxSpin,
		PollMin: time.Hour, PollMax: time.Hour})
	sendOne(t, a, b)
	for deadline := time.Now().Add(10 * time.Second); b.q.recvCQ.Written() < 1; runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatal("the first SEND was not taken")
		}
	}
	b.d.busyAt.Store(monoNow() + int64(time.Hour))
	// A stray datagram wakes a loop that was already waiting on the socket: it then parks.
	stray := f.Listen(netip.MustParseAddrPort("10.0.0.3:4791"), 1)
	if err := stray.Send([]link.Packet{{Buf: []byte("stray"), N: 5, Addr: bn.LocalAddr()}}); err != nil {
		t.Fatal(err)
	}
	waitParkedWith(t, b, 1)
	return a, b, bn
}

// waitParkedWith waits until b has written n receive completions and its receive loop parks.
func waitParkedWith(t *testing.T, b *accessRig, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); b.q.recvCQ.Written() < uint32(n) || !b.d.parkedRx(); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("the receive loop does not park beside a busy poller (%d receive completions, want %d)", b.q.recvCQ.Written(), n)
		}
	}
}

// emptyReadsAfterTraffic has one SEND arrive at a device whose receive loop may spin for an hour
// after traffic (and, if polled, beside a poller that never stops), then yields 2000 times and
// returns how often the loop read the link meanwhile and found nothing: a spinning loop reads on
// and on, a waiting one at most once more.
func emptyReadsAfterTraffic(t *testing.T, polled bool) int64 {
	f := memlink.New(1)
	an := f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)
	bn := &emptyReads{Node: f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)}
	a := newAccessRigOn(t, config.Device{Addr: an.LocalAddr(), Link: an, Paths: 1})
	b := newAccessRigOn(t, config.Device{Addr: bn.LocalAddr(), Link: bn, Paths: 1, RxSpin: time.Hour})
	future := monoNow() + int64(time.Hour)
	if polled {
		// A poller that never stops (the loop compares with the clock: a poll "in the future"
		// stays recent for the whole test, whatever the scheduler does), and a park of an hour.
		defer busyPark.Store(busyPark.Swap(int64(time.Hour)))
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
		b.d.busyAt.Store(future)
	}
	sendOne(t, a, b)
	for b.q.recvCQ.Written() < 1 {
		if polled {
			b.d.PollNetwork() // the poller takes the SEND
			b.d.busyAt.Store(future)
		}
		runtime.Gosched()
	}
	before := bn.n.Load()
	for range 2000 {
		runtime.Gosched()
	}
	return bn.n.Load() - before
}

// A device whose application never polled does not park, in a synctest bubble too (where time
// has no monotonic reading, so "never" must not read as "a moment ago"): a SEND is taken as soon
// as it comes, with no poll.
func TestReceiveLoopUnpolledTakesAtOnce(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // (with one processor the loop never parks)
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(1)
		an := f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)
		bn := f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)
		a := newAccessRigOn(t, config.Device{Addr: an.LocalAddr(), Link: an, Paths: 1})
		b := newAccessRigOn(t, config.Device{Addr: bn.LocalAddr(), Link: bn, Paths: 1})
		sendOne(t, a, b)
		synctest.Wait()
		if b.q.recvCQ.Written() < 1 || b.d.parkedRx() {
			t.Fatalf("the SEND was not taken (receive loop parked: %v) with no poller", b.d.parkedRx())
		}
	})
}

// While a goroutine sleeps until a completion event (BeginSleep), the receive loop does not park,
// though another goroutine busy-polls the device: the sleeper's completion can come only from
// the loop, here with a park of an hour.
func TestReceiveLoopDoesNotParkBesideASleeper(t *testing.T) {
	defer busyPark.Store(busyPark.Swap(int64(time.Hour)))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	f := memlink.New(1)
	an := f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)
	bn := f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)
	a := newAccessRigOn(t, config.Device{Addr: an.LocalAddr(), Link: an, Paths: 1})
	b := newAccessRigOn(t, config.Device{Addr: bn.LocalAddr(), Link: bn, Paths: 1})
	b.d.BeginSleep()
	defer b.d.EndSleep()
	b.d.busyAt.Store(monoNow() + int64(time.Hour)) // another goroutine polls, and never stops
	sendOne(t, a, b)                               // it wakes the loop, which then waits again: on the socket, not parked
	for b.q.recvCQ.Written() < 1 || b.d.rxWaits.Load() == rxRunning {
		runtime.Gosched()
	}
	if b.d.parkedRx() {
		t.Fatal("the receive loop parked beside a sleeper")
	}
}

// sendOne has a's QP send one 1-byte SEND to b's, into a receive posted for it.
func sendOne(t *testing.T, a, b *accessRig) { sendNth(t, a, b, 0) }

// sendNth is sendOne for the i-th SEND of a test (ring slot i, before either ring wraps).
func sendNth(t *testing.T, a, b *accessRig, i int) {
	t.Helper()
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	efaio.RxDesc(b.q.rq.ring[i*efaio.RxDescSize:][:efaio.RxDescSize]).Encode(&efaio.RxDescFields{
		Addr: b.a.iova, ReqID: uint16(i), Length: 64, LKey: b.a.lkey, First: true, Last: true})
	a.q.sq.slot(uint16(i)).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: uint16(i), Length: 1, AHN: ah.ahn, QKey: 9,
		DestQPN: uint16(b.q.qpn), CompReq: true, Phase: a.q.sq.phase,
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: 64, LKey: a.a.lkey, Addr: a.a.iova}}})
	atomic.StoreUint32(b.q.rq.db, uint32(i+1))
	b.d.Ring(b.q)
	atomic.StoreUint32(a.q.sq.db, uint32(i+1))
	a.d.Ring(a.q)
}

// While an application polls a device, its polls run the engine loop's ticks when they are due
// (tickIfDue): neither the loop's timer nor the receive loop's park ends meanwhile. Here a's SEND
// is never delivered, so its timers tick every PollMin for the whole test, through 30 ms without
// a poller, 30 ms with one polling every 100 µs (beside which a's receive loop parks, woken by a
// stray datagram), and 30 ms without again.
func TestBusyPollerTicksForTheEngineLoop(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // (with one processor the loop never parks)
	synctest.Test(t, func(t *testing.T) {
		f, an, a := tickingRig(t, 0)
		phase := func(poll bool) (wakeups, ticks uint64, reads int64) {
			w, k, r := a.d.counts.EngineWakeups.Load(), a.d.ticks.Load(), an.n.Load()+an.full.Load()
			for range 300 {
				if poll {
					a.d.Polled()
				}
				time.Sleep(100 * time.Microsecond)
			}
			synctest.Wait()
			return a.d.counts.EngineWakeups.Load() - w, a.d.ticks.Load() - k, an.n.Load() + an.full.Load() - r
		}
		for i, poll := range []bool{false, true, false} {
			if poll {
				parkBesidePoller(t, f, an, a)
			}
			wakeups, ticks, reads := phase(poll)
			if want := map[bool]uint64{false: 30, true: 40}[poll]; ticks < want-5 || ticks > want+1 {
				t.Errorf("phase %d (polled: %v): %d ticks in 30 ms; want %d, every PollMin (1 ms), or every three quarters of it for the poller", i, poll, ticks, want)
			}
			switch {
			case poll && wakeups > 1:
				t.Errorf("the engine loop woke %d times in 30 ms beside a busy poller; want at most once (before the poller's first tick)", wakeups)
			case poll && (reads != 0 || !a.d.parkedRx()):
				t.Errorf("the receive loop read the link %d times in 30 ms beside a busy poller (parked at the end: %v); want it parked throughout", reads, a.d.parkedRx())
			case !poll && wakeups < 25:
				t.Errorf("phase %d: the engine loop woke %d times in 30 ms with nobody polling; want once a tick", i, wakeups)
			}
		}
	})
}

// A busy poller's ticks do not keep a device that has nothing to time ticking every PollMin: its
// engine loop still decides when its timer slows down and stops (here a's one SEND is
// acknowledged within the first milliseconds of 30 ms of polling; in the last 20 the loop's own
// timer, doubling its period while the transport lingers, ticks once or twice, as it does with
// no poller).
func TestBusyPollerLetsAnIdleDeviceStop(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2))
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(1)
		an := f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)
		bn := f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)
		a := newAccessRigOn(t, config.Device{Addr: an.LocalAddr(), Link: an, Paths: 1, RxSpin: -1})
		b := newAccessRigOn(t, config.Device{Addr: bn.LocalAddr(), Link: bn, Paths: 1, RxSpin: -1})
		sendOne(t, a, b)
		var ticks uint64
		for i := range 300 {
			if i == 100 {
				ticks = a.d.ticks.Load()
			}
			a.d.Polled()
			time.Sleep(100 * time.Microsecond)
		}
		synctest.Wait()
		if b.q.recvCQ.Written() != 1 {
			t.Fatal("the SEND did not arrive")
		}
		if n := a.d.ticks.Load() - ticks; n > 2 {
			t.Errorf("an idle device ticked %d times in 20 ms beside a busy poller; want at most 2", n)
		}
	})
}

// A busy poller's tick reads at most tickReads times: with more left behind, the receive loop's
// park ends, and the loop reads the rest (the application's thread has its own work). Here a's
// link reads one datagram a call, and 10 strays wait when the tick comes.
func TestBusyPollerTickLeavesABacklogToTheReceiveLoop(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // (with one processor the loop never parks)
	synctest.Test(t, func(t *testing.T) {
		f, an, a := tickingRig(t, 1)
		parkBesidePoller(t, f, an, a)
		reads, ticks := an.full.Load(), a.d.ticks.Load()
		strays(f, an, 10)
		for a.d.ticks.Load() == ticks {
			a.d.Polled()
			time.Sleep(100 * time.Microsecond)
		}
		synctest.Wait()
		if q, _ := an.Queued(); q != 0 {
			t.Fatalf("%d datagrams left in the socket after a busy poller's tick", q)
		}
		if n := an.full.Load() - reads; n != 10-tickReads {
			t.Errorf("the receive loop read %d datagrams after the tick; want %d (the tick reads %d)", n, 10-tickReads, tickReads)
		}
	})
}

// tickingRig makes devices a and b on one fabric, a's link counting its receive loop's reads (an;
// with short, reading at most short datagrams a call: shortReads), and has a send b a SEND that
// the fabric drops, as it drops everything a sends: a's timers tick every PollMin from then on.
// Neither loop spins after traffic: a spinning loop stops a synctest bubble's clock. Call it in
// a bubble.
func tickingRig(t *testing.T, short int) (f *memlink.Fabric, an *emptyReads, a *accessRig) {
	f = memlink.New(1)
	an = &emptyReads{Node: f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)}
	bn := f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)
	var al link.Link = an
	if short > 0 {
		al = &shortReads{emptyReads: an, short: short}
	}
	a = newAccessRigOn(t, config.Device{Addr: an.LocalAddr(), Link: al, Paths: 1, RxSpin: -1})
	b := newAccessRigOn(t, config.Device{Addr: bn.LocalAddr(), Link: bn, Paths: 1, RxSpin: -1})
	f.Filter(func(_, _ netip.AddrPort, _ []byte) bool { return false })
	sendOne(t, a, b)
	time.Sleep(5 * time.Millisecond)
	return f, an, a
}

// A poll of another device of the process ends a device's park, and so does a sleep until a
// completion event of another device: the goroutine whose poll parked the loop has gone to the
// other (softefa demo drives both ends from one goroutine, and a's completion there needs b's
// socket read). The park lasts an hour and the bubble's clock does not move: only the rule
// ends it.
func TestPollOfAnotherDeviceEndsThePark(t *testing.T) {
	defer busyPark.Store(busyPark.Swap(int64(time.Hour)))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // (with one processor the loop never parks)
	for _, how := range []string{"poll", "sleep"} {
		t.Run(how, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f, an, a := tickingRig(t, 0)
				cn := f.Listen(netip.MustParseAddrPort("10.0.0.4:4791"), 1)
				c := newAccessRigOn(t, config.Device{Addr: cn.LocalAddr(), Link: cn, Paths: 1, RxSpin: -1})
				parkBesidePoller(t, f, an, a)
				if how == "poll" {
					c.d.Polled()
				} else {
					c.d.BeginSleep()
					defer c.d.EndSleep()
				}
				synctest.Wait()
				if a.d.parkedRx() {
					t.Fatalf("a's receive loop stays parked after a %s on another device", how)
				}
			})
		})
	}
}

// TestSleepWalksOnlyPolledDevices checks polledSince: a sleep on a completion channel ends the
// park of the devices polled since the last sleep, and of the sleeper's own, and leaves the others
// alone (before it, every device of the process got its loop woken), and a device that closes, or is polled while it
// closes, is held by neither polledSince nor lastPolled.
func TestSleepWalksOnlyPolledDevices(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mk := func(addr string) *Device {
			n := memlink.New(1).Listen(netip.MustParseAddrPort(addr), 1)
			return newAccessRigOn(t, config.Device{Addr: n.LocalAddr(), Link: n, Paths: 1, RxSpin: -1}).d
		}
		a, b, c, e := mk("10.0.0.1:4791"), mk("10.0.0.2:4791"), mk("10.0.0.3:4791"), mk("10.0.0.4:4791")
		synctest.Wait()
		a.Polled()
		c.Polled()
		a.Polled() // a again: c's marks end, c stays in the set
		if !inPolledSince(a) || inPolledSince(b) || !inPolledSince(c) {
			t.Fatalf("polled since the last sleep: a %v b %v c %v, want a and c", inPolledSince(a), inPolledSince(b), inPolledSince(c))
		}
		for len(a.rxResume) > 0 { // (c's poll ended a's park: lastPolled)
			<-a.rxResume
		}
		b.BeginSleep()
		b.EndSleep()
		if inPolledSince(a) || inPolledSince(c) || a.marked.Load() || c.marked.Load() {
			t.Fatal("a sleep leaves devices in polledSince")
		}
		if len(e.rxResume) != 0 {
			t.Fatal("a sleep woke the receive loop of a device nobody polled")
		}
		if len(b.rxResume) != 1 {
			t.Fatal("a sleep did not end the park of the sleeper's own device")
		}
		<-b.rxResume
		if a.polled.Load() || len(a.rxResume) != 1 {
			t.Fatalf("a sleep did not end a's park: polled %v, resume tokens %d", a.polled.Load(), len(a.rxResume))
		}
		c.Polled()
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if inPolledSince(c) || lastPolled.Load() == c {
			t.Fatal("a closed device stays in polledSince or lastPolled")
		}
		c.polled.Store(false)
		c.Polled() // a poll racing Close, after it
		if inPolledSince(c) || c.marked.Load() || lastPolled.Load() == c {
			t.Fatal("a poll after Close put the closed device back in polledSince or lastPolled")
		}
	})
}

func inPolledSince(d *Device) bool {
	polledSince.mu.Lock()
	defer polledSince.mu.Unlock()
	return slices.Contains(polledSince.list, d)
}

// parkBesidePoller has a's receive loop park beside a busy poller: a first stray datagram ends
// its long wait on the socket (which forgets the polls before it), a second finds it polled. (The
// first goes again until the loop itself has read one: a tick of the engine loop due at the same
// instant may take it off the socket first, and the loop then waits on.)
func parkBesidePoller(t *testing.T, f *memlink.Fabric, an *emptyReads, a *accessRig) {
	t.Helper()
	for full := an.full.Load(); an.full.Load() == full; {
		strays(f, an, 1)
	}
	a.d.Polled()
	strays(f, an, 1)
	if !a.d.parkedRx() {
		t.Fatal("the receive loop does not park beside a busy poller")
	}
}

// strays sends n stray datagrams to an and waits until the bubble settles.
func strays(f *memlink.Fabric, an *emptyReads, n int) {
	for range n {
		f.Inject(netip.MustParseAddrPort("10.0.0.3:4791"), an.LocalAddr(), []byte("stray"))
	}
	synctest.Wait()
}
