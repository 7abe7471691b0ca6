//go:build linux

package hostdev

import (
	"encoding/binary"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softefa/softefa/internal/engine"
	"golang.org/x/sys/unix"
)

// fakeQPs stands in for the device behind a door: each kick returns the next scripted
// (budget, lingering), and a kick that lingers registers its waiter, which receive tells (under
// the fake's lock, as the engine tells it under its own) and withdraw takes back.
type fakeQPs struct {
	mu      sync.Mutex
	busy    bool       // kicks find their open busy, and do nothing
	tries   int        // kicks, busy ones too
	script  [][2]int64 // (budget in ns, lingering 0/1) for the next kicks
	waiting *engine.RecvWaiter
	kicks   int
	// deliver, if set, runs in each kick, as the work a kick does on its goroutine (RingBy)
	// completes another program's receive.
	deliver func(by any)
}

func (f *fakeQPs) kick(h, qp uint32, wait bool, w *engine.RecvWaiter, by any) (time.Duration, bool, bool) {
	f.mu.Lock()
	f.tries++
	busy := f.busy
	f.mu.Unlock()
	if busy {
		return 0, false, true
	}
	if f.deliver != nil {
		f.deliver(by)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.kicks++
	var next [2]int64
	if len(f.script) > 0 {
		next, f.script = f.script[0], f.script[1:]
	}
	budget := time.Duration(next[0])
	if !wait || f.waiting != nil {
		budget = 0
	}
	if budget > 0 {
		f.waiting = w
	}
	return budget, next[1] != 0, false
}

func (f *fakeQPs) withdraw(w *engine.RecvWaiter) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.waiting != w || w == nil {
		return false
	}
	f.waiting = nil
	return true
}

// receive tells the waiting waiter, if any, as a receive counted by other work (a receive loop)
// does, and reports whether there was one.
func (f *fakeQPs) receive() bool { return f.receiveBy(nil) }

// receiveBy is receive counted by the work of a kick on behalf of by.
func (f *fakeQPs) receiveBy(by any) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := f.waiting
	if w == nil {
		return false
	}
	f.waiting = nil
	w.Fn(by)
	return true
}

// push scripts the next kick.
func (f *fakeQPs) push(budget time.Duration, lingering bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := int64(0)
	if lingering {
		l = 1
	}
	f.script = append(f.script, [2]int64{int64(budget), l})
}

// awaitWaiter waits until a kick's waiter is registered.
func (f *fakeQPs) awaitWaiter(t *testing.T) {
	t.Helper()
	await(t, "a kick's waiter", f.waiter)
}

// await waits until cond holds (a minute at most: a hang guard, not a threshold).
func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after a minute", what)
		}
		runtime.Gosched()
	}
}

// take receives from ch (a minute at most: a hang guard).
func take[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(time.Minute):
		t.Fatal("nothing came in a minute")
		panic("unreachable")
	}
}

// holder holds the doorman in a kick's work until released; the test's cleanup releases it, so
// that a failing test does not leave the doorman held (its close would wait for ever).
type holder struct {
	once, rel sync.Once
	held      chan struct{}
	hold      chan struct{}
}

func newHolder(t *testing.T) *holder {
	h := &holder{held: make(chan struct{}), hold: make(chan struct{})}
	t.Cleanup(h.release) // (registered after the doorman's: runs before its close)
	return h
}

// work is the kick's work: the first time, it says it holds the doorman and waits.
func (h *holder) work(any) { h.once.Do(func() { close(h.held); <-h.hold }) }

func (h *holder) release() { h.rel.Do(func() { close(h.hold) }) }

func (f *fakeQPs) waiter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiting != nil
}

// testDoorman makes a doorman, stopped when the test ends.
func testDoorman(t *testing.T) *doorman {
	t.Helper()
	m, err := newDoorman()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.close)
	return m
}

