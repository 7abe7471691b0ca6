package link

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// A socket is one of the link's UDP sockets as a bare descriptor, kept out of Go's network
// poller. A socket in the poller has its every readiness edge (a datagram come, send room freed)
// wake a thread parked in epoll_wait whenever Go has an idle processor and a timer pending, even
// with no goroutine waiting on the socket: while an application busy-polls a device, a thread
// woken per datagram beside the busy poller. So a receive waits on the process's one epoll
// instance, in the poller (waitHub), which holds every link's socket 0, each armed for one event
// just before its link's wait; a send that finds no room waits in poll(2) on the socket, which
// Close ends by shutting the socket down (interrupt).
type socket struct {
	fd    int
	local uint16 // the port bound
}

// openSocket binds a non-blocking UDP socket to a, with send and receive buffers of size bytes:
// past net.core.rmem_max and wmem_max where the process may (CAP_NET_ADMIN).
func openSocket(a netip.AddrPort, size int) (socket, error) {
	ip := a.Addr().Unmap()
	family := unix.AF_INET6
	if ip.Is4() {
		family = unix.AF_INET
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return socket{}, err
	}
	var sa unix.Sockaddr
	if family == unix.AF_INET {
		sa = &unix.SockaddrInet4{Port: int(a.Port()), Addr: ip.As4()}
	} else {
		sa6 := &unix.SockaddrInet6{Port: int(a.Port()), Addr: ip.As16()}
		if zone := ip.Zone(); zone != "" {
			if n, err := strconv.ParseUint(zone, 10, 32); err == nil {
				sa6.ZoneId = uint32(n) // a numeric zone is the interface's index
			} else if ifi, err := net.InterfaceByName(zone); err == nil {
				sa6.ZoneId = uint32(ifi.Index)
			} else {
				unix.Close(fd)
				return socket{}, &netError{"listen", a, err}
			}
		}
		sa = sa6
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return socket{}, &netError{"bind", a, err}
	}
	for _, opt := range []int{unix.SO_RCVBUF, unix.SO_SNDBUF, unix.SO_RCVBUFFORCE, unix.SO_SNDBUFFORCE} {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, opt, size)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BROADCAST, 1) // as package net's UDP sockets
	bound, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return socket{}, err
	}
	s := socket{fd: fd}
	switch b := bound.(type) {
	case *unix.SockaddrInet4:
		s.local = uint16(b.Port)
	case *unix.SockaddrInet6:
		s.local = uint16(b.Port)
	}
	return s, nil
}

func (s socket) port() uint16 { return s.local }

func (s socket) close() { unix.Close(s.fd) }

// interrupt ends the calls waiting on the sockets, for Close, which then waits for them. Shutting
// a socket down wakes whatever polls it, and it polls as hung up from then on, even an
// unconnected UDP socket (whose shutdown fails with ENOTCONN, but takes effect): so no wait
// needs a descriptor of its own beside the socket for Close to signal.
func (u *UDP) interrupt() {
	for _, s := range u.socks {
		_ = unix.Shutdown(s.fd, unix.SHUT_RDWR)
	}
	if u.rx.w != nil {
		close(u.rx.w.closed)
	}
}

// closeWait takes socket 0 out of the process's epoll instance, once no call uses it.
func (u *UDP) closeWait() {
	if u.rx.w != nil {
		hub.remove(u.rx.w)
	}
}

// rxWait is how a receive waits for socket 0: the socket is registered in the process's one
// epoll instance (waitHub) with EPOLLONESHOT, and arming it (EPOLL_CTL_MOD) before a wait lets
// one readiness of the socket through, at once if datagrams are queued; between waits,
// datagrams wake nothing. The hub's goroutine hands the event to the waiter on ready. One
// goroutine waits on a link at a time (the link's receiver: UDP's contract).
type rxWait struct {
	sock   int
	ready  chan struct{} // a token per event (1 buffered)
	closed chan struct{} // closed by interrupt
	dead   chan struct{} // the hub's: closed if its goroutine stops (waitHub.err)
}

// waitHub is the process's epoll instance for every link's socket 0, in Go's network poller, and
// the goroutine that takes its events: one descriptor for all the links of a process, not one
// each (a process of the many-peers bench holds 10,000 one-path devices).
type waitHub struct {
	mu      sync.Mutex
	ep      int
	file    *os.File // ep in the poller (nil until made); kept, or its finalizer would close ep
	raw     syscall.RawConn
	waiters map[int32]*rxWait // by socket descriptor
	dead    chan struct{}     // closed when run stops, with err: every wait then fails with it
	err     error
}

var hub waitHub

