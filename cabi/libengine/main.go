//go:build linux && cgo

// Command libengine is softefa's device engine as a C shared library (go build
// -buildmode=c-shared), loaded by the preload shim (cabi/shim/preload.c) when a program first
// opens the emulated device node. It serves the node's fds: each open gets a memfd and a uverbs
// File (package internal/uverbs) on the process's one engine device.
//
// The device is configured by the program's file that the launcher (softefa run) writes and
// SOFTEFA_CONF names (cabi.Conf; docs/settings.md, "The program's file"): its name, part id,
// paths, UDP endpoint (whose GID the sysfs tree shows) or the IP of a device of this process
// alone, and the settings softefa run's flags give; SOFTEFA_KEY turns on encryption, as for the
// other tools.
package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/softefa/softefa/cabi"
	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/uverbs"
	"github.com/softefa/softefa/link"
	"golang.org/x/sys/unix"
)

type open struct {
	f    *uverbs.File
	mfd  *uverbs.Memfd
	refs int // fds naming this open (dup)
}

var state struct {
	sync.Mutex
	dev   *uverbs.Device
	conf  cabi.Conf // the program's file, read when dev started
	files map[int32]*open
}

// polled is the process's engine device once started: what softefa_poll_net polls, without
// the state lock.
var polled atomic.Pointer[engine.Device]

// debugAtExit: the program's file asks for diagnostics (debug), which softefa_exit prints.
var debugAtExit atomic.Bool

// device starts the engine on first use. Called with state locked.
func device() (*uverbs.Device, error) {
	if state.dev != nil {
		return state.dev, nil
	}
	c, key, err := cabi.ReadConf()
	if err != nil {
		return nil, err
	}
	cfg := c.DeviceConfig()
	cfg.Key = key
	if ap := c.ListenAddr(); ap.IsValid() {
		cfg.Addr = ap
		l, err := link.ListenUDPOptions(ap, max(cfg.Paths, config.Default().Paths), link.UDPOptions{NoOffload: cfg.NoOffload})
		if err != nil {
			return nil, err
		}
		cfg.Link = l
	}
	e, err := engine.NewDevice(cfg)
	if err != nil {
		if cfg.Link != nil {
			cfg.Link.Close()
		}
		return nil, err
	}
	state.dev = uverbs.NewDevice(e)
	state.conf = c
	debugAtExit.Store(c.Debug)
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		// This Go runtime serves the device alone, and a ping-pong's thread, lingering after its
		// post, does most of the device's receiving: one processor for the rest, so that its
		// goroutines readied per datagram are not handed to threads woken beside the program's,
		// and the receive loop does not spin beside a lingering thread (docs/cabi.md, "Lingering
		// after a post"). One more for each program thread that calls in while the others are in
		// (softefa_procs).
		runtime.GOMAXPROCS(1)
		adaptProcs.Store(true)
	}
	state.files = make(map[int32]*open)
	polled.Store(e)
	return state.dev, nil
}

func fail(err error) C.int {
	fmt.Fprintf(os.Stderr, "softefa: %v\n", err)
	return -C.int(uverbs.Errno(err))
}

//export softefa_open
func softefa_open(flags C.int) C.int {
	state.Lock()
	defer state.Unlock()
	d, err := device()
	if err != nil {
		return fail(err)
	}
	m, err := uverbs.NewMemfd("softefa-uverbs")
	if err != nil {
		return fail(err)
	}
	cmd := unix.F_DUPFD
	if int(flags)&unix.O_CLOEXEC != 0 {
		cmd = unix.F_DUPFD_CLOEXEC
	}
	fd, err := unix.FcntlInt(uintptr(m.FD()), cmd, 3)
	if err != nil {
		m.Close()
		return fail(err)
	}
	state.files[int32(fd)] = &open{f: d.Open(procMem{}, m, nil), mfd: m, refs: 1}
	return C.int(fd)
}

