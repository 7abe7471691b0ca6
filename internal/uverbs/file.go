//go:build linux

package uverbs

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/mem"
	"golang.org/x/sys/unix"
)

// Memory is the address space that commands point into: response buffers and the ranges of
// memory regions. Read and Write fail with EFAULT when the range is not accessible.
type Memory interface {
	Read(addr uint64, b []byte) error
	Write(addr uint64, b []byte) error
	// Span returns the n bytes at addr as the engine keeps them while a region is registered:
	// a slice of the device's own address space (the program's, when the device runs inside it)
	// or a range of the program's process (mem.In); EFAULT when any page of the range is not
	// mapped readable or, with write, not writable (ib_umem_get pins the pages for writing when
	// the access flags let anyone write them, which fails on a read-only mapping).
	Span(addr, n uint64, write bool) (mem.Span, error)
}

// FDs hands the program the fds its commands make: the async event fd (GET_CONTEXT) and
// completion channels (CREATE_COMP_CHANNEL), each the program's end of a socket pair.
type FDs interface {
	// Give gives the program a copy of fd and returns the number the program knows it by. fd
	// stays the File's: it reads the events the program has not (discardEvents) from it, and
	// closes it with the File.
	Give(fd int) (int32, error)
}

// OwnFDs is FDs for a program in the device's own process: its copy is a dup, close-on-exec as
// the kernel makes these fds.
type OwnFDs struct{}

// Give returns a dup of fd.
func (OwnFDs) Give(fd int) (int32, error) {
	n, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	return int32(n), err
}

// Regions is the mmap space of a command fd: page-aligned regions named by their offset, the
// mmap key. Alloc returns a zeroed region of at least size bytes and the device's view of it.
type Regions interface {
	Alloc(size int) (key uint64, b []byte, err error)
	Free(key uint64)
}

// Device is the device behind the command fds of a process: one engine and its identity.
type Device struct {
	e    *engine.Device
	cfg  config.Device
	guid uint64

	mu     sync.Mutex // guards files
	files  map[*File]struct{}
	cancel context.CancelFunc
	dbs    *watcher      // notices doorbell stores (doorbell.go)
	linger time.Duration // how long a ping-pong's post waits for the next receive (Linger; tests change it)

	lingered atomic.Uint64 // posts that waited for their answer (Lingered)
}

// Linger is how long a program's thread, ringing the SQ doorbell of a QP that ping-pongs, waits
// for the QP's next receive before it goes back to the program (File.RingTrapped, File.KickLinger;
// docs/cabi.md, "Lingering after a post"). It holds the program's thread for up to that long,
// which a program that computes after its send would feel; a ping-pong's round trip falls to a
// third. A millisecond, not less: a linger that runs out leaves the next answer to the receive
// loop, which waits for the Go runtime to take its processor back from the program's thread (a
// millisecond or two), and the peer's linger, waiting meanwhile, runs out in turn. The host
// device's program side (cabi/shim/hostdev.c, door_wait) looks for an answer for twice this long
// before it sleeps for it.
const Linger = time.Millisecond

// NewDevice wraps e. Close stops the async-event forwarder (the engine is the caller's). e's
// receive loop never parks beside a busy poll (engine.Device.NeverPark): a C program sleeps in
// ibv_get_cq_event, where the device does not see it stop polling.
func NewDevice(e *engine.Device) *Device {
	e.NeverPark()
	d := &Device{e: e, cfg: e.Config(), guid: GUID(e.GID()), files: make(map[*File]struct{}), linger: Linger}
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	d.dbs = newWatcher(e)
	go d.forwardAsync(ctx)
	return d
}

// GUID derives a device's node GUID from its GID, as package verbs does (FNV-1a).
func GUID(gid [16]byte) uint64 {
	h := fnv.New64a()
	h.Write(gid[:])
	return h.Sum64()
}

// GUID returns the node GUID (the sysfs node_guid and QUERY_DEVICE's node_guid).
func (d *Device) GUID() uint64 { return d.guid }

