package engine

import (
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/link"
	"github.com/softefa/softefa/link/memlink"
)

// scratchRig is a device whose receive loop does not read (gatedLink) and whose engine loop's
// timer does not tick while a test runs, with a peer to send it datagrams, and makeScratch
// counting the inboxes made for it and reporting each to made, if made is not nil, then waiting
// for goOn.
type scratchRig struct {
	d          *Device
	g          *gatedLink
	peer       *memlink.Node
	dev        atomic.Pointer[Device] // d, for makeScratch
	makes      atomic.Int32
	made, goOn chan struct{}
}

func newScratchRig(t *testing.T) *scratchRig {
	r := &scratchRig{}
	real := makeScratch
	t.Cleanup(func() { makeScratch = real }) // (first, so that it runs after the device's Close)
	makeScratch = func(d *Device) *scratch {
		if d == r.dev.Load() {
			r.makes.Add(1)
			if r.made != nil {
				r.made <- struct{}{}
				<-r.goOn
			}
		}
		return real(d)
	}
	f := memlink.New(1)
	r.g = &gatedLink{Node: f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1), gate: make(chan struct{})}
	r.peer = f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)
	t.Cleanup(func() { r.peer.Close() })
	cfg := config.Device{Addr: r.g.LocalAddr(), Link: r.g, Paths: 1, PollMin: time.Hour, PollMax: time.Hour, RxSpin: -1}
	r.d = newAccessRigOn(t, cfg).d
	r.dev.Store(r.d)
	if r.d.busyRx == nil {
		t.Fatal("the device has no busy poller")
	}
	// The receive loop waits in gatedLink's WaitReadable before the test goes on: a loop that
	// had not got there would park beside the test's polls, and read after the park.
	for i := 0; !r.d.RxOnSocket(); i++ {
		if i == 1_000_000 {
			t.Fatal("the receive loop is not waiting on the link")
		}
		runtime.Gosched()
	}
	return r
}

// within runs f on a goroutine of its own and fails the test if it has not returned within 10
// seconds (it would otherwise hang the test), closing the device to let it go if it can.
func (r *scratchRig) within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		f()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		go r.d.Close()
		t.Fatalf("%s did not return", what)
	}
}

// send sends the device a datagram of 40 bytes (which it drops, once it reads it).
func (r *scratchRig) send(t *testing.T) {
	if err := r.peer.Send([]link.Packet{{Buf: make([]byte, 40), N: 40, Addr: r.g.LocalAddr()}}); err != nil {
		t.Fatal(err)
	}
}

// queued is how many datagrams wait for the device.
func (r *scratchRig) queued() int { n, _ := r.g.Queued(); return n }

// hold takes the inbox, as a reader that has read would hold it.
func (r *scratchRig) hold(t *testing.T) *scratch {
	r.d.busyMu.Lock()
	in := r.d.takeInbox()
	if in == nil {
		t.Fatal("no inbox to take")
	}
	r.d.busyMu.Unlock()
	return in
}

// gatedLink is a memlink node whose receive loop does not read until the link closes (its
// WaitReadable waits for that first), and which counts the datagrams timerRead reads.
type gatedLink struct {
	*memlink.Node
	gate      chan struct{}
	once      sync.Once
	timerRead atomic.Int32
}

func (g *gatedLink) NewPoller() link.Poller { return g }

func (g *gatedLink) TryReceive(pkts []link.Packet) (int, error) {
	n, err := g.Node.NewPoller().TryReceive(pkts)
	if calledBy("timerRead") {
		g.timerRead.Add(int32(n))
	}
	return n, err
}

func (g *gatedLink) WaitReadable() error {
	<-g.gate
	return g.Node.WaitReadable()
}

func (g *gatedLink) Close() error {
	g.once.Do(func() { close(g.gate) })
	return g.Node.Close()
}