// start makes the epoll instance and starts the goroutine that hands its events out, unless they
// are made. A failure to make them is the caller's (the next link tries again); a failure of the
// goroutine's, later, every link's. h.mu is held.
func (h *waitHub) start() error {
	switch {
	case h.err != nil:
		return h.err
	case h.file != nil:
		return nil
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		return err
	}
	file := os.NewFile(uintptr(ep), "softefa-rx-epoll")
	raw, err := file.SyscallConn()
	if err != nil {
		file.Close()
		return err
	}
	h.ep, h.file, h.raw = ep, file, raw
	h.waiters, h.dead = make(map[int32]*rxWait), make(chan struct{})
	go h.run()
	return nil
}

// run waits in Go's network poller for the epoll instance's events and hands each to its
// socket's waiter, for the process's life. Should the instance fail (it is never closed), run
// stops, and every wait, now and later, fails with the error rather than waiting for good.
func (h *waitHub) run() {
	var events [64]unix.EpollEvent
	var n int
	var failed error
	take := func(uintptr) bool {
		for {
			n, failed = unix.EpollWait(h.ep, events[:], 0)
			switch failed {
			case unix.EINTR:
				continue
			case nil:
				return n > 0 // (nothing after all: wait for the next readiness)
			}
			return true
		}
	}
	for {
		err := h.raw.Read(take)
		if err == nil {
			err = failed
		}
		h.mu.Lock()
		if err != nil {
			h.err = fmt.Errorf("link: the epoll instance receives wait through failed: %w", err)
			close(h.dead)
			h.mu.Unlock()
			return
		}
		for _, ev := range events[:n] {
			// A socket closed meanwhile is gone from the map; one whose descriptor a new
			// link took gets a wake-up it may not need, which a wait allows.
			if w := h.waiters[ev.Fd]; w != nil {
				select {
				case w.ready <- struct{}{}:
				default:
				}
			}
		}
		h.mu.Unlock()
	}
}

// add registers sock, armed for nothing but errors and hang-ups (which epoll always reports:
// Close's shutdown may so bring a wake-up no wait needs) until its first wait.
func (h *waitHub) add(sock int) (*rxWait, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.start(); err != nil {
		return nil, err
	}
	w := &rxWait{sock: sock, ready: make(chan struct{}, 1), closed: make(chan struct{}), dead: h.dead}
	ev := unix.EpollEvent{Events: unix.EPOLLONESHOT, Fd: int32(sock)}
	if err := unix.EpollCtl(h.ep, unix.EPOLL_CTL_ADD, sock, &ev); err != nil {
		return nil, err
	}
	h.waiters[int32(sock)] = w
	return w, nil
}

// remove takes w's socket out, before the socket is closed.
func (h *waitHub) remove(w *rxWait) {
	h.mu.Lock()
	defer h.mu.Unlock()
	_ = unix.EpollCtl(h.ep, unix.EPOLL_CTL_DEL, w.sock, nil)
	if h.waiters[int32(w.sock)] == w {
		delete(h.waiters, int32(w.sock))
	}
}

// initWait registers socket 0 for Receive's and WaitReadable's waits.
func (u *UDP) initWait() (err error) {
	u.rx.w, err = hub.add(u.socks[0].fd)
	return err
}

// wait arms the socket for one readiness and waits until the hub hands it over, or interrupt.
func (w *rxWait) wait() error {
	select {
	case <-w.ready: // an event of an earlier arm that came after its wait ended
	default:
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(w.sock)}
	if err := unix.EpollCtl(hub.ep, unix.EPOLL_CTL_MOD, w.sock, &ev); err != nil {
		return err
	}
	select {
	case <-w.ready:
	case <-w.closed:
	case <-w.dead:
		return hub.err
	}
	return nil
}

// waitReadable waits until socket 0 may hold datagrams (rxWait), or the link is closed
// (ErrClosed). The caller holds the sockets (hold).
func (u *UDP) waitReadable() error {
	err := u.rx.w.wait()
	if u.closed.Load() {
		return ErrClosed
	}
	return err
}

// waitWritable waits in poll(2) until socket i may take a datagram, or the link is closed
// (ErrClosed: interrupt shuts the socket down, which ends the poll). The caller holds the
// sockets (hold).
func (u *UDP) waitWritable(i int) error {
	fds := [1]unix.PollFd{{Fd: int32(u.socks[i].fd), Events: unix.POLLOUT}}
	for {
		_, err := unix.Poll(fds[:], -1)
		switch {
		case u.closed.Load():
			return ErrClosed
		case err == unix.EINTR:
		case err != nil:
			return err
		default:
			return nil
		}
	}
}

// netError is a socket call's error with the address, as package net words it.
type netError struct {
	op   string
	addr netip.AddrPort
	err  error
}

func (e *netError) Error() string { return e.op + " udp " + e.addr.String() + ": " + e.err.Error() }
func (e *netError) Unwrap() error { return e.err }
