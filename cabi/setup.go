//go:build linux

package cabi

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/hostdev"
	"golang.org/x/sys/unix"
)

// Options describe the device a program gets.
type Options struct {
	Name string // the ibdev name; default efa_0
	// Addr, when set, is the UDP endpoint of the one device the program's processes share: only
	// one of them can open it. Unset, every process that looks for devices gets its own, on a
	// free port of IP.
	Addr  netip.AddrPort
	IP    netip.Addr // default 127.0.0.1
	Paths int        // UDP paths; 0: the default
	// PartID is the PCI device id (vendor_part_id); default 0xefa1, which libefa 44, perftest
	// 4.5 and libfabric 1.17 all take for EFA (perftest knows only 0xefa0 and 0xefa1, and
	// 0xefa0 makes libfabric expect sub-CQs).
	PartID uint32
	// Settings are the settings of softefa run's flags (Settings; Conf.Set sets them): Prepare
	// fills in the rest of the program's file.
	Settings Conf
	// Device, when set, is the socket of the host's device (softefa device): every process of
	// the program uses that device, and none has one of its own. Addr, IP, Name, Paths and
	// PartID are then the device's.
	Device string
}

// Setup is a prepared environment: a sysfs tree and the program's file (Conf, in ConfFile) in
// Dir, and the variables to run a program with.
type Setup struct {
	Dir   string
	Sysfs Sysfs
	Addr  netip.AddrPort
	Env   []string // additions to the environment
}

// uverbs device numbers: major 231 is the kernel's uverbs major; the minor is outside the range
// real devices take (192 and up, for the first 32).
const (
	uverbsName  = "uverbs_softefa0"
	uverbsMajor = 231
	uverbsMinor = 250
)

// Prepare sets up a temporary directory and returns the environment that makes a program see a
// softefa device through libs: with o.Addr, one sysfs tree for that address (fixed mode); without,
// a root under which each process that looks up SYSFS_PATH gets a tree for a device of its own
// (the shim asks the engine for it). The directory holds the program's file (Conf), which only
// its user can read. The caller removes Dir when the program has finished.
func Prepare(libs Libs, o Options) (*Setup, error) {
	if o.Name == "" {
		o.Name = config.Default().Name
	}
	if o.PartID == 0 {
		o.PartID = 0xefa1
	}
	if o.Device != "" {
		c, err := hostdev.Dial(o.Device)
		if err != nil {
			return nil, err
		}
		info, err := c.Info()
		c.Close()
		if err != nil {
			return nil, err
		}
		o.Name, o.PartID, o.Addr = info.Name, info.PartID, config.AddrFromGID(info.GID, 0)
	}
	if o.Paths < 0 || o.Paths > 255 {
		return nil, fmt.Errorf("cabi: %d paths: want 1 to 255 (0: the default)", o.Paths)
	}
	if o.Addr.IsValid() && o.Addr.Port() == 0 {
		return nil, fmt.Errorf("cabi: %v: the device's address needs a port (it is part of the GID)", o.Addr)
	}
	// Every path the program is given is absolute: it may change its working directory before
	// its shim loads the engine or reaches the host device.
	for _, p := range []*string{&libs.Shim, &libs.Engine, &o.Device} {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return nil, err
		}
		*p = abs
	}
	tmp, err := os.MkdirTemp("", "softefa-sysfs-")
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(tmp)
	if err != nil {
		os.RemoveAll(tmp)
		return nil, err
	}
	s := &Setup{Dir: dir, Addr: o.Addr, Sysfs: Sysfs{
		IBDev: o.Name, Uverbs: uverbsName, Major: uverbsMajor, Minor: uverbsMinor,
		GID: config.GIDFromAddr(o.Addr), VendorPartID: o.PartID, PCIAddr: "0000:00:06.0",
	}}
	sysfs := filepath.Join(dir, "none") // what a reader that bypasses the shim sees: no device
	if o.Addr.IsValid() {
		sysfs = filepath.Join(dir, "sys")
		if err := s.Sysfs.Write(dir); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	c := o.Settings
	c.Engine, c.DevPath, c.DevMajor, c.DevMinor = libs.Engine, s.Sysfs.DevPath(), uverbsMajor, uverbsMinor
	c.Name, c.PartID, c.Paths = o.Name, o.PartID, o.Paths
	switch {
	case o.Device != "":
		c.Device = o.Device
	case o.Addr.IsValid():
		c.Addr = o.Addr
	default:
		c.SysfsRoot, c.IP = dir, o.IP
	}
	text, err := c.MarshalText()
	var back Conf
	if err == nil {
		err = back.UnmarshalText(text) // what the engine would refuse, refused now
	}
	if err == nil && !reflect.DeepEqual(back, c) {
		err = fmt.Errorf("%+v is read back as %+v", c, back)
	}
	if err == nil {
		// Read-only: no process of the program rewrites it by accident for those started later.
		err = os.WriteFile(filepath.Join(dir, ConfFile), text, 0o400)
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("cabi: the program's file: %w", err)
	}
	preload := libs.Shim
	if old := os.Getenv("LD_PRELOAD"); old != "" {
		preload += ":" + old
	}
	s.Env = []string{
		"LD_PRELOAD=" + preload,
		"SYSFS_PATH=" + sysfs,
		ConfEnv + "=" + filepath.Join(dir, ConfFile),
	}
	if _, ok := os.LookupEnv("FI_EFA_ENABLE_SHM_TRANSFER"); !ok {
		// Two processes on one host would otherwise talk over libfabric's shm provider.
		s.Env = append(s.Env, "FI_EFA_ENABLE_SHM_TRANSFER=0")
	}
	if _, ok := os.LookupEnv("FI_MR_CACHE_MONITOR"); !ok && userfaultfdWorks() {
		// libfabric's default monitor of its MR cache, memhooks, rewrites the first bytes of
		// libc's mmap, munmap and their kin while the program runs, and puts them back when the
		// domain closes; the engine's Go threads call mmap through libc (cgo) at any moment and
		// may run into a half-written function (docs/cabi.md, "libfabric's MR cache monitor").
		// userfaultfd watches the same unmappings without patching code.
		s.Env = append(s.Env, "FI_MR_CACHE_MONITOR=userfaultfd")
	}
	return s, nil
}

