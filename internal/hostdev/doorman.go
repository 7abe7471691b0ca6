//go:build linux

package hostdev

import (
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// doorman serves every program's doorbell socket from one goroutine on a thread of its own
// (docs/architecture.md, "Doorbells on the host device"). It waits in epoll_wait for the sockets
// with kicks and carries out up to doorRound kicks of each a round, so that no program keeps the
// others waiting. A round that finds none writes the answers told to it meanwhile (flush); after
// it the doorman sleeps in epoll_wait until the next kick, unless some program's thread sleeps in
// a lingering kick (sleepers): then it polls, on the core that thread gave up, and the kick that
// answers it, its peer's next post, is read by a thread already awake. A stream's programs,
// which spin themselves, so get no third spinner, and an idle device makes no wake-ups.
type doorman struct {
	ep   int // the epoll instance
	stop int // an eventfd: written by close
	wg   sync.WaitGroup

	sleepers atomic.Int32 // programs whose thread sleeps in a lingering kick

	mu      sync.Mutex
	doors   map[int32]*door // by fd
	stopped bool

	// the doorman's goroutine's own.
	told   []told // answers told to it while it carried out kicks (flush)
	events [64]unix.EpollEvent
}

// doorRound is how many kicks of one socket the doorman carries out before it turns to the
// others, and how many answers told to it it holds while kicks keep coming.
const doorRound = 8

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

// add has the doorman serve dr.
func (m *doorman) add(dr *door) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return syscall.ESHUTDOWN
	}
	dr.sleepers = &m.sleepers
	m.doors[int32(dr.fd)] = dr
	if err := unix.EpollCtl(m.ep, unix.EPOLL_CTL_ADD, dr.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(dr.fd)}); err != nil {
		delete(m.doors, int32(dr.fd))
		return err
	}
	return nil
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
	timeout := 0           // -1 after a round that found no kicks while no program sleeps
	for {
		n, err := unix.EpollWait(m.ep, m.events[:], timeout)
		if err == unix.EINTR {
			continue
		}
		if err != nil { // (the instance is the doorman's alone: not seen)
			m.shut(true)
			return
		}
		worked := false
		for _, ev := range m.events[:n] {
			if ev.Fd == int32(m.stop) {
				m.shut(false)
				return
			}
			m.mu.Lock()
			dr := m.doors[ev.Fd]
			m.mu.Unlock()
			if dr != nil {
				worked = true
				m.drain(dr)
			}
		}
		switch {
		case !worked:
			m.flush()
			if m.sleepers.Load() == 0 {
				timeout = -1
			}
		case len(m.told) >= doorRound:
			m.flush()
			timeout = 0
		default:
			timeout = 0
		}
	}
}

// drain carries out up to doorRound of dr's kicks.
func (m *doorman) drain(dr *door) {
	for range doorRound {
		var err error
		dr.n, _, err = unix.Recvfrom(dr.fd, dr.in[:], unix.MSG_DONTWAIT)
		if err == unix.EAGAIN {
			return
		}
		if err == unix.EINTR {
			continue
		}
		if err != nil || !dr.carry(m) {
			dr.drop() // (first: the program's connection ends before its doorbell socket does)
			m.remove(dr)
			return
		}
	}
}

// flush writes the answers told to the doorman.
func (m *doorman) flush() {
	for i, t := range m.told {
		t.dr.answerTold(t.tag)
		m.told[i] = told{}
	}
	m.told = m.told[:0]
}

// shut ends every door left, dropping its program if drop is set, and the doorman.
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
	unix.Close(m.stop)
}

// close stops the doorman and waits for it: every door left is ended, its owed answer written.
func (m *doorman) close() {
	unix.Write(m.stop, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	m.wg.Wait()
}
