//go:build linux

package cabi

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/hostdev"
	"github.com/softefa/softefa/internal/uverbs"
	"github.com/softefa/softefa/link"
)

// hostDevice starts a host device (what softefa device runs) on a free UDP port and returns the
// setup that runs programs on it (softefa run --device) and the server. It skips, as setupOrSkip,
// without the tools named.
func hostDevice(t *testing.T, tools ...string) (*Setup, *hostdev.Server) {
	t.Helper()
	s, srv, _ := hostDeviceWith(t, Options{}, tools...)
	return s, srv
}

// hostDeviceWith is hostDevice with the programs' options (Device is set to the host device's
// socket), returning the device's uverbs emulation as well.
func hostDeviceWith(t *testing.T, opts Options, tools ...string) (*Setup, *hostdev.Server, *uverbs.Device) {
	t.Helper()
	setupOrSkip(t, tools...) // (skips without the tools, builds the libraries)
	ap := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freeUDPPort(t))
	l, err := link.ListenUDP(ap, config.Default().Paths)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.NewDevice(config.Device{Name: "efa_0", Addr: ap, Link: l, VendorPartID: 0xefa1})
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	d := uverbs.NewDevice(e)
	srv, err := hostdev.Listen(d, filepath.Join(t.TempDir(), "efa_0.sock"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		d.Close()
		e.Close()
	})
	libs, err := Locate(testWriter{t}, Where{})
	if err != nil {
		t.Fatal(err)
	}
	opts.Device = srv.Path()
	s, err := Prepare(libs, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(s.Dir) })
	return s, srv, d
}

