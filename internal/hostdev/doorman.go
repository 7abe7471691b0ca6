//go:build linux

package hostdev

import (
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softefa/softefa/internal/engine"
	"golang.org/x/sys/unix"
)

// doorman serves every program's doorbell socket from one goroutine on a thread of its own
// (docs/architecture.md, "Doorbells on the host device"). It waits in epoll_wait for the sockets
// with kicks and carries out up to doorRound kicks of each a round, so that no program keeps the
// others waiting, and at the end of each round writes the answers told to it meanwhile (flush).
// After a round that found no kicks it sleeps in epoll_wait until the next kick, unless some
// program's thread waits in a lingering kick (nwait): then it polls, yielding its core between
// polls to the waiting thread and its peer, and the kick that answers it, its peer's next post, is
// read by a thread already awake; each round it also answers the lingering kicks whose budget ran
// out (expire). A stream's programs, which poll their own CQs, so get no third poller, and an
// idle device makes no wake-ups. A kick whose open's lock is held (a command, an arm, a netlink
// dump; a give that waits for the program) is parked: its socket is left unread and the kick
// tried again each round, polling for parkedPoll and then every millisecond while nothing else
// wakes the doorman.
type doorman struct {
	ep   int // the epoll instance
	stop int // an eventfd, written by close
	wg   sync.WaitGroup
	once sync.Once // close's

	nwait atomic.Int32 // programs whose thread waits in a lingering kick

	mu      sync.Mutex
	doors   map[int32]*door // by fd
	stopped bool

	// the doorman's goroutine's own.
	told      []told    // answers told to it while it carried out kicks (flush)
	lingering []*door   // doors whose program may wait in a lingering kick (expire)
	parked    []*door   // doors whose kick found its open busy…
	parkedAt  time.Time // …since
	events    [64]unix.EpollEvent
}

// doorRound is how many kicks of one socket the doorman carries out before it turns to the
// others.
const doorRound = 8

// parkedPoll is how long the doorman polls for a parked kick's open to come free before it tries
// only every millisecond: a command, an arm or a netlink dump holds an open for microseconds, a
// give for as long as the program takes to answer.
const parkedPoll = 100 * time.Microsecond

// newDoorman starts a doorman; close stops it.
func newDoorman() (*doorman, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, err
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, stop, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(stop)}); err != nil {
		unix.Close(ep)
		unix.Close(stop)
		return nil, err
	}
	m := &doorman{ep: ep, stop: stop, doors: make(map[int32]*door)}
	m.wg.Add(1)
	go m.serve()
	return m, nil
}

// add has the doorman serve dr; ESHUTDOWN once it has stopped.
func (m *doorman) add(dr *door) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return syscall.ESHUTDOWN
	}
	dr.nwait = &m.nwait
	m.doors[int32(dr.fd)] = dr
	if err := unix.EpollCtl(m.ep, unix.EPOLL_CTL_ADD, dr.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(dr.fd)}); err != nil {
		delete(m.doors, int32(dr.fd))
		return err
	}
	return nil
}

// isStopped reports whether the doorman has stopped (close, or its epoll instance failed).
func (m *doorman) isStopped() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stopped
}

// remove ends dr: its owed answer written, its socket closed.
func (m *doorman) remove(dr *door) {
	m.mu.Lock()
	fd := int32(dr.fd)
	delete(m.doors, fd)
	unix.EpollCtl(m.ep, unix.EPOLL_CTL_DEL, int(fd), nil)
	m.mu.Unlock()
	dr.interrupt()
	dr.release()
}

