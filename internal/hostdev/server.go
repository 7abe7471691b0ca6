//go:build linux

package hostdev

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/uverbs"
	"golang.org/x/sys/unix"
)

// Server serves one device to the programs that connect to its socket. Each connection is one
// program process, known by the credentials the kernel gives for it (SO_PEERCRED); a goroutine
// per connection carries out its requests in order.
type Server struct {
	d    *uverbs.Device
	ln   *net.UnixListener
	path string

	// ProgramShare is the share (0 < share ≤ 1) of each of the device's maxima (PDs, MRs, CQs,
	// QPs, AHs) that one program may hold, over all its opens (uverbs.Quota): a program past it
	// gets ENOMEM and the device's other programs keep the rest. Set before Serve; Listen sets
	// DefaultProgramShare.
	ProgramShare float64

	mu      sync.Mutex // guards conns, peers and closed
	conns   map[*conn]struct{}
	peers   map[int]*peer // by process id, while a connection of the process is served
	closed  bool
	changed *sync.Cond // on mu: a program connected or was released
	wg      sync.WaitGroup

	stop     chan struct{} // closed when a program asks the device to stop (Stopped)
	stopping sync.Once

	dm *doorman // serves the doorbell sockets; made with the first (under mu)
}

// doorman returns the server's doorman, made with the first doorbell socket, and again after one
// stopped (its epoll instance failed: its programs were dropped).
func (s *Server) doorman() (*doorman, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, syscall.ESHUTDOWN
	}
	if s.dm != nil && s.dm.isStopped() {
		s.dm.close()
		s.dm = nil
	}
	if s.dm == nil {
		dm, err := newDoorman()
		if err != nil {
			return nil, err
		}
		s.dm = dm
	}
	return s.dm, nil
}

// Stopped returns a channel closed when a program has asked the device to stop (Client.Stop).
func (s *Server) Stopped() <-chan struct{} { return s.stop }

// Listen makes the device's socket at path (mode 0600) and returns the server; Serve accepts
// programs on it, of the device's own user only. path's directory must pass CheckDir. A socket
// file left at path by a device that is gone is replaced; one a live device answers on is
// EADDRINUSE.
func Listen(d *uverbs.Device, path string) (*Server, error) {
	if err := CheckDir(filepath.Dir(path)); err != nil {
		return nil, err
	}
	if c, err := net.Dial("unixpacket", path); err == nil {
		c.Close()
		return nil, fmt.Errorf("hostdev: a device serves %s already: %w", path, syscall.EADDRINUSE)
	}
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("hostdev: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("hostdev: %w", err)
	}
	s := &Server{d: d, ln: ln, path: path, ProgramShare: DefaultProgramShare, conns: make(map[*conn]struct{}), peers: make(map[int]*peer), stop: make(chan struct{})}
	s.changed = sync.NewCond(&s.mu)
	return s, nil
}

// Path returns the socket's path.
func (s *Server) Path() string { return s.path }

// Serve accepts programs until Close. Running out of fds (EMFILE, ENFILE) does not stop it: it
// waits a moment, longer each time up to a second, and accepts again.
func (s *Server) Serve() error {
	var backoff time.Duration
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
				errors.Is(err, syscall.ECONNABORTED) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		cn := &conn{s: s, c: c, files: make(map[uint32]*open)}
		s.conns[cn] = struct{}{}
		s.changed.Broadcast()
		s.wg.Add(1)
		s.mu.Unlock()
		go cn.serve()
	}
}

// Programs returns how many programs are connected.
func (s *Server) Programs() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// AwaitPrograms waits until n programs are connected (a program is counted until everything it
// made is released) or the server closes, and reports whether n are.
func (s *Server) AwaitPrograms(n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.conns) != n && !s.closed {
		s.changed.Wait()
	}
	return len(s.conns) == n
}

// Close stops accepting, disconnects every program (releasing what each made) and removes the
// socket file.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	s.changed.Broadcast()
	for c := range s.conns {
		c.c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close() // (removes the socket file: net.UnixListener unlinks on close)
	s.wg.Wait()
	s.mu.Lock()
	dm := s.dm
	s.mu.Unlock()
	if dm != nil {
		dm.close()
	}
	return err
}