// Files returns how many Files are open on d.
func (d *Device) Files() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.files)
}

// Engine returns the device engine.
func (d *Device) Engine() *engine.Device { return d.e }

// Close stops the async-event forwarder and the doorbell watcher.
func (d *Device) Close() {
	d.cancel()
	d.dbs.close()
}

// File is one open of the device node: a ucontext once GET_CONTEXT has run.
type File struct {
	d   *Device
	mem Memory
	reg Regions
	fds FDs

	mu       sync.Mutex // serializes commands; guards everything below
	hasCtx   bool
	async    int // the device's end of the async-event socket pair; -1 before GET_CONTEXT
	asyncFD0 int // the File's copy of the program's end
	objs     map[uint32]any
	next     uint32
	channels map[int32]*compChannel // by the fd the program holds
	cqIdx    uint16
	closed   bool
	quota    *Quota // nil: none
}

// sameProcess reports whether f and g are opens of one process (g may be f): of one process
// reached from outside (ProcessMemory), by its id.
func (f *File) sameProcess(g *File) bool {
	if f == g {
		return true
	}
	a, ok := f.mem.(interface{ pid() int })
	b, ok2 := g.mem.(interface{ pid() int })
	return ok && ok2 && a.pid() != 0 && a.pid() == b.pid()
}

// Open returns a new File on d, whose commands point into mem, whose rings live in reg and
// whose event fds reach the program through fds (OwnFDs when nil).
func (d *Device) Open(mem Memory, reg Regions, fds FDs) *File {
	if fds == nil {
		fds = OwnFDs{}
	}
	f := &File{d: d, mem: mem, reg: reg, fds: fds, async: -1, objs: make(map[uint32]any), channels: make(map[int32]*compChannel)}
	d.mu.Lock()
	d.files[f] = struct{}{}
	d.mu.Unlock()
	return f
}

type pdObj struct{ pd *engine.PD }

type mrObj struct {
	mr  *engine.MR
	pdh uint32
}

type ahObj struct{ ah *engine.AH }

type cqObj struct {
	cq        *engine.CQ
	handle    uint64 // user_handle
	ch        *compChannel
	ringKey   uint64
	dbKey     uint64
	compSent  atomic.Uint32 // completion events written to the channel
	asyncSent atomic.Uint32 // async events written to the async fd
	dead      bool          // destroyed; guarded by File.mu
}

type qpObj struct {
	qp        *engine.QP
	f         *File
	handle    uint64
	typ       int
	sigAll    bool
	keys      []uint64
	dbKey     uint64 // the mmap key of its SQ doorbell page
	dbUntrap  bool   // a mapping of the SQ doorbell page does not trap (TrapDoorbells); guarded by File.mu
	dbTrapped bool   // a mapping of it was reported trapping (TrapDoorbells); guarded by File.mu
	asyncSent atomic.Uint32
	rungRecvs atomic.Uint64 // the QP's receive count when the send of its last trapped ring or kick was taken (RingTrapped, KickLinger)
	answers   atomic.Int32  // trapped rings in a row a receive followed, up to lingerAfter (lingers)
	lastSQ    atomic.Uint32 // the SQ doorbell at the QP's last kick carried out with a linger budget (KickLinger)
	dead      bool          // destroyed; guarded by File.mu
}

// compChannel is a completion channel: a socket pair whose far end the program reads
// ib_uverbs_comp_event_desc records from. A socket rather than a pipe, so that a write after the
// program closed its end fails with EPIPE instead of raising SIGPIPE.
type compChannel struct {
	user int32 // the program's number for its end
	kept int   // the File's copy of the program's end
	dev  int   // ours
}

// add inserts o in the handle table and returns its handle (handles start at 0, as the
// kernel's xarray hands them out).
func (f *File) add(o any) uint32 {
	for f.objs[f.next] != nil {
		f.next++
	}
	h := f.next
	f.objs[h] = o
	f.count(o, 1)
	f.next++
	return h
}

