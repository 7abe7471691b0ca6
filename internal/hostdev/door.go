//go:build linux

package hostdev

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softefa/softefa/internal/engine"
	"golang.org/x/sys/unix"
)

// door is the device's end of a program's doorbell socket (docs/architecture.md, "Doorbells on
// the host device"), whose kicks the device's doorman reads and carries out (carry). A kick whose
// thread waits while its QP ping-pongs is owed its answer until the QP's next receive, whose
// waiter (engine.QP.OnRecv) is told by the goroutine that counts it; or until the program kicks
// again, or the linger budget runs out (doorman.expire). A receive counted while the doorman
// carries out a kick is left to the doorman, which writes the answer at the end of its round: a
// ping-pong's answer goes as soon as the kick that answers it is carried out, a stream's receiver
// is woken once a round of the sender's kicks.
type door struct {
	fd int // the socket, non-blocking: read by the doorman when epoll finds kicks

	// What the door needs of the device and the connection: to carry out a kick of QP qp of the
	// open with handle h on behalf of by (uverbs.File.KickLinger; busy when a command holds the
	// open), to take back the waiter (uverbs.Device.Withdraw), and to drop the program (after
	// which close comes).
	kick     func(h, qp uint32, wait bool, w *engine.RecvWaiter, by any) (budget time.Duration, lingering, busy bool)
	withdraw func(w *engine.RecvWaiter) bool
	drop     func()

	// the doorman's own.
	in     [2 * reqHeader]byte // a kick read (a longer datagram shows as more than reqHeader bytes)
	n      int
	parked bool // the kick in in found its open busy: tried again each round, the socket unread
	listed bool // in the doorman's list of doors whose program may wait (doorman.expire)

	// mu is taken under the engine's lock (the waiter's Fn): it is never held while calling into
	// the device. Answers are written under it, one at a time, in their kicks' order.
	mu       sync.Mutex
	closed   bool
	owed     bool            // a kick's answer waits for its QP's next receive…
	tag      uint64          // …its number among this door's owed kicks…
	answer   [reqHeader]byte // …the answer…
	deadline time.Time       // …and the end of its linger budget (zero until it lingers)
	out      [reqHeader]byte // the answer being written (write)

	waiting bool          // the owed kick lingers: its program's thread waits, counted in…
	nwait   *atomic.Int32 // …the doorman's count

	waiter engine.RecvWaiter // told of the owed kick's receive (received)
}

// told is an answer told to the doorman: door dr's owed kick numbered tag.
type told struct {
	dr  *door
	tag uint64
}

// carried is what came of a kick: carried out (lingering: its answer owed until its receive),
// its open busy (tried again later), or not a kick.
type carried int

const (
	kickDone carried = iota
	kickLingers
	kickBusy
	kickBad
)

// doorbell makes the program's doorbell socket (opDoorbell): a socketpair whose other end the
// program takes, served by the device's doorman.
func (c *conn) doorbell() ([]byte, int, bool) {
	if c.door != nil {
		return reply(opDoorbell, -int64(syscall.EEXIST), nil), -1, true
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return reply(opDoorbell, errnoStatus(err), nil), -1, true
	}
	kick := func(h, qp uint32, wait bool, w *engine.RecvWaiter, by any) (time.Duration, bool, bool) {
		if o := c.lookup(h); o != nil {
			return o.f.KickLinger(qp, wait, w, by)
		}
		return 0, false, false
	}
	drop := func() { c.c.Close() } // (the connection's goroutine then releases everything)
	dr, err := newDoor(fds[0], kick, c.s.d.Withdraw, drop)
	if err != nil {
		unix.Close(fds[1])
		return reply(opDoorbell, errnoStatus(err), nil), -1, true
	}
	dm, err := c.s.doorman()
	if err == nil {
		err = dm.add(dr)
	}
	if err != nil {
		dr.release()
		unix.Close(fds[1])
		return reply(opDoorbell, errnoStatus(err), nil), -1, true
	}
	c.door = dr
	return reply(opDoorbell, 0, nil), fds[1], true
}

// newDoor makes the door of the device's end fd of a doorbell socket, which it takes (closed on
// failure), for a doorman to serve (doorman.add).
func newDoor(fd int, kick func(h, qp uint32, wait bool, w *engine.RecvWaiter, by any) (time.Duration, bool, bool), withdraw func(*engine.RecvWaiter) bool, drop func()) (*door, error) {
	if err := unix.SetNonblock(fd, true); err != nil { // (the doorman reads until EAGAIN)
		unix.Close(fd)
		return nil, err
	}
	dr := &door{fd: fd, kick: kick, withdraw: withdraw, drop: drop}
	dr.waiter.Fn = dr.received
	return dr, nil
}