// conn is one program's connection.
type conn struct {
	s     *Server
	c     *net.UnixConn
	proc  *mem.Process
	mu    sync.Mutex       // guards files against the doorman's lookups (a kick: doorbell)
	files map[uint32]*open // by handle; the connection's goroutine alone changes it
	next  uint32
	door  *door // the device's end of the program's doorbell socket (opDoorbell), or nil
	peer  *peer // the process's, shared by its connections; nil until known
	pid   int
	buf   []byte
	// later holds the kicks, arms and traps that came while a command waited for the program
	// to take an fd (giver.Give): the command holds its File's lock, which they take, so they are
	// carried out once it has returned.
	later [][reqHeader]byte
}

type open struct {
	f   *uverbs.File
	mfd *uverbs.Memfd
}

// peer is what the connections of one process share: its quota of the device's objects, its
// opens and its connections, bounded per process rather than per connection (a process could
// otherwise connect again for more). Its counts are guarded by Server.mu.
type peer struct {
	quota *uverbs.Quota
	opens int
	conns int
}

// join counts c as a connection of process pid, or reports false past maxConns.
func (c *conn) join(pid int) bool {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.peers[pid]
	if p == nil {
		p = &peer{quota: uverbs.NewQuota(s.d.Engine().Config(), s.ProgramShare)}
		s.peers[pid] = p
	}
	if p.conns >= maxConns {
		return false
	}
	p.conns++
	c.peer, c.pid = p, pid
	return true
}

// opened counts an open of c's process, or reports false past maxOpens; closed uncounts one.
func (c *conn) opened() bool {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.peer.opens >= maxOpens {
		return false
	}
	c.peer.opens++
	return true
}

func (c *conn) closed() {
	c.s.mu.Lock()
	c.peer.opens--
	c.s.mu.Unlock()
}

func (c *conn) serve() {
	defer c.s.wg.Done()
	defer c.release()
	cred, err := peerCred(c.c)
	if err != nil || int(cred.Uid) != os.Geteuid() {
		return // only the device's own user's programs (docs/security.md, "The host device")
	}
	if c.proc, err = peerProcess(c.c, int(cred.Pid)); err != nil || !c.join(int(cred.Pid)) {
		return
	}
	go func() { // a program that exits mid-command is disconnected at once
		<-c.proc.Exited()
		c.c.Close()
	}()
	c.buf = make([]byte, maxMessage)
	for {
		// (no room for control messages: fds a program attaches are closed by the kernel)
		n, _, flags, _, err := c.c.ReadMsgUnix(c.buf, nil)
		if err != nil || flags&unix.MSG_TRUNC != 0 {
			return
		}
		if n < reqHeader {
			return // not a program speaking this protocol
		}
		b := c.buf[:n]
		op, h, arg := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint64(b[8:])
		out, fd, ok := c.handle(op, h, arg, b[reqHeader:])
		for _, r := range c.later {
			c.handle(binary.LittleEndian.Uint32(r[:]), binary.LittleEndian.Uint32(r[4:]), binary.LittleEndian.Uint64(r[8:]), nil)
		}
		c.later = c.later[:0]
		if !ok {
			if fd >= 0 {
				unix.Close(fd)
			}
			return
		}
		if out == nil {
			continue // kick, arm: no reply
		}
		var rights []byte
		if fd >= 0 {
			rights = unix.UnixRights(fd)
		}
		_, _, err = c.c.WriteMsgUnix(out, rights, nil)
		if fd >= 0 {
			unix.Close(fd) // (the program has its copy)
		}
		if err != nil {
			return
		}
	}
}

