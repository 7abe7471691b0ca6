package link

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
)

// UDP is a Link over UDP sockets: socket 0 is bound to the device's address and receives
// everything; sockets 1..paths-1 are bound to the same IP with ports of their own and only send.
// A datagram sent on path i leaves from socket i, so paths differ in source port, which is what
// ECMP routers hash.
//
// On Linux, Send and Receive move batches with sendmmsg and recvmmsg, with UDP GSO and GRO
// where the kernel has them, on sockets kept out of Go's network poller (sock_linux.go); elsewhere
// one datagram per system call. Receive, TryReceive and WaitReadable must be called from one
// goroutine at a time (the link's receiver); each poller from NewPoller by one goroutine at a
// time, beside them; Send may be called from several.
type UDP struct {
	socks  []socket
	local  netip.AddrPort
	closed atomic.Bool
	// inUse is held shared by every call that uses a socket, and by Close alone: Close waits
	// for the calls in flight before it lets the descriptors go.
	inUse sync.RWMutex

	rx  rxState // Receive's and TryReceive's scratch, owned by the receiving goroutine
	gro bool    // the kernel coalesces received runs (socket 0)
	// txs is a free list of send scratch: each sender takes one for its call and gives it back,
	// so no lock is held across sendmmsg and concurrent senders do not wait for one another.
	txs chan *batch
	gso atomic.Bool // sends go out as GSO runs
}

// DefaultSocketBuffer is the send and receive buffer size ListenUDP asks for.
const DefaultSocketBuffer = 4 << 20

// UDPOptions are the settings of a UDP link (config.Device carries them; docs/settings.md).
type UDPOptions struct {
	// NoOffload keeps UDP GSO and GRO off: every datagram crosses the kernel as a packet of its
	// own. For captures (a GSO run on loopback is one packet to a capture) and for measuring what
	// the offloads earn.
	NoOffload bool
}

// ListenUDP binds a device's sockets: the first on addr (port 0 picks one), the others on the
// same IP. addr's IP must be a concrete address, since it becomes part of the device's GID.
func ListenUDP(addr netip.AddrPort, paths int) (*UDP, error) {
	return ListenUDPOptions(addr, paths, UDPOptions{})
}

// ListenUDPOptions is ListenUDP with settings.
func ListenUDPOptions(addr netip.AddrPort, paths int, o UDPOptions) (*UDP, error) {
	if !addr.Addr().IsValid() || addr.Addr().IsUnspecified() {
		return nil, fmt.Errorf("link: %v: a device needs a concrete IP address", addr)
	}
	if paths < 1 || paths > 255 {
		return nil, fmt.Errorf("link: %d paths; 1 to 255", paths)
	}
	u := &UDP{txs: make(chan *batch, 8)}
	for i := range paths {
		a := addr
		if i > 0 {
			a = netip.AddrPortFrom(addr.Addr(), 0)
		}
		s, err := openSocket(a, DefaultSocketBuffer)
		if err != nil {
			u.Close()
			return nil, fmt.Errorf("link: %w", err)
		}
		u.socks = append(u.socks, s)
	}
	if err := u.initWait(); err != nil {
		u.Close()
		return nil, fmt.Errorf("link: %w", err)
	}
	if !o.NoOffload {
		u.enableOffload()
	}
	u.local = netip.AddrPortFrom(addr.Addr().Unmap(), u.socks[0].port())
	return u, nil
}

// LocalAddr is the address of socket 0.
func (u *UDP) LocalAddr() netip.AddrPort { return u.local }

// PathPorts returns each socket's port, path 0's (LocalAddr's) first.
func (u *UDP) PathPorts() []uint16 {
	ports := make([]uint16, len(u.socks))
	for i, s := range u.socks {
		ports[i] = s.port()
	}
	return ports
}

// Paths is the number of sockets.
func (u *UDP) Paths() int { return len(u.socks) }

// Close closes every socket; a blocked Receive, WaitReadable or Send returns ErrClosed.
func (u *UDP) Close() error {
	if u.closed.Swap(true) {
		return nil
	}
	u.interrupt()
	u.inUse.Lock() // the calls in flight have seen the signal and returned
	defer u.inUse.Unlock()
	u.closeWait() // (before the sockets close: a new socket may take a descriptor's number at once)
	for _, s := range u.socks {
		s.close()
	}
	return nil
}

// hold keeps the sockets open for a call, or reports false after Close; release ends it.
func (u *UDP) hold() bool {
	u.inUse.RLock()
	if u.closed.Load() {
		u.inUse.RUnlock()
		return false
	}
	return true
}

func (u *UDP) release() { u.inUse.RUnlock() }

// Send transmits pkts, batched per path.
func (u *UDP) Send(pkts []Packet) error {
	if !u.hold() {
		return ErrClosed
	}
	defer u.release()
	var b *batch
	select {
	case b = <-u.txs:
	default:
		b = new(batch) // more senders at once than ever before: kept after
	}
	defer func() {
		select {
		case u.txs <- b:
		default:
		}
	}()
	for start := 0; start < len(pkts); {
		path := pkts[start].Path
		end := start + 1
		for end < len(pkts) && pkts[end].Path == path {
			end++
		}
		if path < 0 || path >= len(u.socks) {
			path = 0
		}
		if err := u.sendPath(b, path, pkts[start:end]); err != nil {
			if u.closed.Load() {
				return ErrClosed
			}
			return err
		}
		start = end
	}
	return nil
}

// Receive reads datagrams from socket 0.
func (u *UDP) Receive(pkts []Packet) (int, error) {
	if !u.hold() {
		return 0, ErrClosed
	}
	defer u.release()
	n, err := u.receive(pkts)
	if err != nil && u.closed.Load() {
		return 0, ErrClosed
	}
	return n, err
}

// transient reports errors the network gives for single datagrams, which Send drops.
func transient(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EMSGSIZE)
}
