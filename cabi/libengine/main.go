//go:build linux && cgo

// Command libengine is softefa's device engine as a C shared library (go build
// -buildmode=c-shared), loaded by the preload shim (cabi/shim/preload.c) when a program first
// opens the emulated device node. It serves the node's fds: each open gets a memfd and a uverbs
// File (package internal/uverbs) on the process's one engine device.
//
// The device is configured from the environment the launcher (softefa run) sets:
// SOFTEFA_ADDR (the UDP endpoint, ip:port, whose GID the sysfs tree shows), SOFTEFA_NAME and
// SOFTEFA_PATHS, SOFTEFA_PART_ID, and the settings softefa run's flags give (cabi.Settings;
// docs/settings.md); SOFTEFA_KEY turns on encryption, as for the other tools.
package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"cmp"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
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
	files map[int32]*open
}

// polled is the process's engine device once started: what softefa_poll_net polls, without
// the state lock.
var polled atomic.Pointer[engine.Device]

// device starts the engine on first use. Called with state locked.
func device() (*uverbs.Device, error) {
	if state.dev != nil {
		return state.dev, nil
	}
	cfg := config.Device{Name: os.Getenv("SOFTEFA_NAME")}
	if v := os.Getenv("SOFTEFA_PATHS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return nil, fmt.Errorf("SOFTEFA_PATHS=%q: %w", v, err)
		}
		cfg.Paths = n
	}
	// The receive loop does not spin unless told to: programs on this ABI busy-poll their CQs
	// themselves, and a spinning engine thread takes the CPU they need (ib_send_lat -s 64 on 2
	// vCPUs: 70 µs typical without, 0.7 ms with the default 200 µs).
	cfg.RxSpin = -1
	if v, ok, err := cabi.EnvDuration("SOFTEFA_RXSPIN"); err != nil {
		return nil, err
	} else if ok && v > 0 {
		cfg.RxSpin = v
	}
	var err error
	if cfg.NoSparseCopies, err = cabi.EnvBool("SOFTEFA_NO_SPARSE_COPIES"); err != nil {
		return nil, err
	}
	if cfg.NoOffload, err = cabi.EnvBool("SOFTEFA_NO_OFFLOAD"); err != nil {
		return nil, err
	}
	if v := os.Getenv("SOFTEFA_PART_ID"); v != "" {
		n, err := strconv.ParseUint(v, 0, 32)
		if err != nil {
			return nil, fmt.Errorf("SOFTEFA_PART_ID=%q: %w", v, err)
		}
		cfg.VendorPartID = uint32(n)
	}
	if _, ok := os.LookupEnv("SOFTEFA_KEY"); ok {
		k, err := config.KeyFromEnv("SOFTEFA_KEY")
		if err != nil {
			return nil, err
		}
		cfg.Key = k
	}
	addr := os.Getenv("SOFTEFA_ADDR")
	if addr == "" && os.Getenv("SOFTEFA_SYSFS_ROOT") != "" {
		// A device of this process alone: any free port on SOFTEFA_IP (default 127.0.0.1).
		addr = net.JoinHostPort(cmp.Or(os.Getenv("SOFTEFA_IP"), "127.0.0.1"), "0")
	}
	if addr != "" {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, fmt.Errorf("device address %q: %w", addr, err)
		}
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
	dir, err := cabi.WriteProcessSysfs(os.Getenv("SOFTEFA_SYSFS_ROOT"), cfg.Name, d.Engine().GID(),
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
	state.Unlock()
	if err != nil {
		return fail(err)
	}
	for _, msg := range d.Netlink(req, uint32(port), chardev()) {
		if _, err := unix.Write(int(peer), msg); err != nil {
			return -C.int(uverbs.Errno(err))
		}
	}
	return 0
}

// chardev describes the device node as the launcher named it (SOFTEFA_DEV_PATH,
// SOFTEFA_DEV_RDEV): what RDMA netlink's GET_CHARDEV reports.
func chardev() uverbs.Chardev {
	c := uverbs.Chardev{Name: filepath.Base(os.Getenv("SOFTEFA_DEV_PATH"))}
	if maj, min, ok := strings.Cut(os.Getenv("SOFTEFA_DEV_RDEV"), ":"); ok {
		a, _ := strconv.ParseUint(maj, 10, 32)
		b, _ := strconv.ParseUint(min, 10, 32)
		c.Major, c.Minor = uint32(a), uint32(b)
	}
	return c
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
// (engine.Device.FlushAcks). With SOFTEFA_DEBUG=1 it reports how many posts lingered.
//
//export softefa_exit
func softefa_exit() {
	if e := polled.Load(); e != nil {
		e.FlushAcks()
	}
	if debug, _ := cabi.EnvBool("SOFTEFA_DEBUG"); debug {
		state.Lock()
		d := state.dev
		state.Unlock()
		if d != nil {
			fmt.Fprintf(os.Stderr, "softefa: debug: posts lingered: %d\n", d.Lingered())
		}
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
