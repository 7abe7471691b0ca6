package link

import (
	"encoding/binary"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// maxBatch is the most entries one sendmmsg or recvmmsg moves; maxIovs the most datagrams one
// sendmmsg sends (entries can carry GSO runs); ctrlSlot the control-message room per entry.
const (
	maxBatch = 64
	maxIovs  = 256
	ctrlSlot = 32
)

// batch is the scratch space of one sendmmsg or recvmmsg call: message headers, one iovec and one
// socket address per datagram, and the call's arguments and results, made once so that a call
// allocates nothing.
type batch struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec // one per datagram; a GSO entry points at a run of them
	names []unix.RawSockaddrInet6
	ctrl  []byte // a control-message slot per entry (ctrlSlot bytes)

	n    int   // datagrams in the call
	done int   // datagrams sent or received
	err  error // the call's error
}

func (b *batch) init() {
	if b.hdrs != nil {
		return
	}
	b.hdrs = make([]unix.Mmsghdr, maxBatch)
	b.iovs = make([]unix.Iovec, maxIovs)
	b.names = make([]unix.RawSockaddrInet6, maxBatch)
	b.ctrl = make([]byte, maxBatch*ctrlSlot)
	for i := range b.hdrs {
		h := &b.hdrs[i].Hdr
		h.Iov = &b.iovs[i]
		h.Iovlen = 1
		h.Name = (*byte)(unsafe.Pointer(&b.names[i]))
	}
}

// sendmmsg sends b.hdrs[b.done:b.n]; it returns false to wait for writability.
//
// It and recvmmsg are raw system calls (no entersyscall): with MSG_DONTWAIT on a non-blocking
// socket neither waits for the socket, and an ordinary call that took longer than a tick of Go's
// sysmon had its processor handed to another thread, which woke for it. The price: the processor
// stays with the call for as long as it runs (on loopback a send does the receiver's kernel work
// too, up to 256 datagrams: hundreds of µs at 8 KiB), and the garbage collector's stops wait for
// it. The wait for a full buffer, in poll(2), remains an ordinary call (waitWritable).
func (b *batch) sendmmsg(fd int) bool {
	for b.done < b.n {
		r, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[b.done])),
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

// recvmmsg receives into b.hdrs[:b.n]; it returns false when nothing is queued.
func (b *batch) recvmmsg(fd int) bool {
	r, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&b.hdrs[0])), uintptr(b.n),
		unix.MSG_DONTWAIT, 0, 0)
	switch errno {
	case unix.EAGAIN:
		return false
	case 0:
		b.done = int(r)
	default:
		b.err = errno
	}
	return true
}

func (u *UDP) sendPath(b *batch, path int, pkts []Packet) error {
	b.init()
	for len(pkts) > 0 {
		h, iv := 0, 0
		for iv < len(pkts) && h < maxBatch {
			k := 1
			if u.gso.Load() {
				k = min(gsoRun(pkts[iv:]), maxIovs-iv)
			}
			if k == 0 {
				break
			}
			for j := range k {
				p := &pkts[iv+j]
				b.iovs[iv+j].Base = &p.Buf[0]
				b.iovs[iv+j].SetLen(p.N)
			}
			hdr := &b.hdrs[h].Hdr
			hdr.Iov, hdr.Iovlen = &b.iovs[iv], uint64(k)
			hdr.Namelen = putSockaddr(&b.names[h], pkts[iv].Addr)
			hdr.Control, hdr.Controllen = nil, 0
			if k > 1 {
				c := b.ctrl[h*ctrlSlot:][:ctrlSlot]
				putSegCmsg(c, pkts[iv].N)
				hdr.Control, hdr.Controllen = &c[0], uint64(cmsgSegSpace)
			}
			h++
			iv += k
		}
		b.n, b.done, b.err = h, 0, nil
		for !b.sendmmsg(u.socks[path].fd) {
			if err := u.waitWritable(path); err != nil {
				return err
			}
		}
		if b.err != nil {
			if u.gso.Load() && (b.err == unix.EIO || b.err == unix.EINVAL) {
				u.gso.Store(false) // the kernel or device cannot segment: send one by one from now on
				continue
			}
			return b.err
		}
		pkts = pkts[iv:]
	}
	return nil
}

func (u *UDP) receive(pkts []Packet) (int, error) { return u.rx.recv(u, pkts, true) }

// WaitReadable waits in Go's network poller, through the process's epoll instance (rxWait),
// until socket 0 holds datagrams, reading none (link.ReadWaiter).
func (u *UDP) WaitReadable() error {
	if !u.hold() {
		return ErrClosed
	}
	defer u.release()
	return u.waitReadable()
}

// TryReceive reads what socket 0 has queued without waiting.
func (u *UDP) TryReceive(pkts []Packet) (int, error) {
	if !u.hold() {
		return 0, ErrClosed
	}
	defer u.release()
	return u.rx.recv(u, pkts, false)
}

// NewPoller returns a receiver of its own on socket 0 that never waits, for a goroutine that
// busy-polls beside the one in Receive: each has its own buffers.
func (u *UDP) NewPoller() Poller { return &udpPoller{u: u} }

