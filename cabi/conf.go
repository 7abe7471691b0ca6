//go:build linux

package cabi

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/softefa/softefa/config"
)

// ConfEnv is the one variable softefa run gives the program it starts for softefa's own use: the
// path of the program's file (Conf), which its shim and engine read. The program takes no flags
// of ours, and its environment is the one thing that reaches them.
const ConfEnv = "SOFTEFA_CONF"

// ConfFile is the name of the program's file in Setup.Dir.
const ConfFile = "program.conf"

// Conf is what softefa run tells the program's shim and engine: where things are, which device
// this is, and softefa run's device settings. Its file is text, one "key=value" line a field
// (docs/settings.md, "The program's file"); fields left zero are not written, but dev-rdev goes
// with dev-path. The encryption key is not in it: the engine reads SOFTEFA_KEY, as the other
// tools do, and a key is never written to disk.
type Conf struct {
	Engine    string // engine: the engine library the shim loads
	DevPath   string // dev-path: the device node's path; unset, the shim does nothing
	DevMajor  uint32 // dev-rdev: the node's numbers, MAJOR:MINOR
	DevMinor  uint32
	Name      string // name: the ibdev name
	PartID    uint32 // part-id: the PCI device id
	Device    string // device: the host device's socket; then the program has no device of its own
	Addr      netip.AddrPort
	SysfsRoot string     // sysfs-root: per-process devices write their trees under it
	IP        netip.Addr // ip: where per-process devices bind
	Paths     int        // paths: UDP paths
	// The settings of softefa run's flags (Settings), under their flags' names.
	RxSpin         time.Duration // rx-spin
	NoSparseCopies bool          // no-sparse-copies
	NoOffload      bool          // no-offload
	Debug          bool          // debug
}

// confLines and confBytes bound a program's file: the shim keeps no more (cabi/shim/conf.c).
const (
	confLines = 64
	confBytes = 16383
)

// Set sets the field key names from its text, as the file or a softefa run flag gives it.
func (c *Conf) Set(key, value string) error {
	var err error
	switch key {
	case "engine":
		c.Engine = value
	case "dev-path":
		c.DevPath = value
	case "dev-rdev":
		maj, min, ok := strings.Cut(value, ":")
		a, err1 := strconv.ParseUint(maj, 10, 32)
		b, err2 := strconv.ParseUint(min, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("%s=%q: want MAJOR:MINOR", key, value)
		}
		c.DevMajor, c.DevMinor = uint32(a), uint32(b)
	case "name":
		c.Name = value
	case "part-id":
		var n uint64
		n, err = strconv.ParseUint(value, 0, 32)
		c.PartID = uint32(n)
	case "device":
		c.Device = value
	case "addr":
		c.Addr, err = netip.ParseAddrPort(value)
	case "sysfs-root":
		c.SysfsRoot = value
	case "ip":
		c.IP, err = netip.ParseAddr(value)
	case "paths":
		c.Paths, err = strconv.Atoi(value)
		if err == nil && (c.Paths < 1 || c.Paths > 255) {
			err = errors.New("want 1 to 255")
		}
	case "rx-spin":
		c.RxSpin, err = time.ParseDuration(value)
		if err != nil || c.RxSpin < 0 {
			err = errors.New("want a duration of 0 or more (200us, 1ms)")
		}
	case "no-sparse-copies":
		c.NoSparseCopies, err = parseBit(value)
	case "no-offload":
		c.NoOffload, err = parseBit(value)
	case "debug":
		c.Debug, err = parseBit(value)
	default:
		return fmt.Errorf("%q: no such key", key)
	}
	if err != nil {
		return fmt.Errorf("%s=%q: %w", key, value, err)
	}
	return nil
}

// parseBit reads a boolean: 1 or 0 in the file, true or false on the command line.
func parseBit(v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errors.New("want true or false (1 or 0)")
	}
	return b, nil
}