//export softefa_write
func softefa_write(fd C.int, buf unsafe.Pointer, n C.size_t) C.long {
	state.Lock()
	o := state.files[int32(fd)]
	state.Unlock()
	if o == nil {
		return -C.long(syscall.EBADF)
	}
	if n > 1<<20 {
		return -C.long(syscall.EINVAL)
	}
	b := make([]byte, int(n))
	if err := (procMem{}).Read(uint64(uintptr(buf)), b); err != nil {
		return -C.long(syscall.EFAULT)
	}
	w, err := o.f.Write(b)
	if err != nil {
		return -C.long(uverbs.Errno(err))
	}
	return C.long(w)
}

//export softefa_sysfs
func softefa_sysfs(buf *C.char, n C.size_t) C.int {
	state.Lock()
	defer state.Unlock()
	d, err := device()
	if err != nil {
		return fail(err)
	}
	cfg := d.Engine().Config()
	dir, err := cabi.WriteProcessSysfs(state.conf.SysfsRoot, cfg.Name, d.Engine().GID(),
		cfg.VendorPartID, cfg.LinkSpeedGbps)
	if err != nil {
		return fail(err)
	}
	if len(dir)+1 > int(n) {
		return -C.int(syscall.ENAMETOOLONG)
	}
	out := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	out[copy(out, dir)] = 0
	return 0
}

// softefa_sysfs_counter is the program opening path, a file of its sysfs tree: when that is a
// port counter (ports/1/hw_counters/NAME), the file is rewritten with the counter's value now, as
// the kernel's hw_stat_device_show reads the device when the file is read. A file written whole
// under another name and renamed over the old one: a reader that opened it before sees the old
// value whole. The new file is made at the tree's root, beside sys/, so that no listing of the
// counters shows it. Other paths, and errors, leave the file as it was.
//
//export softefa_sysfs_counter
func softefa_sysfs_counter(path *C.char) {
	p, err := filepath.EvalSymlinks(C.GoString(path)) // as the tree has it: …/sys/devices/…
	if err != nil {
		return
	}
	dir, name := filepath.Dir(p), filepath.Base(p)
	root, _, ok := strings.Cut(p, "/sys/devices/")
	if !ok || filepath.Base(dir) != "hw_counters" || filepath.Base(filepath.Dir(filepath.Dir(dir))) != "ports" {
		return
	}
	state.Lock()
	d := state.dev
	state.Unlock()
	if d == nil {
		return
	}
	v, ok := d.HWCounter(name)
	if !ok {
		return
	}
	f, err := os.CreateTemp(root, "."+name+"-")
	if err != nil {
		return
	}
	_, err = fmt.Fprintf(f, "%d\n", v)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), p)
	}
	if err != nil {
		os.Remove(f.Name())
	}
}

//export softefa_ioctl
func softefa_ioctl(fd C.int, req C.ulong, arg unsafe.Pointer) C.int {
	o := lookup(fd)
	if o == nil {
		return -C.int(syscall.EBADF)
	}
	if err := o.f.Ioctl(uint32(req), uint64(uintptr(arg))); err != nil {
		return -C.int(uverbs.Errno(err))
	}
	return 0
}

// softefa_netlink answers the RDMA netlink request in buf, sent by the program on its socket
// with port id port, by writing the replies into peer, the other end of that socket's pair.
//
//export softefa_netlink
func softefa_netlink(peer C.int, port C.uint32_t, buf unsafe.Pointer, n C.size_t) C.int {
	if n > 1<<20 {
		return -C.int(syscall.EMSGSIZE)
	}
	req := make([]byte, int(n))
	if err := (procMem{}).Read(uint64(uintptr(buf)), req); err != nil {
		return -C.int(syscall.EFAULT)
	}
	state.Lock()
	d, err := device()
	conf := state.conf
	state.Unlock()
	if err != nil {
		return fail(err)
	}
	for _, msg := range d.Netlink(req, uint32(port), chardev(conf)) {
		if _, err := unix.Write(int(peer), msg); err != nil {
			return -C.int(uverbs.Errno(err))
		}
	}
	return 0
}

// chardev describes the device node as the launcher named it (the program's file: dev-path,
// dev-rdev): what RDMA netlink's GET_CHARDEV reports.
func chardev(c cabi.Conf) uverbs.Chardev {
	return uverbs.Chardev{Name: filepath.Base(c.DevPath), Major: c.DevMajor, Minor: c.DevMinor}
}

