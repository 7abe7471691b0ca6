//go:build linux

package cabi

import (
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
// setup that runs programs on it (softefa run --device) and the server.
func hostDevice(t *testing.T) (*Setup, *hostdev.Server) {
	t.Helper()
	setupOrSkip(t) // (skips without the tools, builds the libraries)
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
	s, err := Prepare(libs, Options{Device: srv.Path()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(s.Dir) })
	return s, srv
}

// Programs run with softefa run --device share the host's device: one GID and node GUID for all,
// no Go runtime in any of them, rdma-core's EFA tests pass on it, two processes exchange through
// it, eight MPI ranks run on it, the counters any process reads add up what all did, and no
// program is left connected when all have exited.
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
	if !srv.AwaitPrograms(0) {
		t.Fatalf("%d programs connected after every one exited", srv.Programs())
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
