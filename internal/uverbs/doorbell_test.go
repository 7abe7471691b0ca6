//go:build linux

package uverbs

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/uapi"
)

// watching reports whether the watcher scans the QP with handle h.
func (h *harness) watching(qh uint32) bool {
	o := h.f.objs[qh].(*qpObj)
	w := h.d.dbs
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.qps {
		if x.q == o.qp {
			return true
		}
	}
	return false
}

// TestWatcherRings: a store to the SQ or RQ doorbell of a QP the watcher scans (a program whose
// stores do not trap: not x86-64, or a shadow stack) rings the engine for that QP. The wait for
// the ring is bounded by a minute only so that a watcher that never rings fails the test.
func TestWatcherRings(t *testing.T) {
	h := newHarness(t)
	rung := make(chan *engine.QP, 4)
	w := h.d.dbs
	w.mu.Lock()
	w.ring = func(q *engine.QP) {
		select {
		case rung <- q:
		default:
		}
	}
	w.mu.Unlock()
	h.getContext()
	pd := h.allocPD()
	cq, _ := h.createCQ(64, 32, 0)
	qp, _ := h.createQP(pd, cq, uapi.QPTypeDriver, 16*64, 16*16)
	o := h.f.objs[qp].(*qpObj)
	for _, db := range []struct {
		name string
		word *uint32
	}{{"SQ", o.qp.SQDoorbell()}, {"RQ", o.qp.RQDoorbell()}} {
		atomic.AddUint32(db.word, 1)
		select {
		case q := <-rung:
			if q != o.qp {
				t.Fatalf("a store to the %s doorbell rang another QP", db.name)
			}
		case <-time.After(time.Minute):
			t.Fatalf("the watcher did not ring the engine for a store to the %s doorbell", db.name)
		}
	}
}

// TestTrapDoorbells: the shim learns which mmap key is a QP's SQ doorbell page (its RQ doorbell
// page has a key of its own and never traps), and once a mapping of it traps stores, the watcher
// stops scanning the QP; with no QP left to scan it blocks (no wake-ups while the program is
// idle). A mapping that does not trap puts the QP back under the watcher for good.
func TestTrapDoorbells(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	cq, cr := h.createCQ(64, 32, 0)
	qp, r := h.createQP(pd, cq, uapi.QPTypeDriver, 16*64, 16*16)
	drv := r[32:]
	rqDB, sqDB, sqKey, cqDB := u64(drv, 32), u64(drv, 40), u64(drv, 48), u64(cr[8:], 32)
	if got, ok := h.f.DoorbellPage(sqDB); !ok || got != qp {
		t.Fatalf("DoorbellPage(SQ doorbell key %#x) = %d, %v; want QP %d", sqDB, got, ok, qp)
	}
	for _, k := range []uint64{rqDB, sqKey, cqDB, 1 << 40} {
		if got, ok := h.f.DoorbellPage(k); ok {
			t.Errorf("DoorbellPage(%#x) = %d: not a QP's SQ doorbell page", k, got)
		}
	}
	if !h.watching(qp) {
		t.Fatal("a new QP is not watched")
	}
	h.f.TrapDoorbells(qp, true)
	if h.watching(qp) || h.d.dbs.n.Load() != 0 {
		t.Fatal("the watcher still scans a QP whose SQ doorbell traps")
	}
	h.f.TrapDoorbells(qp, false) // a second mapping, not trapped
	h.f.TrapDoorbells(qp, true)
	if !h.watching(qp) || h.d.dbs.n.Load() != 1 {
		t.Fatal("a QP with an untrapped doorbell mapping is not watched (once)")
	}
	h.f.TrapDoorbells(12345, true) // unknown handle: ignored
	d := make([]byte, 16)
	put64(d, 0, respAddr)
	put32(d, 8, qp)
	h.must(cmd(cmdDestroyQP, 1, d, nil))
	if h.d.dbs.n.Load() != 0 {
		t.Fatal("a destroyed QP is still watched")
	}
}

// TestRingTrappedOwnDevice: a trapped ring of a QP that has talked to no other device (here
// with no link at all: its completions come from the device itself, at once) is never counted
// toward lingering, even with a receive after every ring, as a ping-pong has; an unknown handle
// is ignored.
func TestRingTrappedOwnDevice(t *testing.T) {
	h := newHarness(t)
	h.d.linger = time.Hour
	h.getContext()
	pd := h.allocPD()
	cq, _ := h.createCQ(64, 32, 0)
	qp, _ := h.createQP(pd, cq, uapi.QPTypeDriver, 16*64, 16*16)
	o := h.f.objs[qp].(*qpObj)
	for i := range 2 * lingerAfter {
		o.rungRecvs.Store(uint64(100 + i)) // a receive since the last ring (the count moved)
		h.f.RingTrapped(qp)
	}
	if n := o.answers.Load(); n != 0 {
		t.Errorf("a QP that talks to no peer has %d answered rings toward lingering, want 0", n)
	}
	h.f.RingTrapped(12345)
}