// The busy pollers share one inbox, made by the device's first read: a busy poll that finds it
// held by another reads nothing and makes none. Making a second cost a millisecond of page faults
// in the middle of a ping-pong (docs/performance.md, "Where the time goes").
func TestBusyPollersShareOneInbox(t *testing.T) {
	r := newScratchRig(t)
	r.send(t)
	if !r.d.pollNetwork(true) || r.makes.Load() != 1 {
		t.Fatalf("the first read made %d inboxes and read %d datagrams, want 1 and 1", r.makes.Load(), 1-r.queued())
	}
	bytes := r.d.ScratchBytes()
	if bytes == 0 {
		t.Fatal("the inbox is not counted")
	}
	held := r.hold(t) // (another reader's)
	r.send(t)
	for _, read := range []struct {
		name string
		read func() (got, more bool)
	}{
		{"an application's poll", func() (bool, bool) { return r.d.PollNetwork(), true }},
		{"a tick's read", func() (bool, bool) { return r.d.readNetwork(true) }},
	} {
		if got, more := read.read(); got || !more || r.queued() != 1 {
			t.Fatalf("%s with the inbox held: got %v, more %v, %d datagrams left of 1", read.name, got, more, r.queued())
		}
		if !r.d.busyMu.TryLock() {
			t.Fatalf("%s left busyMu held", read.name)
		}
		r.d.busyMu.Unlock()
	}
	if n := r.makes.Load(); n != 1 {
		t.Fatalf("%d inboxes made, want 1", n)
	}
	if got := r.d.ScratchBytes(); got != bytes {
		t.Fatalf("scratch went from %d to %d bytes", bytes, got)
	}
	r.d.busyRx.done(held)
	if !r.d.pollNetwork(true) || r.makes.Load() != 1 {
		t.Fatalf("once the inbox was back: %d inboxes made, %d datagrams left, want 1 and 0", r.makes.Load(), r.queued())
	}
}

// The first reader makes the inbox without holding busyMu: another reader may take it meanwhile.
func TestInboxMadeOutsideBusyMu(t *testing.T) {
	r := newScratchRig(t)
	r.made, r.goOn = make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		r.d.pollNetwork(true)
		close(done)
	}()
	<-r.made
	took := r.d.busyMu.TryLock()
	if took {
		r.d.busyMu.Unlock()
	}
	close(r.goOn)
	<-done
	if !took {
		t.Fatal("busyMu was held while the inbox was made")
	}
	if !r.d.busyMu.TryLock() {
		t.Fatal("busyMu left held")
	}
	r.d.busyMu.Unlock()
}

// A first reader that finds busyMu taken once it has made the inbox gives the inbox back and
// reads nothing, leaving busyMu to its holder.
func TestInboxMadeWhileBusyMuTaken(t *testing.T) {
	r := newScratchRig(t)
	r.send(t)
	r.made, r.goOn = make(chan struct{}), make(chan struct{})
	got := make(chan bool)
	go func() { got <- r.d.pollNetwork(true) }()
	<-r.made
	r.d.busyMu.Lock() // (another reader's)
	close(r.goOn)
	if <-got || r.queued() != 1 {
		t.Fatalf("the read read without busyMu (%d datagrams left of 1)", r.queued())
	}
	if r.d.busyMu.TryLock() {
		t.Fatal("busyMu was let go of by a reader that did not hold it")
	}
	if n := len(r.d.busyRx.inbox); n != 1 {
		t.Fatalf("%d inboxes given back, want 1", n)
	}
	r.d.busyMu.Unlock()
}

// A busy poll that finds busyMu taken reads nothing and reports that datagrams may be left.
func TestReadRefusedByBusyMu(t *testing.T) {
	r := newScratchRig(t)
	r.d.pollNetwork(true) // (makes the inbox)
	r.send(t)
	r.d.busyMu.Lock() // (another reader's)
	got, more := r.d.readNetwork(true)
	r.d.busyMu.Unlock()
	if got || !more || r.queued() != 1 {
		t.Fatalf("with busyMu taken: got %v, more %v, %d datagrams left of 1", got, more, r.queued())
	}
}