// doorRig serves a door over a socketpair by doorman m (one of its own when nil); the test is
// the program, at the other end.
func doorRig(t *testing.T, m *doorman, qps *fakeQPs) (prog *os.File, dropped chan struct{}) {
	t.Helper()
	if m == nil {
		m = testDoorman(t)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	dropped = make(chan struct{})
	var once sync.Once
	dr, err := newDoor(fds[0], qps.kick, qps.withdraw, func() { once.Do(func() { close(dropped) }) })
	if err != nil {
		t.Fatal(err)
	}
	if err := m.add(dr); err != nil {
		t.Fatal(err)
	}
	if err := unix.SetNonblock(fds[1], true); err != nil { // (pollable: read deadlines hold)
		t.Fatal(err)
	}
	prog = os.NewFile(uintptr(fds[1]), "program")
	t.Cleanup(func() {
		dr.close()
		prog.Close()
	})
	return prog, dropped
}

func sendKick(t *testing.T, prog *os.File, qp uint32, wait bool, n uint64) {
	t.Helper()
	prog.SetWriteDeadline(time.Now().Add(time.Minute)) // (a hang guard, not a threshold)
	arg := uint64(qp) | n<<33
	if wait {
		arg |= 1 << 32
	}
	if _, err := prog.Write(request(opKick, 9, arg)); err != nil {
		t.Fatal(err)
	}
}

// readAnswer reads one answer: the QP and the status (kick number, lingering in bit 32).
func readAnswer(t *testing.T, prog *os.File) (qp uint32, status uint64) {
	t.Helper()
	b := make([]byte, 64)
	prog.SetReadDeadline(time.Now().Add(time.Minute)) // (a hang guard, not a threshold)
	n, err := prog.Read(b)
	if err != nil || n != replyHeader || binary.LittleEndian.Uint32(b) != opKick {
		t.Fatalf("an answer: %d bytes %x, %v", n, b[:max(n, 0)], err)
	}
	return binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint64(b[8:])
}

// noAnswer checks that no answer waits to be read.
func noAnswer(t *testing.T, prog *os.File) {
	t.Helper()
	b := make([]byte, 64)
	rc, err := prog.SyscallConn() // (not Fd, which would make the socket blocking)
	if err != nil {
		t.Fatal(err)
	}
	n, rerr := 0, error(nil)
	rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b, unix.MSG_DONTWAIT)
		return true
	})
	if rerr == nil {
		t.Fatalf("an answer nobody owed: %x", b[:n])
	}
}

// The doorbell socket's answers (docs/architecture.md, "Doorbells on the host device"): a kick
// that neither waits nor lingers gets none; one that waits is answered at once unless its QP
// lingers, and then on its QP's next receive, told by whoever counts it; the next kick answers a
// lingering one first, in order; the linger budget answers one whose receive never comes.
func TestDoorAnswers(t *testing.T) {
	m := testDoorman(t)
	qps := &fakeQPs{}
	prog, _ := doorRig(t, m, qps)
	sync := func() { // (a kick that waits and does not linger: answered once carried out)
		sendKick(t, prog, 99, true, 1000)
		if qp, st := readAnswer(t, prog); qp != 99 || st != 1000 {
			t.Fatalf("the sync kick's answer: QP %d status %#x", qp, st)
		}
	}

	sendKick(t, prog, 3, false, 1) // neither waits nor lingers
	sync()
	noAnswer(t, prog)

	qps.push(0, true) // does not wait, but the QP's next kick would linger
	sendKick(t, prog, 3, false, 2)
	if qp, st := readAnswer(t, prog); qp != 3 || st != 2|1<<32 {
		t.Fatalf("a lingering QP's kick: answered QP %d status %#x, want 3, %#x", qp, st, 2|1<<32)
	}

	// Waits and lingers: answered on the receive, not before; meanwhile the doorman counts
	// the program's thread waiting (and polls for kicks instead of sleeping itself).
	qps.push(time.Hour, true)
	sendKick(t, prog, 4, true, 3)
	qps.awaitWaiter(t) // (another kick now would end the linger)
	await(t, "program counted waiting", func() bool { return m.nwait.Load() == 1 })
	noAnswer(t, prog)
	if !qps.receive() {
		t.Fatal("no waiter to tell")
	}
	if qp, st := readAnswer(t, prog); qp != 4 || st != 3|1<<32 {
		t.Fatalf("the lingering kick's answer: QP %d status %#x, want 4, %#x", qp, st, 3|1<<32)
	}
	if n := m.nwait.Load(); n != 0 {
		t.Errorf("%d programs counted waiting after the answer, want 0", n)
	}
	noAnswer(t, prog)

	// Lingers, then the program kicks again: the lingering kick is answered first, its waiter
	// taken back, then the new one.
	qps.push(time.Hour, true)
	sendKick(t, prog, 5, true, 4)
	sendKick(t, prog, 6, true, 5)
	if qp, st := readAnswer(t, prog); qp != 5 || st != 4|1<<32 {
		t.Fatalf("the interrupted kick's answer: QP %d status %#x, want 5, %#x", qp, st, 4|1<<32)
	}
	if qp, st := readAnswer(t, prog); qp != 6 || st != 5 {
		t.Fatalf("the interrupting kick's answer: QP %d status %#x, want 6, 5", qp, st)
	}
	if qps.waiter() {
		t.Error("the interrupted kick's waiter still waits")
	}

	// Lingers with a budget of a nanosecond and no receive: the budget answers it.
	qps.push(1, true)
	sendKick(t, prog, 7, true, 6)
	if qp, st := readAnswer(t, prog); qp != 7 || st != 6|1<<32 {
		t.Fatalf("the expired kick's answer: QP %d status %#x, want 7, %#x", qp, st, 6|1<<32)
	}
	if qps.waiter() {
		t.Error("the expired kick's waiter still waits")
	}
	sync()
	noAnswer(t, prog)
}