// TestLingerOnlyPingPongs: a ring lingers for its answer only after lingerAfter rings in a row
// that a receive followed (a ping-pong); a program whose messages take several posts (a ring with
// no receive since the one before) never lingers, as the answer needs its next post; a stream,
// with no receives, never either.
func TestLingerOnlyPingPongs(t *testing.T) {
	shapes := []struct {
		name  string
		rings string // per ring: a = a receive since the previous ring, - = none
		want  string // per ring: L = lingers, . = does not
	}{
		{"ping-pong", "-aaaaaaaa", ".....LLLL"},
		{"two posts a message", "-a-a-a-a-a-a-a-a", "................"},
		{"three posts a message", "-a--a--a--a--a--a--", "..................."},
		{"stream", "--------", "........"},
		{"ping-pong after fragments", "-a-a-aaaaaa", ".........LL"},
		{"one unanswered ring in a ping-pong", "aaaaaa-aaaaa", "....LL.....L"},
	}
	for _, s := range shapes {
		var o qpObj
		var got strings.Builder
		for _, r := range s.rings {
			if o.lingers(r == 'a') {
				got.WriteByte('L')
			} else {
				got.WriteByte('.')
			}
		}
		if got.String() != s.want {
			t.Errorf("%s: rings %s lingered %s, want %s", s.name, s.rings, got.String(), s.want)
		}
	}
}

// TestKickLinger: a host device's kick (KickLinger) reports whether the QP's next kick would
// linger — once lingerAfter rings in a row were answered — and lingers (registers its waiter for
// the QP's next receive, returning the budget) only when the program waits and the QP lingers. An
// unknown handle, or no linger budget, reports neither.
func TestKickLinger(t *testing.T) {
	h := newHarness(t)
	h.d.linger = time.Hour
	h.getContext()
	pd := h.allocPD()
	cq, _ := h.createCQ(64, 32, 0)
	qp, _ := h.createQP(pd, cq, uapi.QPTypeDriver, 16*64, 16*16)
	o := h.f.objs[qp].(*qpObj)
	w := &engine.RecvWaiter{Fn: func(any) { t.Error("told of a receive that never came") }}
	// kick is a kick after a post: a send moves the SQ doorbell (the QP is in RESET: the engine
	// leaves the entries alone), a receive does not.
	kick := func(send, wait bool) (time.Duration, bool) {
		t.Helper()
		if send {
			atomic.AddUint32(o.qp.SQDoorbell(), 1)
		}
		budget, lingering, busy := h.f.KickLinger(qp, wait, w, nil)
		if busy {
			t.Fatal("a kick found the File busy with no command running")
		}
		return budget, lingering
	}
	var got strings.Builder
	for i := range lingerAfter + 2 {
		o.rungRecvs.Store(uint64(100 + i)) // a receive since the last ring (the count moved)
		budget, lingering := kick(true, false)
		if budget != 0 {
			t.Fatalf("kick %d, which the program does not wait for, lingers %v", i, budget)
		}
		if lingering {
			got.WriteByte('L')
		} else {
			got.WriteByte('.')
		}
	}
	if want := strings.Repeat(".", lingerAfter-1) + "LLL"; got.String() != want {
		t.Errorf("answered kicks reported %s, want %s", got.String(), want)
	}
	// A waited kick that posted only a receive: no linger (its receive would need the program's
	// own next send), and the QP's run goes on.
	o.rungRecvs.Store(900)
	if budget, lingering := kick(false, true); budget != 0 || !lingering {
		t.Fatalf("a waited kick that posted no send: budget %v, lingering %v; want 0, true", budget, lingering)
	}
	o.rungRecvs.Store(1000)
	if budget, _ := kick(true, true); budget != time.Hour {
		t.Fatalf("a waited kick of a lingering QP lingers %v, want the budget", budget)
	}
	o.rungRecvs.Store(2000) // (its run unbroken: only the waiter stands in the way)
	if budget, _ := kick(true, true); budget != 0 {
		t.Errorf("a second waited kick lingered %v with the waiter already waiting", budget)
	}
	if !h.d.Withdraw(w) {
		t.Error("the lingering kick's waiter was not waiting")
	}
	if _, lingering := kick(true, false); lingering { // no receive since the last ring
		t.Error("a kick with no receive since the last reported the next would linger")
	}
	if budget, lingering, busy := h.f.KickLinger(12345, true, w, nil); budget != 0 || lingering || busy {
		t.Error("a kick of an unknown handle lingered")
	}

	// A command holds the File: the kick does nothing and says so.
	posted := atomic.AddUint32(o.qp.SQDoorbell(), 1)
	h.f.mu.Lock()
	budget, lingering, busy := h.f.KickLinger(qp, true, w, nil)
	h.f.mu.Unlock()
	if !busy || budget != 0 || lingering {
		t.Errorf("a kick while a command holds the File: budget %v, lingering %v, busy %v; want 0, false, true", budget, lingering, busy)
	}
	if o.lastSQ.Load() == posted {
		t.Error("a busy kick recorded the SQ doorbell: its retry would count as posting no send")
	}

	h.d.linger = 0
	o.answers.Store(lingerAfter)
	if budget, lingering := kick(true, true); budget != 0 || lingering {
		t.Error("a kick with no linger budget lingered")
	}
}