// The engine loop's timer makes the device's inbox when no reader has, and reads: before its
// tick looks for losses, what waits in the socket is read.
func TestTimerReadMakesTheFirstInbox(t *testing.T) {
	r := newScratchRig(t)
	r.send(t)
	r.within(t, "the timer's read", func() { r.d.timerRead() })
	if n, read := r.makes.Load(), r.g.timerRead.Load(); n != 1 || read != 1 {
		t.Fatalf("the timer's read on a device with no inbox made %d and read %d datagrams, want 1 and 1", n, read)
	}
}

// The engine loop's timer, finding the inbox held by a reader, waits for it and then reads: the
// holder may be off its core, with ACKs arriving that the tick would otherwise not see.
func TestTimerReadWaitsForTheInbox(t *testing.T) {
	r := newScratchRig(t)
	r.d.pollNetwork(true) // (makes the inbox)
	held := r.hold(t)
	r.send(t)
	done := make(chan struct{})
	go func() {
		r.d.timerRead()
		close(done)
	}()
	awaitTimerWaiting(t, done)
	r.d.busyRx.done(held)
	<-done
	if n := r.g.timerRead.Load(); n != 1 {
		t.Fatalf("the timer's read read %d datagrams, want the 1 waiting", n)
	}
}

// A busy poller's tick whose first read is refused (another reader holds the inbox, and reads)
// is one whose read found nothing: it does not wake the receive loop. (Two threads polling one
// device had each other's ticks refused, and woke the loop on about every other tick.)
func TestTickRefusedItsReadLeavesTheReceiveLoop(t *testing.T) {
	r := newScratchRig(t)
	r.d.pollNetwork(true) // (makes the inbox)
	held := r.hold(t)
	defer r.d.busyRx.done(held)
	r.send(t)
	r.d.fastPoll.Store(true)
	r.d.tickAt.Store(int64(r.d.sinceStart() - 2*time.Hour)) // (a tick is due)
	ticks := r.d.ticks.Load()
	r.d.tickIfDue()
	if r.d.ticks.Load() == ticks {
		t.Fatal("no tick")
	}
	if len(r.d.rxResume) != 0 {
		t.Fatal("the receive loop was resumed")
	}
	if r.queued() != 1 {
		t.Fatalf("%d datagrams left of 1", r.queued())
	}
}

// The timer's wait for the inbox ends when the device closes, and it reports that it read
// nothing.
func TestTimerReadEndsAtClose(t *testing.T) {
	r := newScratchRig(t)
	r.d.pollNetwork(true) // (makes the inbox)
	held := r.hold(t)
	defer r.d.busyRx.done(held)
	r.send(t)
	var read bool
	done := make(chan struct{})
	go func() {
		read = r.d.timerRead()
		close(done)
	}()
	awaitTimerWaiting(t, done)
	r.within(t, "Close", func() { r.d.Close() })
	r.within(t, "the timer's read", func() { <-done })
	if read || r.g.timerRead.Load() != 0 {
		t.Fatalf("the timer's read at Close reported %v and read %d datagrams", read, r.g.timerRead.Load())
	}
}

// awaitTimerWaiting returns once a goroutine in timerRead waits for the inbox, and fails the
// test if done (closed when that goroutine's timerRead returns) closes first, or 10,000 looks
// do not find it waiting.
func awaitTimerWaiting(t *testing.T, done <-chan struct{}) {
	t.Helper()
	for range 10_000 {
		if blockedIn("timerRead", "select") {
			return
		}
		select {
		case <-done:
			t.Fatal("the timer's read returned with the inbox held")
		default:
		}
		runtime.Gosched()
	}
	t.Fatal("the timer's read is not waiting for the inbox")
}

// blockedIn reports whether a goroutine is blocked in state (as runtime.Stack prints it) with a
// method of Device named fn on its stack.
func blockedIn(fn, state string) bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "["+state) && strings.Contains(g, ".(*Device)."+fn+"(") {
			return true
		}
	}
	return false
}
