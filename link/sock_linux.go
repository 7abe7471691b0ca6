package link

import (
	"net"
	"net/netip"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A socket is one of the link's UDP sockets as a bare descriptor, kept out of Go's network
// poller. A socket in the poller has its every readiness edge (a datagram come, send room freed)
// wake a thread parked in epoll_wait whenever Go has an idle processor and a timer pending, even
// with no goroutine waiting on the socket: while an application busy-polls a device, a thread
// woken per datagram beside the busy poller. So a receive waits in the poller on an epoll
// instance of the link's own (rxWait), in which socket 0 is armed for one event just before each
// wait, and nothing else; a send that finds no room waits in poll(2) with the link's wakeup
// beside the socket, which Close signals.
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
		// A deadline, not Close: the waiting call still holds ep and may use it once more;
		// Close (closeWait) lets it go after them.
		_ = u.rx.w.file.SetReadDeadline(time.Unix(1, 0))
	}
}

// closeWait lets Receive's way of waiting go, once no call uses it.
func (u *UDP) closeWait() {
	if u.rx.w != nil {
		u.rx.w.file.Close()
	}
}

// rxWait is how a receive waits for socket 0: an epoll instance holding socket 0 alone, with
// EPOLLONESHOT, in Go's network poller. Arming it (EPOLL_CTL_MOD) before a wait lets one
// readiness of the socket through, at once if datagrams are queued; between waits, datagrams
// wake nothing.
type rxWait struct {
	ep     int      // the epoll instance
	file   *os.File // ep in Go's network poller
	raw    syscall.RawConn
	events [1]unix.EpollEvent
	take   func(fd uintptr) bool // takes the event, if it came: RawConn.Read's function, made once
}

func newRxWait(sock int) (*rxWait, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(sock)}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, sock, &ev); err != nil {
		unix.Close(ep)
		return nil, err
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		return nil, err
	}
	w := &rxWait{ep: ep, file: os.NewFile(uintptr(ep), "softefa-rx-epoll")}
	if w.raw, err = w.file.SyscallConn(); err != nil {
		w.file.Close()
		return nil, err
	}
	w.take = func(uintptr) bool {
		n, err := unix.EpollWait(w.ep, w.events[:], 0)
		return n > 0 || err != nil && err != unix.EINTR
	}
	return w, nil
}

// initWait makes Receive's and WaitReadable's way of waiting for socket 0.
func (u *UDP) initWait() (err error) {
	u.rx.w, err = newRxWait(u.socks[0].fd)
	return err
}

// wait arms socket 0 for one readiness and waits in Go's network poller until it comes.
func (w *rxWait) wait(sock int) error {
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(sock)}
	if err := unix.EpollCtl(w.ep, unix.EPOLL_CTL_MOD, sock, &ev); err != nil {
		return err
	}
	return w.raw.Read(w.take)
}

// waitReadable waits until socket 0 may hold datagrams (rxWait), or the link is closed
// (ErrClosed). The caller holds the sockets (hold).
func (u *UDP) waitReadable() error {
	err := u.rx.w.wait(u.socks[0].fd)
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