// handle carries out one request and returns the reply (nil for none) and an fd to attach to it
// (-1 for none); false ends the connection (a protocol error).
func (c *conn) handle(op, h uint32, arg uint64, p []byte) ([]byte, int, bool) {
	o := c.lookup(h)
	need := func() bool { return o != nil }
	switch op {
	case opOpen:
		return c.open()
	case opWrite:
		if !need() {
			return reply(op, -int64(syscall.EBADF), nil), -1, true
		}
		n, err := o.f.Write(p)
		if err != nil {
			return reply(op, errnoStatus(err), nil), -1, true
		}
		return reply(op, int64(n), nil), -1, true
	case opIoctl:
		if !need() || len(p) != 4 {
			return reply(op, -int64(syscall.EBADF), nil), -1, true
		}
		return reply(op, errnoStatus(o.f.Ioctl(binary.LittleEndian.Uint32(p), arg)), nil), -1, true
	case opClose:
		if !need() {
			return reply(op, -int64(syscall.EBADF), nil), -1, true
		}
		c.mu.Lock()
		delete(c.files, h)
		c.mu.Unlock()
		err := errors.Join(o.f.Close(), o.mfd.Close())
		c.closed()
		return reply(op, errnoStatus(err), nil), -1, true
	case opKick:
		if need() {
			o.f.Kick(uint32(arg))
		}
		return nil, -1, true
	case opArm:
		if need() {
			o.f.Arm(uint32(arg))
		}
		return nil, -1, true
	case opDBPage:
		if !need() {
			return reply(op, -int64(syscall.EBADF), nil), -1, true
		}
		qp, ok := o.f.DoorbellPage(arg)
		if !ok {
			return reply(op, -int64(syscall.ENOENT), nil), -1, true
		}
		return reply(op, int64(qp), nil), -1, true
	case opTrap:
		if need() {
			o.f.TrapDoorbells(uint32(arg), arg>>32 != 0)
		}
		return nil, -1, true
	case opDoorbell:
		return c.doorbell()
	case opInfo:
		cfg := c.s.d.Engine().Config()
		i := Info{Name: cfg.Name, GID: c.s.d.Engine().GID(), PartID: cfg.VendorPartID, SpeedGbps: uint32(cfg.LinkSpeedGbps)}
		return reply(op, 0, i.encode()), -1, true
	case opCounter:
		v, ok := c.s.d.HWCounter(string(p))
		if !ok {
			return reply(op, -int64(syscall.ENOENT), nil), -1, true
		}
		return reply(op, 0, binary.LittleEndian.AppendUint64(nil, v)), -1, true
	case opStatus:
		// (the asking connection is not counted: softefa device status is no program)
		out := fmt.Appendf(nil, "programs %d\nopens %d\n", c.s.Programs()-1, c.s.d.Files())
		names, values := c.s.d.HWCounters()
		for i, n := range names {
			out = fmt.Appendf(out, "%s %d\n", n, values[i])
		}
		return reply(op, 0, out), -1, true
	case opStop:
		c.s.stopping.Do(func() { close(c.s.stop) })
		return reply(op, 0, nil), -1, true
	case opNetlink:
		ch, req, ok := decodeChardev(p)
		if !ok {
			return reply(op, -int64(syscall.EINVAL), nil), -1, true
		}
		var out []byte
		for _, m := range c.s.d.Netlink(req, uint32(arg), ch) {
			out = binary.LittleEndian.AppendUint32(out, uint32(len(m)))
			out = append(out, m...)
		}
		return reply(op, 0, out), -1, true
	}
	return nil, -1, false
}

// open is a program's open of the device node: a File whose memory is the program's and whose
// rings live in a memfd the program maps too.
func (c *conn) open() ([]byte, int, bool) {
	if !c.opened() {
		return reply(opOpen, -int64(syscall.EMFILE), nil), -1, true
	}
	m, err := uverbs.NewMemfd("softefa-uverbs")
	if err != nil {
		c.closed()
		return reply(opOpen, errnoStatus(err), nil), -1, true
	}
	fd, err := unix.Dup(m.FD())
	if err != nil {
		m.Close()
		c.closed()
		return reply(opOpen, errnoStatus(err), nil), -1, true
	}
	for c.files[c.next] != nil {
		c.next++
	}
	h := c.next
	c.next++
	o := &open{f: c.s.d.Open(uverbs.NewProcessMemory(c.proc), m, giver{c}), mfd: m}
	o.f.SetQuota(c.peer.quota)
	c.mu.Lock()
	c.files[h] = o
	c.mu.Unlock()
	return reply(opOpen, int64(h), nil), fd, true
}

// lookup returns the open with handle h, or nil.
func (c *conn) lookup(h uint32) *open {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.files[h]
}

// giver is FDs over the connection: the fd goes to the program, which answers with its number.
type giver struct{ c *conn }