// carry carries out the kick in dr.in (dr.n bytes) on behalf of the doorman m (docs/architecture.md,
// "Doorbells on the host device"). Each kick is op kick, the open's handle, and in arg the QP's
// handle (low 32 bits), whether the program's thread waits for the answer (bit 32) and the kick's
// number (bits 33–63). A kick the program waits for is answered, and so is one whose QP's next
// kick would linger: op kick, the QP's handle, and in status the kick's number (low 31 bits) and
// whether the QP's next kick would linger (bit 32). A waited kick of a QP that lingers is
// answered only on its QP's next receive, the program's next kick, or the end of the linger
// budget, whichever comes first (kickLingers). A kick whose open a command holds is not carried
// out (kickBusy), for the doorman to try again; anything else on the socket is kickBad, which
// ends the connection.
func (dr *door) carry(m *doorman) carried {
	if dr.n != reqHeader || binary.LittleEndian.Uint32(dr.in[:]) != opKick {
		return kickBad
	}
	var b [reqHeader]byte
	copy(b[:], dr.in[:reqHeader])
	// A kick that comes while another lingers ends that linger: the lingering kick is
	// answered now (its thread polls its CQ, as it would without the host device), before
	// this one, which may be what the receive needs.
	dr.interrupt()
	h, arg := binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint64(b[8:])
	qp := uint32(arg)
	wait := arg>>32&1 != 0
	binary.LittleEndian.PutUint32(b[4:], qp)
	if wait {
		// Owed before the waiter is registered: its receive may come at once.
		binary.LittleEndian.PutUint64(b[8:], arg>>33|1<<32)
		dr.mu.Lock()
		dr.tag++
		dr.owed, dr.answer, dr.deadline = true, b, time.Time{}
		dr.mu.Unlock()
	}
	budget, lingering, busy := dr.kick(h, qp, wait, &dr.waiter, m)
	if busy { // (nothing done: no waiter registered, and the kick comes again)
		dr.mu.Lock()
		dr.owed = false
		dr.mu.Unlock()
		return kickBusy
	}
	if budget > 0 { // (its receive, the next kick or the budget answers it)
		dr.mu.Lock()
		dr.deadline = time.Now().Add(budget)
		if dr.owed && !dr.waiting {
			dr.waiting = true
			dr.nwait.Add(1)
		}
		dr.mu.Unlock()
		return kickLingers
	}
	status := arg >> 33
	if lingering {
		status |= 1 << 32
	}
	binary.LittleEndian.PutUint64(b[8:], status)
	dr.mu.Lock()
	if dr.owed || !wait && lingering {
		dr.write(&b)
	}
	dr.answered()
	dr.mu.Unlock()
	return kickDone
}

// answered: the owed kick is answered (dr.mu held).
func (dr *door) answered() {
	dr.owed = false
	if dr.waiting {
		dr.waiting = false
		dr.nwait.Add(-1)
	}
}

// interrupt answers the kick owed an answer, if any, now, its waiter taken back (or told
// already: then the answer it was told of is this one, written here first).
func (dr *door) interrupt() {
	dr.mu.Lock()
	owed := dr.owed
	dr.mu.Unlock()
	if !owed { // (no waiter either: only the doorman, which calls this, registers one)
		return
	}
	dr.withdraw(&dr.waiter)
	dr.mu.Lock()
	if dr.owed {
		dr.answered()
		dr.write(&dr.answer)
	}
	dr.mu.Unlock()
}

// received is the waiter's Fn: the owed kick's receive came. It runs on the goroutine that
// counted the receive, with the engine's lock held. When that is the doorman carrying out a kick
// (by), the answer is left to it (doorman.flush); otherwise it is written now.
func (dr *door) received(by any) {
	dr.mu.Lock()
	owed, tag := dr.owed, dr.tag
	dr.mu.Unlock()
	if !owed {
		return
	}
	if m, ok := by.(*doorman); ok {
		m.told = append(m.told, told{dr, tag})
		return
	}
	dr.answerTold(tag)
}

// answerTold writes the answer of the owed kick numbered tag, unless it was answered meanwhile
// (the program kicked again).
func (dr *door) answerTold(tag uint64) {
	dr.mu.Lock()
	if dr.owed && dr.tag == tag {
		dr.answered()
		dr.write(&dr.answer)
	}
	dr.mu.Unlock()
}

// expire answers the owed kick if its linger budget ran out by now, its waiter taken back, and
// reports whether its program's thread still waits in it. The doorman calls it, each round while
// a program waits: no kick of the door is carried out meanwhile.
func (dr *door) expire(now time.Time) (waiting bool) {
	dr.mu.Lock()
	waiting = dr.waiting
	due := waiting && !now.Before(dr.deadline)
	dr.mu.Unlock()
	if !due || !dr.withdraw(&dr.waiter) {
		return waiting && !due // (told first: its answer is written, or left to the doorman)
	}
	dr.mu.Lock()
	if dr.owed {
		dr.answered()
		dr.write(&dr.answer)
	}
	dr.mu.Unlock()
	return false
}

// write sends the answer b, with dr.mu held, without blocking.
func (dr *door) write(b *[reqHeader]byte) {
	if dr.closed {
		return
	}
	dr.out = *b
	for {
		_, err := unix.Write(dr.fd, dr.out[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			// A program that leaves a socket's worth of answers unread: the doorman's next read
			// finds the socket ended, and it drops the program (not here, under the engine's lock).
			unix.Shutdown(dr.fd, unix.SHUT_RDWR)
			dr.closed = true
		}
		return
	}
}

// close ends the doorbell socket: the doorman finds it ended, and removes the door.
func (dr *door) close() {
	dr.mu.Lock()
	dr.closed = true
	if dr.fd >= 0 {
		unix.Shutdown(dr.fd, unix.SHUT_RDWR) // (epoll reports it; the doorman closes it)
	}
	dr.mu.Unlock()
}

// release closes the socket, once the doorman no longer reads it: no answer is written to it now.
func (dr *door) release() {
	dr.mu.Lock()
	dr.closed = true
	unix.Close(dr.fd)
	dr.fd = -1
	dr.mu.Unlock()
}
