// Package link is the device's way onto a network: a small batch-first interface over datagrams,
// with a UDP implementation (one socket per path, so that each path has its own source port and
// ECMP hashing spreads them) and, in package memlink, an in-memory fabric for tests.
//
// Buffers belong to the caller: Send reads pkts[i].Buf[:N] before it returns, and Receive fills
// the caller's Buf slices. Neither keeps a reference, so a caller can reuse one set of buffers for
// every call, and neither allocates per packet.
package link

import (
	"errors"
	"net/netip"
)

// Packet is one datagram: Buf[:N] holds its bytes; Addr is the peer (destination on Send, source
// on Receive); Path is the local path index (the socket it leaves from, or arrived on).
type Packet struct {
	Buf  []byte
	N    int
	Addr netip.AddrPort
	Path int
}

// Link carries datagrams for one device.
type Link interface {
	// Send transmits each packet from its path to its address. Datagrams the network refuses
	// (an unreachable address, a full buffer) are dropped silently, as the network would drop
	// them; an error means the link itself failed.
	Send(pkts []Packet) error
	// Receive waits for at least one datagram, fills pkts from the front and returns how many.
	// After Close it returns ErrClosed.
	Receive(pkts []Packet) (int, error)
	// LocalAddr is the device's address: where peers send to.
	LocalAddr() netip.AddrPort
	// Paths is the number of paths (source ports) the link sends on.
	Paths() int
	Close() error
}

// Poller is a Link that can also be read without waiting, which lets a receiver spin for a
// moment after traffic instead of parking in the network poller.
type Poller interface {
	// TryReceive is Receive that returns 0 at once when nothing is queued.
	TryReceive(pkts []Packet) (int, error)
}

// Backlogger is a Poller that tells whether its last TryReceive may have left datagrams behind:
// it filled every slot its system call offered, or it holds datagrams it received and has not
// handed out (with GRO, the rest of a run). A reader that looks once after a pause reads on while
// it reports so. A Poller without it is taken to have left some when it filled pkts.
type Backlogger interface {
	Backlogged() bool
}

// BusyPoller is a Link that gives out extra receivers, each with buffers of its own, that never
// wait and may run beside Receive and beside each other: for goroutines that busy-poll the
// network when they find nothing to do, while the device's receive goroutine is parked.
type BusyPoller interface {
	NewPoller() Poller
}

// ReadWaiter is a BusyPoller whose receive goroutine can wait for datagrams without reading
// them: it then reads with a poller, as the busy pollers do, under the same lock, so that what
// one goroutine read is handled before what another reads after it (the receiver's
// acknowledgements follow the order the network delivered in).
type ReadWaiter interface {
	// WaitReadable returns when socket 0 may hold datagrams (at once if it may already), or
	// with ErrClosed once the link is closed. It does not see datagrams a poller has read and
	// not handed out yet (with GRO, the rest of a run): a reader reads until a read finds
	// nothing before it waits. One goroutine waits at a time: the receive goroutine.
	WaitReadable() error
}

// PathPorter is a Link whose paths send from UDP ports of their own (a UDP link's sockets):
// PathPorts returns them, path 0's first (LocalAddr's port). A Link without it sends every path
// from LocalAddr's port. Peers learn these ports to tell the device's own datagrams from others
// sent from its IP (docs/security.md).
type PathPorter interface {
	PathPorts() []uint16
}

// ErrClosed is returned by Receive and Send after Close.
var ErrClosed = errors.New("link: closed")