func (m *doorman) serve() {
	defer m.wg.Done()
	runtime.LockOSThread() // (a kick wakes this thread, asleep in epoll_wait, directly)
	timeout := 0           // epoll_wait's: 0 to poll, -1 to sleep until a kick, 1 ms while parked
	for {
		n, err := unix.EpollWait(m.ep, m.events[:], timeout)
		if err == unix.EINTR {
			continue
		}
		if err != nil { // (the instance is the doorman's alone: not seen)
			m.shut(true)
			return
		}
		worked := m.retryParked()
		for _, ev := range m.events[:n] {
			if ev.Fd == int32(m.stop) {
				m.shut(false)
				return
			}
			m.mu.Lock()
			dr := m.doors[ev.Fd]
			m.mu.Unlock()
			if dr != nil && !dr.parked {
				worked = true
				m.drain(dr)
			}
		}
		m.flush()
		if len(m.lingering) > 0 {
			m.expire()
		}
		switch {
		case worked:
			timeout = 0
		case m.nwait.Load() > 0:
			timeout = 0
			engine.OSYield() // (the core may be the one a waiting program's thread or its peer needs)
		case len(m.parked) > 0 && time.Since(m.parkedAt) < parkedPoll:
			timeout = 0 // (most commands hold the open for microseconds)
		case len(m.parked) > 0:
			timeout = 1
		default:
			timeout = -1
		}
	}
}

// drain carries out up to doorRound of dr's kicks.
func (m *doorman) drain(dr *door) {
	for range doorRound {
		var err error
		dr.n, err = unix.Read(dr.fd, dr.in[:])
		if err == unix.EAGAIN {
			return
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			dr.n = 0
		}
		if !m.carry(dr) {
			return
		}
	}
}

// carry carries out dr's kick and reports whether dr's next may be read: not when the kick was
// parked or dr was dropped.
func (m *doorman) carry(dr *door) bool {
	switch dr.carry(m) {
	case kickLingers:
		if !dr.listed {
			dr.listed = true
			m.lingering = append(m.lingering, dr)
		}
	case kickBusy:
		// Out of the epoll set while parked: not even a hang-up of its socket wakes the doorman
		// (epoll reports those whatever events it is asked for).
		dr.parked = true
		if len(m.parked) == 0 {
			m.parkedAt = time.Now()
		}
		m.parked = append(m.parked, dr)
		m.mu.Lock()
		unix.EpollCtl(m.ep, unix.EPOLL_CTL_DEL, dr.fd, nil)
		m.mu.Unlock()
		return false
	case kickBad:
		dr.drop() // (first: the program's connection ends before its doorbell socket does)
		m.remove(dr)
		return false
	}
	return true
}

// retryParked tries the parked kicks again; a door whose kick is carried out is read again.
// It reports whether any was. A kick parked again goes to the end of the list, past the ones
// tried this round.
func (m *doorman) retryParked() bool {
	worked := false
	n := len(m.parked)
	for i := range n {
		dr := m.parked[i]
		dr.parked = false
		if !m.carry(dr) { // (parked again, or dropped)
			continue
		}
		worked = true
		m.mu.Lock()
		if m.doors[int32(dr.fd)] == dr { // (not removed meanwhile: carry may have dropped it)
			unix.EpollCtl(m.ep, unix.EPOLL_CTL_ADD, dr.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(dr.fd)})
		}
		m.mu.Unlock()
	}
	clear(m.parked[copy(m.parked, m.parked[n:]):])
	m.parked = m.parked[:len(m.parked)-n]
	return worked
}

// flush writes the answers told to the doorman.
func (m *doorman) flush() {
	for i, t := range m.told {
		t.dr.answerTold(t.tag)
		m.told[i] = told{}
	}
	m.told = m.told[:0]
}

// expire answers the lingering kicks whose budget ran out, and forgets the doors whose program
// no longer waits.
func (m *doorman) expire() {
	now := time.Now()
	keep := m.lingering[:0]
	for _, dr := range m.lingering {
		if dr.expire(now) {
			keep = append(keep, dr)
		} else {
			dr.listed = false
		}
	}
	clear(m.lingering[len(keep):])
	m.lingering = keep
}

// shut ends every door left, dropping its program if drop is set, and the doorman's epoll
// instance.
func (m *doorman) shut(drop bool) {
	m.flush()
	m.mu.Lock()
	m.stopped = true
	doors := m.doors
	m.doors = nil
	m.mu.Unlock()
	for _, dr := range doors {
		if drop {
			dr.drop()
		}
		dr.interrupt()
		dr.release()
	}
	unix.Close(m.ep)
}

// close stops the doorman and waits for it: every door left is ended (a program still connected
// is answered the kick it waits for). It may be called more than once.
func (m *doorman) close() {
	m.once.Do(func() {
		unix.Write(m.stop, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		m.wg.Wait()
		unix.Close(m.stop)
	})
}
