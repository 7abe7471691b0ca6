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

// scratchRig is a device on a memory link whose engine loop's timer does not tick while a test
// runs, with makeScratch counting the inboxes made for it and reporting each to made, if made is
// not nil, then waiting for goOn.
type scratchRig struct {
	d          *Device
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
	n := f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1)
	cfg := config.Device{Addr: n.LocalAddr(), Link: n, Paths: 1, PollMin: time.Hour, PollMax: time.Hour}
	r.d = newAccessRigOn(t, cfg).d
	r.dev.Store(r.d)
	if r.d.busyRx == nil {
		t.Fatal("the device has no busy poller")
	}
	return r
}

// The busy pollers share one inbox, made by the device's first read: a busy poll that finds it
// held by another reads nothing and makes none. Making a second cost a millisecond of page faults
// in the middle of a ping-pong (docs/performance.md, "Where the time goes").
func TestBusyPollersShareOneInbox(t *testing.T) {
	r := newScratchRig(t)
	r.d.pollNetwork(true)
	if n := r.makes.Load(); n != 1 {
		t.Fatalf("the first read made %d inboxes, want 1", n)
	}
	bytes := r.d.ScratchBytes()
	if bytes == 0 {
		t.Fatal("the inbox is not counted")
	}
	r.d.busyMu.Lock()
	held := r.d.takeInbox() // (another reader's)
	r.d.busyMu.Unlock()
	if held == nil {
		t.Fatal("the inbox was not given back")
	}
	for _, read := range []struct {
		name string
		read func() bool
	}{
		{"an application's poll", r.d.PollNetwork},
		{"a tick's read", func() bool { got, _ := r.d.readNetwork(true); return got }},
	} {
		if read.read() {
			t.Fatalf("%s read with the inbox held", read.name)
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
	r.d.pollNetwork(true)
	if n := r.makes.Load(); n != 1 {
		t.Fatalf("%d inboxes made once the inbox was back, want 1", n)
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
	r.made, r.goOn = make(chan struct{}), make(chan struct{})
	got := make(chan bool)
	go func() { got <- r.d.pollNetwork(true) }()
	<-r.made
	r.d.busyMu.Lock() // (another reader's)
	close(r.goOn)
	if <-got {
		t.Fatal("the read read without busyMu")
	}
	if r.d.busyMu.TryLock() {
		t.Fatal("busyMu was let go of by a reader that did not hold it")
	}
	if n := len(r.d.busyRx.inbox); n != 1 {
		t.Fatalf("%d inboxes given back, want 1", n)
	}
	r.d.busyMu.Unlock()
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

// The engine loop's timer, finding the inbox held by a reader, waits for it and then reads: the
// holder may be off its core, with ACKs arriving that the tick would otherwise not see.
func TestTimerReadWaitsForTheInbox(t *testing.T) {
	f := memlink.New(1)
	g := &gatedLink{Node: f.Listen(netip.MustParseAddrPort("10.0.0.1:4791"), 1), gate: make(chan struct{})}
	cfg := config.Device{Addr: g.LocalAddr(), Link: g, Paths: 1, PollMin: time.Hour, PollMax: time.Hour, RxSpin: -1}
	d := newAccessRigOn(t, cfg).d
	d.pollNetwork(true) // (makes the inbox)
	d.busyMu.Lock()
	held := d.takeInbox()
	d.busyMu.Unlock()
	if held == nil {
		t.Fatal("no inbox")
	}
	peer := f.Listen(netip.MustParseAddrPort("10.0.0.2:4791"), 1)
	defer peer.Close()
	if err := peer.Send([]link.Packet{{Buf: make([]byte, 40), N: 40, Addr: g.LocalAddr()}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		d.timerRead()
		close(done)
	}()
	waiting := false
	for range 1_000_000 {
		if waiting = blockedIn("timerRead", "chan receive"); waiting {
			break
		}
		select {
		case <-done:
			t.Fatal("the timer's read returned with the inbox held")
		default:
		}
		runtime.Gosched()
	}
	if !waiting {
		t.Fatal("the timer's read is not waiting for the inbox")
	}
	d.busyRx.done(held)
	<-done
	if n := g.timerRead.Load(); n != 1 {
		t.Fatalf("the timer's read read %d datagrams, want the 1 waiting", n)
	}
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
