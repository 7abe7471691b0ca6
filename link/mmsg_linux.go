package link

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxBatch is the most datagrams one sendmmsg or recvmmsg moves.
const maxBatch = 64

// batch is the scratch space of one sendmmsg or recvmmsg call: message headers, one iovec and one
// socket address per datagram, the call's arguments and results, and the function handed to
// syscall.RawConn, made once so that a call allocates nothing.
type batch struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6

	n    int   // datagrams in the call
	done int   // datagrams sent or received
	wait bool  // receive: wait for readability when nothing is queued
	err  error // the call's error
	send func(fd uintptr) bool
	recv func(fd uintptr) bool
}

func (b *batch) init() {
	if b.hdrs != nil {
		return
	}
	b.hdrs = make([]unix.Mmsghdr, maxBatch)
	b.iovs = make([]unix.Iovec, maxBatch)
	b.names = make([]unix.RawSockaddrInet6, maxBatch)
	for i := range b.hdrs {
		h := &b.hdrs[i].Hdr
		h.Iov = &b.iovs[i]
		h.Iovlen = 1
		h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
	}
	b.send = b.sendmmsg
	b.recv = b.recvmmsg
}

// sendmmsg sends b.hdrs[b.done:b.n]; it returns false to wait for writability.
func (b *batch) sendmmsg(fd uintptr) bool {
	for b.done < b.n {
		r, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[b.done])),
			uintptr(b.n-b.done), unix.MSG_DONTWAIT, 0, 0)
		switch {
		case errno == unix.EAGAIN:
			return false
		case errno == unix.EINTR:
		case errno != 0 && transient(errno):
			b.done++ // the datagram at done is refused: drop it, send the rest
		case errno != 0:
			b.err = errno
			return true
		default:
			b.done += int(r)
		}
	}
	return true
}

// recvmmsg receives into b.hdrs[:b.n]; it returns false to wait for readability.
func (b *batch) recvmmsg(fd uintptr) bool {
	r, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(b.n),
		unix.MSG_DONTWAIT, 0, 0)
	switch errno {
	case unix.EAGAIN:
		return !b.wait
	case 0:
		b.done = int(r)
	default:
		b.err = errno
	}
	return true
}

func (u *UDP) sendPath(path int, pkts []Packet) error {
	b := &u.tx
	b.init()
	for len(pkts) > 0 {
		n := min(len(pkts), maxBatch)
		for i := range n {
			p := &pkts[i]
			b.iovs[i].Base = &p.Buf[0]
			b.iovs[i].SetLen(p.N)
			b.hdrs[i].Hdr.Namelen = putSockaddr(&b.names[i], p.Addr)
		}
		b.n, b.done, b.err = n, 0, nil
		if err := u.raws[path].Write(b.send); err != nil {
			return err
		}
		if b.err != nil {
			return b.err
		}
		pkts = pkts[n:]
	}
	return nil
}

func (u *UDP) receive(pkts []Packet) (int, error) { return u.recv(pkts, true) }

// TryReceive reads what socket 0 has queued without waiting.
func (u *UDP) TryReceive(pkts []Packet) (int, error) {
	n, err := u.recv(pkts, false)
	if err != nil && u.closed.Load() {
		return 0, ErrClosed
	}
	return n, err
}

func (u *UDP) recv(pkts []Packet, wait bool) (int, error) {
	b := &u.rx
	b.init()
	n := min(len(pkts), maxBatch)
	for i := range n {
		b.iovs[i].Base = &pkts[i].Buf[0]
		b.iovs[i].SetLen(len(pkts[i].Buf))
		b.hdrs[i].Hdr.Namelen = unix.SizeofSockaddrInet6
		b.hdrs[i].Hdr.Flags = 0
	}
	b.n, b.done, b.err, b.wait = n, 0, nil, wait
	if err := u.raws[0].Read(b.recv); err != nil {
		return 0, err
	}
	if b.err != nil {
		return 0, b.err
	}
	for i := range b.done {
		pkts[i].N = int(b.hdrs[i].Len)
		pkts[i].Addr = getSockaddr(&b.names[i])
		pkts[i].Path = 0
	}
	return b.done, nil
}

func putSockaddr(sa *unix.RawSockaddrInet6, ap netip.AddrPort) uint32 {
	a := ap.Addr()
	if a.Is4() {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		s4.Family = unix.AF_INET
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&s4.Port))[:], ap.Port())
		s4.Addr = a.As4()
		s4.Zero = [8]byte{}
		return unix.SizeofSockaddrInet4
	}
	sa.Family = unix.AF_INET6
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], ap.Port())
	sa.Flowinfo = 0
	sa.Addr = a.As16()
	sa.Scope_id = 0
	return unix.SizeofSockaddrInet6
}

func getSockaddr(sa *unix.RawSockaddrInet6) netip.AddrPort {
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	if sa.Family == unix.AF_INET {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), port)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port)
}