// MarshalText writes c as its file has it.
func (c Conf) MarshalText() ([]byte, error) {
	var b bytes.Buffer
	put := func(key, value string) {
		if value != "" {
			fmt.Fprintf(&b, "%s=%s\n", key, value)
		}
	}
	for _, s := range []string{c.Engine, c.DevPath, c.Name, c.Device, c.SysfsRoot} {
		if strings.ContainsAny(s, "\n\x00") {
			return nil, fmt.Errorf("cabi: %q: a line break or NUL in the program's file", s)
		}
	}
	bit := func(v bool) string {
		if v {
			return "1"
		}
		return ""
	}
	put("engine", c.Engine)
	put("dev-path", c.DevPath)
	if c.DevPath != "" || c.DevMajor != 0 || c.DevMinor != 0 {
		put("dev-rdev", fmt.Sprintf("%d:%d", c.DevMajor, c.DevMinor))
	}
	put("name", c.Name)
	if c.PartID != 0 {
		put("part-id", fmt.Sprintf("%#x", c.PartID))
	}
	put("device", c.Device)
	if c.Addr.IsValid() {
		put("addr", c.Addr.String())
	}
	put("sysfs-root", c.SysfsRoot)
	if c.IP.IsValid() {
		put("ip", c.IP.String())
	}
	if c.Paths != 0 {
		put("paths", strconv.Itoa(c.Paths))
	}
	if c.RxSpin != 0 {
		put("rx-spin", c.RxSpin.String())
	}
	put("no-sparse-copies", bit(c.NoSparseCopies))
	put("no-offload", bit(c.NoOffload))
	put("debug", bit(c.Debug))
	return b.Bytes(), nil
}

// UnmarshalText reads c from its file's text: every line "key=value" with a key Set knows and a
// value it takes, or empty; no NUL, at most 64 lines that are not empty, and at most 16,383
// bytes. The shim's reader (cabi/shim/conf.c) takes the same lines, and checks only the values
// it uses. An empty value is no value: the field stays zero (or the value is refused).
func (c *Conf) UnmarshalText(b []byte) error {
	*c = Conf{}
	if len(b) > confBytes {
		return fmt.Errorf("more than %d bytes", confBytes)
	}
	if bytes.IndexByte(b, 0) >= 0 {
		return errors.New("a NUL in the program's file")
	}
	n := 0
	for i, line := range strings.Split(string(b), "\n") {
		if line == "" {
			continue
		}
		if n++; n > confLines {
			return fmt.Errorf("line %d: more than %d lines", i+1, confLines)
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			return fmt.Errorf("line %d: want key=value", i+1)
		}
		if err := c.Set(key, value); err != nil {
			return fmt.Errorf("line %d: %w", i+1, err)
		}
	}
	return nil
}

// ReadConf reads the program's file that SOFTEFA_CONF names, with its key (config.KeyFromEnv of
// SOFTEFA_KEY, when set).
func ReadConf() (Conf, []byte, error) {
	path := os.Getenv(ConfEnv)
	if path == "" {
		return Conf{}, nil, fmt.Errorf("%s is not set: start the program with softefa run", ConfEnv)
	}
	var c Conf
	b, err := os.ReadFile(path)
	if err == nil {
		err = c.UnmarshalText(b)
	}
	if err != nil {
		return Conf{}, nil, fmt.Errorf("%s=%s: %w", ConfEnv, path, err)
	}
	key, err := config.KeyFromEnvIfSet()
	if err != nil {
		return Conf{}, nil, err
	}
	return c, key, nil
}

// DeviceConfig is the engine's config.Device for a device of c's: its name, part id, paths and
// settings (the address and link are the caller's to make, on ListenAddr).
func (c Conf) DeviceConfig() config.Device {
	cfg := config.Device{Name: c.Name, VendorPartID: c.PartID, Paths: c.Paths,
		NoSparseCopies: c.NoSparseCopies, NoOffload: c.NoOffload}
	// The receive loop does not spin unless told to: programs on this ABI busy-poll their CQs
	// themselves, and a spinning engine thread takes the CPU they need (ib_send_lat -s 64 on 2
	// vCPUs: 70 µs typical without, 0.7 ms with the default 200 µs).
	cfg.RxSpin = -1
	if c.RxSpin > 0 {
		cfg.RxSpin = c.RxSpin
	}
	return cfg
}

// ListenAddr is the UDP endpoint the program's device binds: Addr (--addr), or, for a device of
// this process alone (SysfsRoot set), any free port on IP (default 127.0.0.1). Not valid: the
// device has no link.
func (c Conf) ListenAddr() netip.AddrPort {
	switch {
	case c.Addr.IsValid():
		return c.Addr
	case c.SysfsRoot == "":
		return netip.AddrPort{}
	case c.IP.IsValid():
		return netip.AddrPortFrom(c.IP, 0)
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), 0)
}
