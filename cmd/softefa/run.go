//go:build linux

package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/softefa/softefa"
	"github.com/softefa/softefa/cabi"
	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/hostdev"
)

// runRun is softefa run: it starts COMMAND with a softefa device under the real libibverbs and
// libefa (docs/cabi.md), and exits with COMMAND's status.
func runRun(args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: softefa run [flags] -- COMMAND [ARGS...]")
		fmt.Fprintln(os.Stderr, "runs an unmodified rdma-core program (ibv_devinfo, perftest, pyverbs, libfabric) on a softefa device")
		fs.PrintDefaults()
	}
	name := fs.String("name", "efa_0", "the device name")
	addr := fs.String("addr", "", "one device at this UDP endpoint IP:PORT for the program (default: a device per process, on a free port)")
	ip := fs.String("ip", "", "the IP address of per-process devices (default 127.0.0.1)")
	paths := fs.Int("paths", 0, "UDP paths (default 4)")
	device := fs.String("device", "", "the socket of the host's device (softefa device) that the program's processes share\n"+
		"(default: each process has a device of its own; with --host, the host device's default socket)")
	host := fs.Bool("host", false, "the program's processes share the host's device (softefa device), which is started, with\n"+
		"--name, --addr and --paths, when none answers at its socket; it keeps running after the program (softefa device stop)")
	printEnv := fs.Bool("print-env", false, "print the environment instead of running a command (for shells)")
	var where cabi.Where
	fs.StringVar(&where.Src, "src", "", "softefa's source tree to build the shim and engine from (default: the one above the\n"+
		"working directory or this executable, else the sources embedded in it)")
	fs.StringVar(&where.LibDir, "libdir", "", "a directory of prebuilt "+cabi.ShimLib+" and "+cabi.EngineLib+" (nothing is built)")
	fs.StringVar(&where.Cache, "cache", "", "where built libraries are cached (default: the user cache dir, softefa/cabi)")
	var settings cabi.Conf
	for _, st := range cabi.Settings {
		fs.Var(&settingFlag{st, &settings}, st.Flag, st.Usage)
	}
	fs.Parse(args)
	cmd := fs.Args()
	if len(cmd) == 0 && !*printEnv {
		fs.Usage()
		os.Exit(2)
	}
	if *host {
		if *ip != "" {
			return errors.New("--ip has no effect with --host: the device's address is --addr")
		}
		if *device == "" {
			*device = hostdev.DefaultSocket(*name)
		}
		started, err := startDevice(*device, *name, *addr, *paths)
		if err != nil {
			return fmt.Errorf("--host: %w", err)
		}
		if started {
			fmt.Fprintf(os.Stderr, "softefa run: started the host's device at %s (log %s.log; softefa device stop --socket %[1]s ends it)\n", *device, *device)
		} else if *addr != "" {
			warnOtherAddr(*device, *addr)
		}
		*addr = "" // the device's
	}
	// The program's engines read the key (the program inherits it): a bad one fails here, once.
	if _, err := config.KeyFromEnvIfSet(); err != nil {
		return err
	}
	o := cabi.Options{Name: *name, Paths: *paths, Settings: settings, Device: *device}
	if *ip != "" {
		a, err := netip.ParseAddr(*ip)
		if err != nil {
			return fmt.Errorf("--ip: %w", err)
		}
		o.IP = a
	}
	if *addr != "" {
		ap, err := netip.ParseAddrPort(*addr)
		if err != nil {
			return fmt.Errorf("--addr: %w", err)
		}
		o.Addr = ap
	}
	libs, err := cabi.LocateFrom(os.Stderr, softefa.Source, where)
	if err != nil {
		return err
	}
	s, err := cabi.Prepare(libs, o)
	if err != nil {
		return err
	}
	if *printEnv {
		for _, kv := range s.Env {
			fmt.Printf("export %q\n", kv)
		}
		return nil // the sysfs tree stays: the shell's programs use it
	}
	defer os.RemoveAll(s.Dir)
	c := exec.Command(cmd[0], cmd[1:]...)
	c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
	c.Env = s.Environ()
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if err := c.Start(); err != nil {
		return err
	}
	go func() {
		for v := range sig {
			c.Process.Signal(v)
		}
	}()
	err = c.Wait()
	signal.Stop(sig)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		os.RemoveAll(s.Dir)
		if st, ok := ee.Sys().(syscall.WaitStatus); ok && st.Signaled() {
			os.Exit(128 + int(st.Signal()))
		}
		os.Exit(ee.ExitCode())
	}
	return err
}

// settingFlag is a flag of softefa run for one of cabi.Settings: its value goes into the program's
// file under the flag's name.
type settingFlag struct {
	s    cabi.Setting
	conf *cabi.Conf
}

func (f *settingFlag) String() string { return "" }

func (f *settingFlag) Set(v string) error {
	err := f.conf.Set(f.s.Flag, v)
	if why := errors.Unwrap(err); why != nil {
		return why // the flag package names the flag and the value
	}
	return err
}

func (f *settingFlag) IsBoolFlag() bool { return f.s.Bool }