func (g giver) Give(fd int) (int32, error) {
	c := g.c
	if _, _, err := c.c.WriteMsgUnix(reply(opGive, 0, nil), unix.UnixRights(fd), nil); err != nil {
		return -1, err
	}
	// The command holds its File's lock, which the device's async-event forwarder needs too: a
	// program that does not answer (stopped, or hostile) fails the command instead of holding it.
	_ = c.c.SetReadDeadline(time.Now().Add(giveTimeout))
	defer c.c.SetReadDeadline(time.Time{})
	var b [reqHeader]byte
	for {
		n, _, flags, _, err := c.c.ReadMsgUnix(b[:], nil)
		if err != nil {
			return -1, err
		}
		if op := binary.LittleEndian.Uint32(b[:]); n == reqHeader && flags&unix.MSG_TRUNC == 0 && (op == opKick || op == opArm || op == opTrap) {
			// another thread of the program rang a doorbell meanwhile: carried out after the
			// command, which holds the File's lock they take
			c.later = append(c.later, b)
			continue
		}
		if n != replyHeader || flags&unix.MSG_TRUNC != 0 || binary.LittleEndian.Uint32(b[:]) != opGive {
			return -1, fmt.Errorf("hostdev: the program did not take an fd: %w", syscall.EPROTO)
		}
		break
	}
	v := int64(binary.LittleEndian.Uint64(b[8:]))
	if v < 0 || v > 1<<31-1 {
		return -1, syscall.Errno(-v)
	}
	return int32(v), nil
}

// DefaultProgramShare is Server.ProgramShare's default: a quarter of each of the device's maxima
// (with config's defaults, 1,024 QPs and CQs, 16,383 PDs, MRs and AHs a program).
const DefaultProgramShare = 0.25

// maxOpens bounds a process's opens of the device node at once, over all its connections (each
// holds a memfd in the device): past it, EMFILE, as a process at its fd limit gets from the
// kernel. maxConns bounds its connections: past it, a connection is closed at once.
const (
	maxOpens = 64
	maxConns = 16
)

// giveTimeout is how long the device waits for a program to answer a give.
const giveTimeout = 10 * time.Second

// release closes everything the program made.
func (c *conn) release() {
	if c.door != nil {
		c.door.close()
	}
	c.mu.Lock()
	files := c.files
	c.files = nil
	c.mu.Unlock()
	for _, o := range files {
		_ = o.f.Close()
		_ = o.mfd.Close()
	}
	c.c.Close()
	if c.proc != nil {
		c.proc.Close()
	}
	c.s.mu.Lock()
	if p := c.peer; p != nil {
		p.opens -= len(files)
		if p.conns--; p.conns == 0 {
			delete(c.s.peers, c.pid)
		}
	}
	delete(c.s.conns, c)
	c.s.changed.Broadcast()
	c.s.mu.Unlock()
}

// peerCred returns the credentials of the program at the other end (SO_PEERCRED: its process
// and user when it connected).
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	return cred, cerr
}

// peerProcess returns the process at the other end, pid: by the pidfd the kernel took when it
// connected (SO_PEERPIDFD, Linux 6.5), which stays that process's even if it exits and its id is
// handed out again before the device looks; on older kernels by pidfd_open(pid), which a process
// that exits in those microseconds and whose id is reused would fool (docs/security.md).
func peerProcess(c *net.UnixConn, pid int) (*mem.Process, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, perr := -1, error(nil)
	if err := rc.Control(func(s uintptr) {
		fd, perr = unix.GetsockoptInt(int(s), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	}); err != nil {
		return nil, err
	}
	if errors.Is(perr, unix.ENOPROTOOPT) { // (before Linux 6.5)
		return mem.Open(pid)
	}
	if perr != nil {
		return nil, perr // (say, a peer already reaped: its id may be another's now)
	}
	return mem.FromPidfd(fd, pid), nil
}

func decodeChardev(p []byte) (uverbs.Chardev, []byte, bool) {
	if len(p) < 10 {
		return uverbs.Chardev{}, nil, false
	}
	n := int(binary.LittleEndian.Uint16(p[8:]))
	if len(p) < 10+n {
		return uverbs.Chardev{}, nil, false
	}
	ch := uverbs.Chardev{Major: binary.LittleEndian.Uint32(p), Minor: binary.LittleEndian.Uint32(p[4:]), Name: string(p[10 : 10+n])}
	return ch, p[10+n:], true
}