//export softefa_kick_qp
func softefa_kick_qp(fd C.int, handle C.uint32_t) {
	if o := lookup(fd); o != nil {
		o.f.Kick(uint32(handle))
	}
}

// softefa_db_page answers the shim's mmap of the device fd at off: the handle of the QP whose
// SQ doorbell page that is, or -1.
//
//export softefa_db_page
func softefa_db_page(fd C.int, off C.int64_t) C.int64_t {
	if o := lookup(fd); o != nil && off >= 0 {
		if h, ok := o.f.DoorbellPage(uint64(off)); ok {
			return C.int64_t(h)
		}
	}
	return -1
}

// softefa_db_rung is a trapped store to the SQ doorbell of the QP with handle h: the engine's
// Kick, with the linger of a ping-pong's post (uverbs.File.RingTrapped).
//
//export softefa_db_rung
func softefa_db_rung(fd C.int, handle C.uint32_t) {
	if o := lookup(fd); o != nil {
		o.f.RingTrapped(uint32(handle))
	}
}

// softefa_db_trapped tells the device whether the program's mappings of the SQ doorbell page of the
// QP with handle h trap every store (uverbs.File.TrapDoorbells).
//
//export softefa_db_trapped
func softefa_db_trapped(fd C.int, handle C.uint32_t, trapped C.int) {
	if o := lookup(fd); o != nil {
		o.f.TrapDoorbells(uint32(handle), trapped != 0)
	}
}

// adaptProcs is whether the engine chose its processors (GOMAXPROCS) itself, and so gives one to
// every program thread that calls in at once (softefa_procs).
var adaptProcs atomic.Bool

// softefa_procs is called by a program thread leaving the engine while callers threads, itself
// among them, are in it or waiting to enter: a thread that waits for the engine's only processor
// would wait for ever behind one that leaves and re-enters in a tight loop, which keeps taking it
// back (docs/cabi.md, "Threads of the program in the engine"). So the engine gets as many
// processors as threads call in at once, when it chose the number itself. It answers the number
// it has now, or the largest int when it does not choose it, so that the shim asks no more.
//
//export softefa_procs
func softefa_procs(callers C.int) C.int {
	if !adaptProcs.Load() {
		return C.int(math.MaxInt32)
	}
	if n := int(callers); n > runtime.GOMAXPROCS(0) {
		runtime.GOMAXPROCS(n)
	}
	return C.int(runtime.GOMAXPROCS(0))
}

//export softefa_poll_net
func softefa_poll_net() C.int {
	// An empty ibv_poll_cq: the polling thread takes what the network holds for the device
	// itself (engine.Device.PollNetwork), as the Go API's CQ.Poll does.
	if e := polled.Load(); e != nil && e.PollNetwork() {
		return 1
	}
	return 0
}

// softefa_exit is called as the process exits (the shim's atexit handler): the acknowledgements
// a busy poll left owed go now, or the peers would time out sends that were delivered
// (engine.Device.FlushAcks). With debug in the program's file it reports how many posts lingered.
//
//export softefa_exit
func softefa_exit() {
	if e := polled.Load(); e != nil {
		e.FlushAcks()
	}
	if debugAtExit.Load() {
		state.Lock()
		d := state.dev
		state.Unlock()
		fmt.Fprintf(os.Stderr, "softefa: debug: posts lingered: %d\n", d.Lingered())
	}
}

//export softefa_arm_cq
func softefa_arm_cq(fd C.int, handle C.uint32_t) {
	if o := lookup(fd); o != nil {
		o.f.Arm(uint32(handle))
	}
}

func lookup(fd C.int) *open {
	state.Lock()
	defer state.Unlock()
	return state.files[int32(fd)]
}

//export softefa_dup
func softefa_dup(fd, nfd C.int) {
	state.Lock()
	defer state.Unlock()
	if o := state.files[int32(fd)]; o != nil {
		state.files[int32(nfd)] = o
		o.refs++
	}
}

//export softefa_close
func softefa_close(fd C.int) {
	state.Lock()
	o := state.files[int32(fd)]
	delete(state.files, int32(fd))
	last := o != nil && o.refs == 1
	if o != nil {
		o.refs--
	}
	state.Unlock()
	if !last {
		return
	}
	_ = o.f.Close()
	_ = o.mfd.Close()
}

func main() {}