// An answer told to the doorman, by a receive another program's kick completed, is written by the
// doorman once it has carried the kick out: the receiving program is answered, once, with its own
// kick's number, also when its next kick comes in the same round.
func TestDoorAnswerTold(t *testing.T) {
	m := testDoorman(t)
	y := &fakeQPs{}
	yprog, _ := doorRig(t, m, y)
	delivered := make(chan bool, 1)
	x := &fakeQPs{deliver: func(by any) {
		if by != nil {
			delivered <- y.receiveBy(by)
		}
	}}
	xprog, _ := doorRig(t, m, x)

	y.push(time.Hour, true)
	sendKick(t, yprog, 4, true, 77) // Y posts and waits: its answer waits for its receive
	y.awaitWaiter(t)
	sendKick(t, xprog, 8, false, 1) // X's post completes Y's receive
	if !take(t, delivered) {
		t.Fatal("X's kick found no waiter of Y's to tell")
	}
	if qp, st := readAnswer(t, yprog); qp != 4 || st != 77|1<<32 {
		t.Fatalf("Y's answer: QP %d status %#x, want 4, %#x", qp, st, 77|1<<32)
	}
	noAnswer(t, yprog)
	noAnswer(t, xprog)

	// Y kicks again while its kick lingers: that one is answered first, and the next, lingering
	// in turn, on its receive.
	y.push(time.Hour, true)
	sendKick(t, yprog, 4, true, 78)
	y.awaitWaiter(t)
	y.push(time.Hour, true)
	sendKick(t, yprog, 4, true, 79) // (answers 78 first, then lingers)
	if qp, st := readAnswer(t, yprog); qp != 4 || st != 78|1<<32 {
		t.Fatalf("Y's interrupted kick: QP %d status %#x, want 4, %#x", qp, st, 78|1<<32)
	}
	y.awaitWaiter(t)
	if !y.receive() {
		t.Fatal("no waiter of Y's to tell")
	}
	if qp, st := readAnswer(t, yprog); qp != 4 || st != 79|1<<32 {
		t.Fatalf("Y's second lingering kick: QP %d status %#x, want 4, %#x", qp, st, 79|1<<32)
	}
	noAnswer(t, yprog)

	// The same round: X's kick tells the doorman Y's answer, and Y's next kick, read after it,
	// answers Y's owed kick itself; the doorman's flush then writes nothing more. Z's kick holds
	// the doorman while X and Y queue theirs, so that one epoll_wait finds both, X's first (epoll's
	// ready list is first in, first out). Were they found in two rounds, the answers would be the
	// same, written by the flush of X's round.
	h := newHolder(t)
	z := &fakeQPs{deliver: h.work}
	zprog, _ := doorRig(t, m, z)
	y.push(time.Hour, true)
	sendKick(t, yprog, 4, true, 80)
	y.awaitWaiter(t)
	sendKick(t, zprog, 1, false, 1)
	take(t, h.held)
	sendKick(t, xprog, 8, false, 2) // delivers to Y: told to the doorman
	sendKick(t, yprog, 4, true, 81) // (does not linger: answered once carried out)
	h.release()
	if !take(t, delivered) {
		t.Fatal("X's second kick found no waiter of Y's to tell")
	}
	if qp, st := readAnswer(t, yprog); qp != 4 || st != 80|1<<32 {
		t.Fatalf("Y's told kick: QP %d status %#x, want 4, %#x", qp, st, 80|1<<32)
	}
	if qp, st := readAnswer(t, yprog); qp != 4 || st != 81 {
		t.Fatalf("Y's next kick: QP %d status %#x, want 4, 81", qp, st)
	}
	sendKick(t, zprog, 1, true, 2) // (a kick of Z's answered after the doorman's next flush)
	if qp, st := readAnswer(t, zprog); qp != 1 || st != 2 {
		t.Fatalf("Z's sync kick: QP %d status %#x, want 1, 2", qp, st)
	}
	noAnswer(t, yprog)
}

// A program that leaves its answers unread is dropped once the socket holds no more: the device
// never blocks on it (an answer may be written on another goroutine, under the engine's lock).
func TestDoorUnreadAnswers(t *testing.T) {
	qps := &fakeQPs{}
	prog, dropped := doorRig(t, nil, qps)
	rc, err := prog.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(0); ; i++ {
		select {
		case <-dropped:
			return
		default:
		}
		if i == 1<<20 {
			t.Fatal("the program was not dropped after a million unread answers")
		}
		qps.push(0, true)
		arg := uint64(3) | (i&0x7fffffff)<<33
		var werr error
		rc.Write(func(fd uintptr) bool {
			_, werr = unix.Write(int(fd), request(opKick, 9, arg))
			return true
		})
		switch werr {
		case nil:
		case unix.EAGAIN: // (the device has yet to read the kicks before)
			runtime.Gosched()
		default: // the device's end ended: it dropped the program first
			<-dropped
			return
		}
	}
}