// userfaultfdWorks reports whether this process may make a userfaultfd as libfabric 1.x's monitor
// makes it (without UFFD_USER_MODE_ONLY, which 2.x adds), and whether the kernel has
// MADV_POPULATE_READ (5.14), with which the engine makes a registered region's pages present. A
// userfaultfd a program cannot make would fail its libfabric domain; without the advice, a
// thread that read a missing page of a registered region would sleep for ever in the monitor.
// Either way memhooks stays. The program inherits this process's user, capabilities and
// namespaces, so its answer is the program's, unless the program changes them.
func userfaultfdWorks() bool {
	fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if errno != 0 {
		return false
	}
	unix.Close(int(fd))
	b, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return false
	}
	defer unix.Munmap(b)
	return unix.Madvise(b, unix.MADV_POPULATE_READ) == nil
}

// WriteProcessSysfs writes the sysfs tree of one process's device (name, gid, PCI part id, link
// speed) into a new directory under root and returns the tree's sys directory, what SYSFS_PATH
// names; the engine library calls it when the shim asks.
func WriteProcessSysfs(root, name string, gid [16]byte, partID uint32, speedGbps int) (string, error) {
	dir, err := os.MkdirTemp(root, fmt.Sprintf("pid%d-", os.Getpid()))
	if err != nil {
		return "", err
	}
	s := Sysfs{IBDev: name, Uverbs: uverbsName, Major: uverbsMajor, Minor: uverbsMinor, GID: gid,
		VendorPartID: partID, PCIAddr: "0000:00:06.0", SpeedGbps: speedGbps}
	if err := s.Write(dir); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return filepath.Join(dir, "sys"), nil
}

// Environ returns the current environment with s's variables replacing any of the same name.
func (s *Setup) Environ() []string {
	set := make(map[string]bool)
	for _, kv := range s.Env {
		set[kv[:strings.IndexByte(kv, '=')]] = true
	}
	var out []string
	for _, kv := range os.Environ() {
		if i := strings.IndexByte(kv, '='); i < 0 || !set[kv[:i]] {
			out = append(out, kv)
		}
	}
	return append(out, s.Env...)
}