// remove deletes the object with handle h from the handle table.
func (f *File) remove(h uint32) {
	if o, ok := f.objs[h]; ok {
		delete(f.objs, h)
		f.count(o, -1)
	}
}

func lookup[T any](f *File, h uint32) (T, bool) {
	o, ok := f.objs[h].(T)
	return o, ok
}

// Close tears the ucontext down, as ib_uverbs_close does: every object of the File is destroyed
// (QPs, AHs, MRs, CQs, PDs, in that order) and its event sockets are closed.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	var errs []error
	order := []func(any) error{
		func(o any) error {
			if q, ok := o.(*qpObj); ok {
				q.dead = true
				f.d.dbs.remove(q.qp)
				err := f.d.e.DestroyQP(q.qp)
				f.freeKeys(q.keys)
				return err
			}
			return errSkip
		},
		func(o any) error {
			if a, ok := o.(*ahObj); ok {
				return f.d.e.DestroyAH(a.ah)
			}
			return errSkip
		},
		func(o any) error {
			if m, ok := o.(*mrObj); ok {
				return f.d.e.DeregMR(m.mr)
			}
			return errSkip
		},
		func(o any) error {
			if c, ok := o.(*cqObj); ok {
				c.dead = true
				err := f.d.e.DestroyCQ(c.cq)
				f.freeKeys([]uint64{c.ringKey, c.dbKey})
				return err
			}
			return errSkip
		},
		func(o any) error {
			if p, ok := o.(*pdObj); ok {
				return f.d.e.DeallocPD(p.pd)
			}
			return errSkip
		},
	}
	for _, destroy := range order {
		for h, o := range f.objs {
			if err := destroy(o); err != errSkip {
				if err != nil {
					errs = append(errs, err)
				}
				f.remove(h)
			}
		}
	}
	for fd, ch := range f.channels {
		closeFDs(ch.dev, ch.kept)
		delete(f.channels, fd)
	}
	if f.async >= 0 {
		closeFDs(f.async, f.asyncFD0)
		f.async = -1
	}
	f.d.mu.Lock()
	delete(f.d.files, f)
	f.d.mu.Unlock()
	return errors.Join(errs...)
}

var errSkip = errors.New("skip")

func (f *File) freeKeys(keys []uint64) {
	for _, k := range keys {
		f.reg.Free(k)
	}
}

// socketPair returns (ours, theirs): a nonblocking close-on-exec stream pair for events.
func socketPair() (int, int, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, -1, err
	}
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return -1, -1, err
	}
	return fds[0], fds[1], nil
}

// sendEvent writes one event record without blocking or raising SIGPIPE; it reports whether the
// whole record went out.
func sendEvent(fd int, rec []byte) bool {
	n, err := unix.SendmsgN(fd, rec, nil, nil, unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL)
	return err == nil && n == len(rec)
}

// forwardAsync delivers the engine's asynchronous events to the async fd of the File owning the
// object, as ib_uverbs_async_handler does; unaffiliated events go to every File.
func (d *Device) forwardAsync(ctx context.Context) {
	for {
		ev, err := d.e.GetAsyncEvent(ctx)
		if err != nil {
			return
		}
		var rec [16]byte
		put32(rec[:], 8, uint32(ev.Type))
		switch {
		case ev.QP != nil:
			if q, ok := ev.QP.Owner().(*qpObj); ok {
				put64(rec[:], 0, q.handle)
				q.f.deliverAsync(&q.dead, &q.asyncSent, rec[:])
			}
		case ev.CQ != nil:
			if c, ok := ev.CQ.Owner().(*cqOwner); ok {
				put64(rec[:], 0, c.obj.handle)
				c.f.deliverAsync(&c.obj.dead, &c.obj.asyncSent, rec[:])
			}
		default: // to every File; not under d.mu, which File.Close takes under File.mu
			d.mu.Lock()
			files := make([]*File, 0, len(d.files))
			for f := range d.files {
				files = append(files, f)
			}
			d.mu.Unlock()
			for _, f := range files {
				f.deliverAsync(nil, nil, rec[:])
			}
		}
	}
}