// A program that floods its doorbell socket does not keep another's kick waiting: the doorman
// carries out a few kicks of each socket a round. X's first kick holds the doorman until X has
// queued many more and Y one that waits; Y's is carried out within the next round or two.
func TestDoormanFair(t *testing.T) {
	const flood = 100
	m := testDoorman(t)
	h := newHolder(t)
	x := &fakeQPs{deliver: h.work}
	xprog, _ := doorRig(t, m, x)
	y := &fakeQPs{}
	var carried atomic.Int64 // X's kicks carried out when Y's is
	y.deliver = func(any) {
		x.mu.Lock()
		carried.Store(int64(x.kicks))
		x.mu.Unlock()
	}
	yprog, _ := doorRig(t, m, y)

	sendKick(t, xprog, 1, false, 0)
	take(t, h.held)
	for i := uint64(1); i < flood; i++ {
		sendKick(t, xprog, 1, false, i)
	}
	sendKick(t, yprog, 2, true, 5)
	h.release()
	if qp, st := readAnswer(t, yprog); qp != 2 || st != 5 {
		t.Fatalf("Y's answer: QP %d status %#x, want 2, 5", qp, st)
	}
	if n := carried.Load(); n > 3*doorRound {
		t.Errorf("Y's kick was carried out after %d of X's kicks, want at most %d", n, 3*doorRound)
	}
	t.Logf("Y's kick carried out after %d of X's %d kicks", carried.Load(), flood)
}

// A kick whose open a command holds is parked, not waited for: the doorman serves the other
// programs meanwhile, leaves the parked program's socket unread, and carries out its kicks in
// order once the open is free.
func TestDoormanParksBusyOpen(t *testing.T) {
	m := testDoorman(t)
	x := &fakeQPs{busy: true}
	xprog, _ := doorRig(t, m, x)
	y := &fakeQPs{}
	yprog, _ := doorRig(t, m, y)

	sendKick(t, xprog, 1, true, 1)
	sendKick(t, xprog, 2, true, 2)
	await(t, "X's kick tried again", func() bool { // (tried, parked, and tried again)
		x.mu.Lock()
		defer x.mu.Unlock()
		return x.tries >= 2
	})
	sendKick(t, yprog, 3, true, 7)
	if qp, st := readAnswer(t, yprog); qp != 3 || st != 7 {
		t.Fatalf("Y's answer while X's open is busy: QP %d status %#x, want 3, 7", qp, st)
	}
	noAnswer(t, xprog)
	x.mu.Lock()
	x.busy = false
	x.mu.Unlock()
	if qp, st := readAnswer(t, xprog); qp != 1 || st != 1 {
		t.Fatalf("X's first kick: QP %d status %#x, want 1, 1", qp, st)
	}
	if qp, st := readAnswer(t, xprog); qp != 2 || st != 2 {
		t.Fatalf("X's second kick: QP %d status %#x, want 2, 2", qp, st)
	}
	x.mu.Lock()
	kicks := x.kicks
	x.mu.Unlock()
	if kicks != 2 {
		t.Errorf("X's kicks carried out %d times, want 2", kicks)
	}
}

// A parked kick whose program hangs up: the doorman, which does not watch a parked socket, finds
// the hang-up once the open is free and the kick carried out, and drops the program.
func TestDoormanParkedHangUp(t *testing.T) {
	m := testDoorman(t)
	x := &fakeQPs{busy: true}
	xprog, dropped := doorRig(t, m, x)
	sendKick(t, xprog, 1, false, 1)
	await(t, "X's kick tried", func() bool {
		x.mu.Lock()
		defer x.mu.Unlock()
		return x.tries >= 1
	})
	xprog.Close()
	y := &fakeQPs{} // (the doorman serves the others meanwhile)
	yprog, _ := doorRig(t, m, y)
	sendKick(t, yprog, 3, true, 7)
	if qp, st := readAnswer(t, yprog); qp != 3 || st != 7 {
		t.Fatalf("Y's answer while X is parked: QP %d status %#x, want 3, 7", qp, st)
	}
	x.mu.Lock()
	x.busy = false
	x.mu.Unlock()
	take(t, dropped)
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.kicks != 1 {
		t.Errorf("X's kick carried out %d times, want 1", x.kicks)
	}
}