// Programs run with softefa run --device share the host's device: one GID and node GUID for all,
// no Go runtime in any of them, rdma-core's EFA tests and its whole pyverbs suite pass on it, two
// processes exchange through it, eight Open MPI ranks and four MPICH ranks run on it, the
// counters any process reads add up what all did, and no program is left connected when all have
// exited.
func TestHostDevice(t *testing.T) {
	s, srv := hostDevice(t)
	gid := regexp.MustCompile(`GID\[\s*0\]:\s*(\S+)|node_guid:\s*(\S+)`)
	var seen []string
	for range 2 {
		out := run(t, s, "", time.Minute, "ibv_devinfo", "-v")
		seen = append(seen, strings.Join(flatten(gid.FindAllStringSubmatch(out, -1)), " "))
	}
	if seen[0] == "" || seen[0] != seen[1] {
		t.Fatalf("two programs saw two devices: %q and %q", seen[0], seen[1])
	}
	// No Go runtime in a program on the host device: the shim itself is the device's client.
	maps := run(t, s, "", time.Minute, "/usr/bin/python3", "-c",
		"from pyverbs.device import Context; c = Context(name='efa_0'); print(open('/proc/self/maps').read())")
	if strings.Contains(maps, EngineLib) || !strings.Contains(maps, ShimLib) {
		t.Errorf("a program with the device open maps %s or lacks %s:\n%s", EngineLib, ShimLib, maps)
	}
	t.Run("pyverbs", func(t *testing.T) { checkEFATests(t, pyverbsOn(t, s, "-k", "test_efa")) })
	t.Run("pyverbs_all", func(t *testing.T) {
		// The whole suite, as TestPyverbsAll runs it with a device per process.
		checkSuite(t, "the pyverbs suite on the host device", pyverbsOn(t, s), 273, 220)
	})
	for _, c := range []pair{
		{tool: "ib_send_bw", want: "BW average", timeout: time.Minute},
		{tool: "ib_read_lat", want: "t_typical", timeout: time.Minute},
		{tool: "fi_pingpong", args: []string{"-p", "efa", "-e", "rdm", "-c", "-I", "2000", "-S", "4096"}, want: "usec/xfer", timeout: time.Minute},
	} {
		t.Run(c.tool, func(t *testing.T) {
			c.setup = s
			runPair(t, c)
		})
	}
	t.Run("mpi_8_ranks", func(t *testing.T) {
		// Eight processes on the one device: Open MPI's ping-pong over every size and an
		// allreduce over all ranks, checked byte by byte (testdata/mpipingpong.c).
		if _, err := exec.LookPath("mpicc"); err != nil {
			t.Skipf("mpicc not found: %v", err)
		}
		r := mpiRun{libfabric: "1.17", ranks: 8, iters: 200, minSize: 1, maxSize: 4 << 20}
		args := []string{"--allow-run-as-root", "--oversubscribe", "-np", "8", "--mca", "pml", "cm",
			"--mca", "mtl", "ofi", "--mca", "mtl_ofi_provider_include", "efa", "--mca", "mtl_base_verbose", "10"}
		out := run(t, s, "", 5*time.Minute, "mpirun", append(append(args, buildMPI(t, "mpicc")), r.args()...)...)
		if n := strings.Count(out, "mtl:ofi:provider: efa_0-rdm"); n != r.ranks {
			t.Fatalf("%d of %d ranks report efa_0-rdm:\n%s", n, r.ranks, lastLines(out, 40))
		}
		r.check(t, out)
	})
	t.Run("mpich_4_ranks", func(t *testing.T) {
		// MPICH over libfabric 2.6's efa provider (its own data path: rings written and
		// doorbells stored by libfabric), 4 ranks on the one device, as TestMPICH's sweep.
		m := mpichPrefix(t)
		r := sweep("2.6", 4)
		args := []string{"-launcher", "fork", "-n", fmt.Sprint(r.ranks), "-env", "FI_PROVIDER", "efa",
			"-env", "MPIR_CVAR_DEBUG_SUMMARY", "1", "-env", "LD_LIBRARY_PATH", filepath.Join(stackPrefix(t), "lib")}
		exe := buildMPI(t, filepath.Join(m, "bin", "mpicc"))
		out := run(t, s, "", 5*time.Minute, filepath.Join(m, "bin", "mpiexec"), append(append(args, exe), r.args()...)...)
		if !strings.Contains(out, "libfabric provider: efa - ") {
			t.Fatalf("MPICH's summary does not name the efa provider:\n%s", lastLines(out, 60))
		}
		r.check(t, out)
	})
	// The device's counters, read by a process that never opened the device (sysfs) and by
	// iproute2's rdma (netlink), are the sums of every program's traffic.
	cnt := strings.TrimSpace(run(t, s, "", time.Minute, "cat", "/sys/class/infiniband/efa_0/ports/1/hw_counters/send_wrs"))
	if cnt == "" || cnt == "0" {
		t.Fatalf("hw_counters/send_wrs %q after the programs sent", cnt)
	}
	if _, err := exec.LookPath("rdma"); err == nil {
		if out := run(t, s, "", time.Minute, "rdma", "statistic", "show"); !strings.Contains(out, " send_wrs "+cnt+" ") {
			t.Errorf("rdma statistic shows another send_wrs than sysfs's %s:\n%s", cnt, out)
		}
	}
	// Bounded: a program left running by a command that timed out would hold it for ever.
	gone := make(chan bool, 1)
	go func() { gone <- srv.AwaitPrograms(0) }()
	select {
	case ok := <-gone:
		if !ok {
			t.Fatalf("%d programs connected after every one exited", srv.Programs())
		}
	case <-time.After(time.Minute):
		t.Fatalf("%d programs still connected a minute after every one exited", srv.Programs())
	}
}

