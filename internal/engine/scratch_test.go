package engine

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/link/memlink"
)

// scratchRig is a device on a memory link whose engine loop's timer does not tick while a test
// runs, with makeScratch counting the inboxes made for it and reporting each to made, if made is
// not nil, then waiting for goOn.
type scratchRig struct {
	d            *Device
	dev          atomic.Pointer[Device] // d, for makeScratch
	makes        atomic.Int32
	made, goOn   chan struct{}
	heldByOthers []*scratch
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

// takeAll empties the free list, as readers that all hold an inbox at once would, first making
// one if none was: afterwards every inbox is out.
func (r *scratchRig) takeAll() {
	r.d.readNetwork(true, true)
	for in := r.d.busyRx.take(); in != nil; in = r.d.busyRx.take() {
		r.heldByOthers = append(r.heldByOthers, in)
	}
}

// The engine loop's timer reads before it looks for losses, but with every inbox out it makes
// none: a reader holds one and is at work. Making one cost a millisecond of page faults, in the
// middle of a ping-pong (docs/performance.md). A busy poller makes one.
func TestTimerReadMakesNoInbox(t *testing.T) {
	r := newScratchRig(t)
	r.takeAll()
	before, bytes := r.makes.Load(), r.d.ScratchBytes()
	r.d.timerRead()
	if n := r.makes.Load() - before; n != 0 {
		t.Fatalf("the timer's read made %d inboxes with every inbox out", n)
	}
	if got := r.d.ScratchBytes(); got != bytes {
		t.Fatalf("scratch went from %d to %d bytes", bytes, got)
	}
	r.d.pollNetwork(true)
	if n := r.makes.Load() - before; n != 1 {
		t.Fatalf("a busy poll with every inbox out made %d inboxes, want 1", n)
	}
}

// The timer's read makes the device's first inbox when no reader has made one: before its
// timers look for losses, it reads what waits in the socket.
func TestTimerReadMakesTheFirstInbox(t *testing.T) {
	r := newScratchRig(t)
	r.d.timerRead()
	if n := r.makes.Load(); n != 1 {
		t.Fatalf("the timer's read on a device with no inbox made %d, want 1", n)
	}
}

// A busy poller that finds every inbox out makes one without holding busyMu: another reader
// reads meanwhile.
func TestInboxMadeOutsideBusyMu(t *testing.T) {
	r := newScratchRig(t)
	r.takeAll()
	r.made, r.goOn = make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		r.d.pollNetwork(true)
		close(done)
	}()
	<-r.made
	took := false
	if took = r.d.busyMu.TryLock(); took {
		r.d.busyMu.Unlock()
	}
	close(r.goOn)
	<-done
	if !took {
		t.Fatal("busyMu was held while an inbox was made")
	}
}