// deliverAsync writes an async event record for an object whose dead flag is *dead (nil for an
// unaffiliated event) and counts it in sent. Under f.mu, so that an object being destroyed gets
// no event after its destroy has discarded the unread ones and reported the count.
func (f *File) deliverAsync(dead *bool, sent *atomic.Uint32, rec []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.async < 0 || dead != nil && *dead {
		return
	}
	if sendEvent(f.async, rec) && sent != nil {
		sent.Add(1)
	}
}

// cqOwner is what a CQ's engine Owner holds: the File and the object, so that events find both.
type cqOwner struct {
	f   *File
	obj *cqObj
}

var _ = syscall.EINVAL

// Kick tells the engine that the program just posted to the QP with handle h (the shim's
// post_send, post_recv and wr_complete wrappers call it), so the engine looks at its rings at once.
// Unknown handles are ignored.
func (f *File) Kick(h uint32) { f.kick(h, nil) }

// kick is Kick on behalf of by (engine.Device.RingBy); it returns the QP rung, or nil for an
// unknown handle, and its SQ doorbell as the ring found it.
func (f *File) kick(h uint32, by any) (*qpObj, uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.objs[h].(*qpObj)
	if !ok {
		return nil, 0
	}
	sq := atomic.LoadUint32(o.qp.SQDoorbell()) // (under the lock: the QP and its page live)
	f.d.e.RingBy(o.qp, by)
	return o, sq
}

// DoorbellPage reports which QP's SQ doorbell page the mmap key names: its handle, or false when
// the key is not a QP's SQ doorbell page (its RQ doorbell page, a ring, a CQ's doorbell page,
// nothing). Only SQ doorbell stores trap: delivery reads the RQ doorbell itself.
func (f *File) DoorbellPage(key uint64) (uint32, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for h, o := range f.objs {
		if q, ok := o.(*qpObj); ok && q.dbKey == key {
			return h, true
		}
	}
	return 0, false
}

// TrapDoorbells tells the device how it learns of stores to the SQ doorbell of the QP with handle
// h, each time the program maps its SQ doorbell page. trapped: that mapping traps every store and
// rings the engine (the shim's doorbell traps, docs/cabi.md "Doorbells"), so the watcher leaves
// the QP alone, unless another mapping did not trap. Not trapped: stores to that mapping go
// through unseen, so the watcher scans the QP from now on. A QP whose mapping is never reported
// (made past the shim: libfabric's memory hooks overwrite the preloaded mmap with one that makes
// the system call itself) stays with the watcher. Unknown handles are ignored.
func (f *File) TrapDoorbells(h uint32, trapped bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.objs[h].(*qpObj)
	if !ok {
		return
	}
	o.dbUntrap = o.dbUntrap || !trapped
	o.dbTrapped = o.dbTrapped || trapped
	if o.dbUntrap || !o.dbTrapped {
		f.d.dbs.add(o.qp)
	} else {
		f.d.dbs.remove(o.qp)
	}
}

// Arm latches the completion-event request the program just stored in the doorbell of the CQ
// with handle h (the shim's req_notify_cq wrapper calls it). libefa's next poll rewrites the
// doorbell without the arm bit, so the engine must see it now. Unknown handles are ignored.
func (f *File) Arm(h uint32) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if o, ok := f.objs[h].(*cqObj); ok {
		f.d.e.ArmCQ(o.cq)
	}
}

// discardAsync removes the unread async events of the object with user handle element and
// returns how many there were. Called with f.mu held.
func (f *File) discardAsync(element uint64) uint32 {
	if f.async < 0 {
		return 0
	}
	return discardEvents(f.asyncFD0, f.async, 16, element)
}
