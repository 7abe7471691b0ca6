//go:build linux

package uverbs

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softefa/softefa/internal/engine"
	"golang.org/x/sys/unix"
)

// watcher notices the doorbells stored with plain writes that do not trap and rings the engine at
// once, instead of leaving them to the engine's timer (1 to 16 ms). Where the preload shim traps
// doorbell stores (x86-64: docs/cabi.md, "Doorbells"), the storing thread rings the engine itself
// and the QP is taken off the watcher (File.TrapDoorbells); otherwise the watcher is what notices
// a program that writes the rings itself rather than through the wrapped libibverbs entry points.
// It scans the SQ and RQ doorbell of every QP it watches, at once again after a scan that found
// one moved, else after a pause: 50 µs until busyWindow after the last change, backing off to
// 1 ms after that; it blocks while it watches no QP. It never scans without pausing while the
// doorbells are still: on a small machine a spinning watcher takes the CPU from the program's own
// busy polling (ib_send_lat -s 64 on 2 vCPUs: 70 µs typical without, 0.7 ms with). Pauses under
// a millisecond are nanosleeps on the watcher's own thread, with a timer slack of 1 µs: Go's
// timers do not sleep less than about a millisecond, which made every raw doorbell wait 1 to 2
// ms (libfabric 2.6's efa-direct fi_pingpong, 64 bytes: 1.8–3.4 ms per transfer before,
// 0.3–0.6 ms after, on a loaded 2-vCPU machine).
//
// The watcher's goroutine owns seen values; mu guards the list, so that a QP's doorbell page is
// never read after remove returns (the page is unmapped next).
type watcher struct {
	ring func(*engine.QP) // the engine's Ring (a test's recorder)

	mu   sync.Mutex
	qps  []*watched
	wake chan struct{} // one slot: a QP was added
	stop chan struct{}
	n    atomic.Int32
}

type watched struct {
	q      *engine.QP
	sq, rq *uint32
	seenSQ uint32
	seenRQ uint32
}

// minPause is the watcher's first pause after a doorbell moved; it doubles up to a millisecond
// while none moves.
const minPause = 50 * time.Microsecond

// busyWindow is how long after a doorbell moved the watcher keeps its shortest pause before it
// backs off: a program that posts, waits a round trip and posts again (a ping-pong, whose round
// trip here is a few hundred microseconds) would otherwise find it asleep for longer.
const busyWindow = 2 * time.Millisecond

// newWatcher starts a watcher.
func newWatcher(e *engine.Device) *watcher {
	w := &watcher{ring: e.Ring, wake: make(chan struct{}, 1), stop: make(chan struct{})}
	go w.loop()
	return w
}

// add watches q (again); a QP already watched stays as it is.
func (w *watcher) add(q *engine.QP) {
	w.mu.Lock()
	for _, x := range w.qps {
		if x.q == q {
			w.mu.Unlock()
			return
		}
	}
	w.qps = append(w.qps, &watched{q: q, sq: q.SQDoorbell(), rq: q.RQDoorbell()})
	w.n.Store(int32(len(w.qps)))
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// remove stops watching q; when it returns, q's doorbells are no longer read.
func (w *watcher) remove(q *engine.QP) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, x := range w.qps {
		if x.q == q {
			w.qps = append(w.qps[:i], w.qps[i+1:]...)
			break
		}
	}
	w.n.Store(int32(len(w.qps)))
}

func (w *watcher) close() { close(w.stop) }

// scan rings the engine for every QP whose doorbell moved and reports whether any did.
func (w *watcher) scan() bool {
	moved := false
	w.mu.Lock()
	for _, x := range w.qps {
		sq, rq := atomic.LoadUint32(x.sq), atomic.LoadUint32(x.rq)
		if sq != x.seenSQ || rq != x.seenRQ {
			x.seenSQ, x.seenRQ = sq, rq
			w.ring(x.q)
			moved = true
		}
	}
	w.mu.Unlock()
	return moved
}

func (w *watcher) loop() {
	// The short sleeps below are nanosleeps on this thread, whose timer slack (50 µs by default)
	// would stretch them.
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(time.Microsecond), 0, 0, 0)
	last := time.Now()
	pause := minPause
	for {
		if w.n.Load() == 0 {
			select {
			case <-w.wake:
			case <-w.stop:
				return
			}
		}
		if w.scan() {
			last = time.Now()
			pause = minPause
			continue
		}
		if pause < time.Millisecond {
			// Go's timers do not sleep less than about a millisecond; nanosleep on this thread
			// does (the stop channel is looked at between sleeps).
			ts := unix.NsecToTimespec(int64(pause))
			_ = unix.Nanosleep(&ts, nil)
			select {
			case <-w.stop:
				return
			default:
			}
		} else {
			select {
			case <-w.stop:
				return
			case <-time.After(pause):
			}
		}
		if time.Since(last) > busyWindow {
			pause = min(2*pause, time.Millisecond)
		}
	}
}