func flatten(m [][]string) []string {
	var out []string
	for _, g := range m {
		for _, s := range g[1:] {
			if s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// TestRunHostStartsDevice: softefa run --host starts the host's device when none answers at its
// socket, in the background, and leaves it running after the program; the next softefa run --host
// attaches to that same device (one node GUID) without starting another; three runs at once
// start one device between them and leave it none of their inherited descriptors; and a device
// that cannot start (its UDP port taken) fails the run with the reason from the device's log.
func TestRunHostStartsDevice(t *testing.T) {
	setupOrSkip(t, "ibv_devinfo")
	libs, err := Locate(testWriter{t}, Where{})
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(libs.Shim) != filepath.Dir(libs.Engine) {
		t.Fatalf("the shim and the engine are in two directories: %s, %s", libs.Shim, libs.Engine)
	}
	exe := filepath.Join(t.TempDir(), "softefa")
	build := exec.Command("go", "build", "-o", exe, "./cmd/softefa")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// newSocket is a socket path of a directory of its own; whatever device runs there when the
	// test ends is stopped.
	newSocket := func() string {
		sock := filepath.Join(t.TempDir(), "efa_0.sock")
		t.Cleanup(func() {
			if c, err := hostdev.Dial(sock); err == nil {
				c.Stop()
				c.Close()
			}
		})
		return sock
	}
	sock := newSocket()
	softefaRun := func(args ...string) (string, error) {
		c := exec.Command(exe, append([]string{"run", "--libdir", filepath.Dir(libs.Shim), "--host", "--device", sock}, args...)...)
		out, err := combinedOutputWithin(c, time.Minute)
		return string(out), err
	}
	guid := regexp.MustCompile(`node_guid:\s*(\S+)`)
	port := freeUDPPort(t)
	var guids []string
	for i, args := range [][]string{{"--addr", fmt.Sprintf("127.0.0.1:%d", port)}, nil} {
		out, err := softefaRun(append(args, "--", "ibv_devinfo", "-v")...)
		m := guid.FindStringSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("softefa run --host, run %d: %v\n%s", i+1, err, out)
		}
		if started := strings.Contains(out, "started the host's device"); started != (i == 0) {
			t.Fatalf("run %d: started a device: %v, want %v\n%s", i+1, started, i == 0, out)
		}
		guids = append(guids, m[1])
	}
	if guids[0] != guids[1] {
		t.Fatalf("two runs saw two devices: node GUIDs %s and %s", guids[0], guids[1])
	}
	c, err := hostdev.Dial(sock)
	if err != nil {
		t.Fatalf("the device is gone after its programs: %v", err)
	}
	info, err := c.Info()
	c.Stop()
	c.Close()
	if err != nil || config.AddrFromGID(info.GID, 0).Port() != port {
		t.Fatalf("the device's info %+v, %v: want its UDP port %d", info, err, port)
	}

	// Three runs at once with no device: one starts it, the others wait for it and share it.
	// Each run is given a pipe as an extra descriptor (inherited without close-on-exec, as a
	// script's 3>&1 or make's jobserver are): the device it starts must not keep it, or whoever
	// waits for the pipe's end waits as long as the device runs.
	sock = newSocket()
	port = freeUDPPort(t)
	type result struct {
		out string
		err error
	}
	results := make(chan result, 3)
	var ends []*os.File
	for range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		ends = append(ends, r)
		c := exec.Command(exe, "run", "--libdir", filepath.Dir(libs.Shim), "--host", "--device", sock,
			"--addr", fmt.Sprintf("127.0.0.1:%d", port), "--", "ibv_devinfo", "-v")
		c.ExtraFiles = []*os.File{w}
		go func() {
			out, err := combinedOutputWithin(c, time.Minute)
			w.Close()
			results <- result{string(out), err}
		}()
	}
	var started int
	guids = guids[:0]
	for range 3 {
		r := <-results
		m := guid.FindStringSubmatch(r.out)
		if r.err != nil || m == nil {
			t.Fatalf("one of three runs at once: %v\n%s", r.err, r.out)
		}
		guids = append(guids, m[1])
		if strings.Contains(r.out, "started the host's device") {
			started++
		}
	}
	if started != 1 || guids[0] != guids[1] || guids[1] != guids[2] {
		t.Fatalf("three runs at once started %d devices and saw node GUIDs %v: want one device", started, guids)
	}
	for _, r := range ends {
		r.SetReadDeadline(time.Now().Add(time.Minute))
		if _, err := io.ReadAll(r); err != nil {
			t.Fatalf("a pipe the runs inherited did not end when they did (the device holds it?): %v", err)
		}
		r.Close()
	}

	// A device that cannot bind its UDP port exits, and the run says why.
	taken, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	sock = newSocket()
	out, err := softefaRun("--addr", taken.LocalAddr().String(), "--", "ibv_devinfo")
	if err == nil || !strings.Contains(out, "the host's device exited") || !strings.Contains(out, "address already in use") {
		t.Fatalf("softefa run --host with the device's port taken: %v\n%s", err, out)
	}
}