type udpPoller struct {
	u  *UDP
	rx rxState
}

func (p *udpPoller) TryReceive(pkts []Packet) (int, error) {
	if !p.u.hold() {
		return 0, ErrClosed
	}
	defer p.u.release()
	return p.rx.recv(p.u, pkts, false)
}

// Backlogged reports whether the last TryReceive may have left datagrams behind (link.Backlogger).
func (p *udpPoller) Backlogged() bool { return p.rx.backlogged() }

// rxState is one receiver's scratch: its recvmmsg batch and, with GRO, the runs received and not
// yet handed out.
type rxState struct {
	b      batch
	w      *rxWait       // how Receive's state waits (initWait); pollers never wait
	groBuf []byte        // GRO's run buffers
	pend   []superpacket // runs received; pend[pendAt:] not yet handed out
	pendAt int
}

// backlogged reports whether the last recv may have left datagrams behind: runs it has not
// handed out, or a system call that filled every entry it offered.
func (r *rxState) backlogged() bool {
	return r.pendAt < len(r.pend) || r.b.n > 0 && r.b.done == r.b.n
}

func (r *rxState) recv(u *UDP, pkts []Packet, wait bool) (int, error) {
	if u.gro {
		return r.recvGRO(u, pkts, wait)
	}
	b := &r.b
	b.init()
	n := min(len(pkts), maxBatch)
	for i := range n {
		hdr := &b.hdrs[i].Hdr
		b.iovs[i].Base = &pkts[i].Buf[0]
		b.iovs[i].SetLen(len(pkts[i].Buf))
		hdr.Iov, hdr.Iovlen = &b.iovs[i], 1
		hdr.Namelen = unix.SizeofSockaddrInet6
		hdr.Control, hdr.Controllen, hdr.Flags = nil, 0, 0
	}
	if err := r.recvmmsg(u, n, wait); err != nil {
		return 0, err
	}
	for i := range b.done {
		pkts[i].N = int(b.hdrs[i].Len)
		pkts[i].Addr = getSockaddr(&b.names[i])
		pkts[i].Path = 0
	}
	return b.done, nil
}

// recvmmsg receives up to n datagrams from socket 0, waiting for one if wait is set. The caller
// holds the sockets (hold).
func (r *rxState) recvmmsg(u *UDP, n int, wait bool) error {
	b := &r.b
	b.n, b.done, b.err = n, 0, nil
	for !b.recvmmsg(u.socks[0].fd) && wait {
		if err := u.waitReadable(); err != nil {
			return err
		}
	}
	return b.err
}

// recvGRO reads coalesced runs into the receiver's own buffers and cuts them into pkts; what does
// not fit waits in r.pend for the next call.
func (r *rxState) recvGRO(u *UDP, pkts []Packet, wait bool) (int, error) {
	if out := r.drainGRO(pkts); out > 0 {
		return out, nil
	}
	b := &r.b
	b.init()
	if r.groBuf == nil {
		r.groBuf = make([]byte, groBufs*groBufSize)
	}
	for i := range groBufs {
		hdr := &b.hdrs[i].Hdr
		b.iovs[i].Base = &r.groBuf[i*groBufSize]
		b.iovs[i].SetLen(groBufSize)
		hdr.Iov, hdr.Iovlen = &b.iovs[i], 1
		hdr.Namelen = unix.SizeofSockaddrInet6
		c := b.ctrl[i*ctrlSlot:][:ctrlSlot]
		hdr.Control, hdr.Controllen, hdr.Flags = &c[0], uint64(cmsgGROSpace), 0
	}
	if err := r.recvmmsg(u, groBufs, wait); err != nil {
		return 0, err
	}
	r.pend, r.pendAt = r.pend[:0], 0
	for i := range b.done {
		n := int(b.hdrs[i].Len)
		size := groSize(b.ctrl[i*ctrlSlot:][:ctrlSlot], int(b.hdrs[i].Hdr.Controllen))
		if size <= 0 || size > n {
			size = n
		}
		r.pend = append(r.pend, superpacket{data: r.groBuf[i*groBufSize:][:n], size: size, addr: getSockaddr(&b.names[i])})
	}
	return r.drainGRO(pkts), nil
}

// superpacket is a run of datagrams GRO delivered in one buffer, each size bytes but the last.
type superpacket struct {
	data []byte
	size int
	addr netip.AddrPort
}

// drainGRO copies pending datagrams into pkts.
func (r *rxState) drainGRO(pkts []Packet) int {
	out := 0
	for r.pendAt < len(r.pend) && out < len(pkts) {
		sp := &r.pend[r.pendAt]
		n := min(sp.size, len(sp.data))
		pkts[out].N = copy(pkts[out].Buf, sp.data[:n])
		pkts[out].Addr, pkts[out].Path = sp.addr, 0
		out++
		sp.data = sp.data[n:]
		if len(sp.data) == 0 {
			r.pendAt++
		}
	}
	return out
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
