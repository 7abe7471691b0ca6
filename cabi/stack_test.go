//go:build linux

package cabi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Today's stack: rdma-core 64 and libfabric 2.6 with fabtests, built by cabi/thirdparty/build.sh
// into a private prefix (docs/cabi.md, "Today's stack"). These tests run them through softefa
// run. Without the built stack they skip, unless SOFTEFA_REQUIRE_STACK=1 (CI sets it), when
// they fail: a suite that skips is not passing.

// stackPrefix returns the built stack's prefix: $SOFTEFA_STACK, or the one build.sh --prefix
// names for the archives this tree pins.
func stackPrefix(t *testing.T) string {
	t.Helper()
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("SOFTEFA_REQUIRE_STACK") == "1" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	p := os.Getenv("SOFTEFA_STACK")
	if p == "" {
		out, err := exec.Command("bash", filepath.Join("thirdparty", "build.sh"), "--prefix").Output()
		p = strings.TrimSpace(string(out))
		if err != nil {
			missing("today's stack is not built (%s): run cabi/thirdparty/build.sh", p)
		}
	}
	if _, err := os.Stat(filepath.Join(p, ".complete")); err != nil {
		missing("SOFTEFA_STACK=%s is not a complete build of cabi/thirdparty/build.sh: %v", p, err)
	}
	return p
}

// TestStackIoctlOnly calls, with rdma-core 64's libibverbs, the verbs that exist only as ioctl
// methods (testdata/ioctlprobe.py), which EFA's driver answers and softefa answered
// EPROTONOSUPPORT: ibv_query_port_speed gives 1000 (units of 100 Mb/s: the default 100 Gb/s link)
// on port 1 and EINVAL on port 2; ibv_reg_dmabuf_mr fails with EBADF for descriptor -1 (UCX's
// probe for dma-buf support), EOPNOTSUPP when REMOTE_ATOMIC is asked for (EFA refuses it before
// it looks at the descriptor), EINVAL for a descriptor that is not a dma-buf.
func TestStackIoctlOnly(t *testing.T) {
	p := stackPrefix(t)
	s := setupOrSkip(t, "python3")
	out := run(t, s, "", time.Minute, "/usr/bin/python3", filepath.Join("testdata", "ioctlprobe.py"), filepath.Join(p, "lib"))
	want := "port_speed port 1: 1000\nport_speed port 2: EINVAL\n" +
		"reg_dmabuf_mr fd -1: EBADF\nreg_dmabuf_mr fd -1 atomic: EOPNOTSUPP\nreg_dmabuf_mr stdin: EINVAL\n"
	if out != want {
		t.Fatalf("got:\n%s\nwant:\n%s", out, want)
	}
}

// skipsOnEFA names the rdma-core 64 EFA tests that skip on real EFA hardware of the generation
// softefa advertises (vendor part 0xefa1, the caps of docs/cabi.md), with the reason pyverbs
// gives; any other skip fails TestStackPyverbsEFA.
var skipsOnEFA = map[string]string{}

// TestStackPyverbsEFA runs rdma-core 64's EFA tests (run_tests.py -k test_efa) with its own
// libibverbs, libefa and pyverbs through softefa run. Every test must pass, or skip only as
// named in skipsOnEFA.
func TestStackPyverbsEFA(t *testing.T) {
	p := stackPrefix(t)
	stackPyverbsEFA(t, p, setupOrSkip(t, "rdma"))
}

// TestStackPyverbsEFAHostDevice is TestStackPyverbsEFA with the tests on one host device
// (softefa run --device).
func TestStackPyverbsEFAHostDevice(t *testing.T) {
	p := stackPrefix(t)
	s, _ := hostDevice(t, "rdma")
	stackPyverbsEFA(t, p, s)
}

// stackPyverbsEFA runs rdma-core 64's EFA tests, from the stack at p, in setup s.
func stackPyverbsEFA(t *testing.T, p string, s *Setup) {
	t.Helper()
	tests := filepath.Join(p, "share", "doc", "rdma-core", "tests")
	env := append(s.Environ(), "PYTHONPATH="+filepath.Join(p, "lib", "python3", "dist-packages"))
	c := exec.Command("/usr/bin/python3", filepath.Join(tests, "run_tests.py"), "--dev", s.Sysfs.IBDev, "-v", "-k", "test_efa")
	c.Env = env
	b, err := combinedOutputWithin(c, 5*time.Minute)
	out := string(b)
	if err != nil {
		t.Fatalf("run_tests.py -k test_efa: %v\n%s", err, out)
	}
	// unittest -v prints "name (class) ... verdict", the docstring's first line between them
	// for tests that have one (on a line of its own), and its verbose prints before the verdict.
	name := regexp.MustCompile(`^(test_\w+) \([\w.]+\)`)
	verdict := regexp.MustCompile(`\.\.\. (ok|skipped '(.*)'|ERROR|FAIL)$|^(ok|ERROR|FAIL)$`)
	var ok, skipped int
	seen := map[string]string{}
	current := ""
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if m := name.FindStringSubmatch(line); m != nil {
			current = m[1]
		}
		m := verdict.FindStringSubmatch(line)
		if m == nil || current == "" {
			continue
		}
		v := m[1] + m[3]
		seen[current] = v
		switch {
		case v == "ok":
			ok++
		case strings.HasPrefix(v, "skipped"):
			skipped++
			why, allowed := skipsOnEFA[current]
			if !allowed || !strings.Contains(m[2], why) {
				t.Errorf("%s skipped (%s): real EFA hardware would not skip it", current, m[2])
			}
		default:
			t.Errorf("%s: %s", current, v)
		}
		current = ""
	}
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	if len(names) != 21 || !strings.Contains(out, "Ran 21 tests") { // rdma-core 64 has 21 EFA tests
		t.Fatalf("ran %d EFA tests, want 21: %v\n%s", len(names), names, out)
	}
	if !strings.Contains(out, "\nOK") {
		t.Fatalf("run_tests.py did not pass:\n%s", out)
	}
	t.Logf("rdma-core 64 -k test_efa: %d tests, %d ok, %d skipped: %s", len(names), ok, skipped, lastLines(out, 2))
}

// TestStackPyverbsAll runs rdma-core 64's whole test suite on the device: it must pass (its
// tests for other devices and for features EFA lacks skip themselves).
func TestStackPyverbsAll(t *testing.T) {
	p := stackPrefix(t)
	stackPyverbsAll(t, p, setupOrSkip(t, "rdma"))
}

// TestStackPyverbsAllHostDevice is TestStackPyverbsAll with the suite on one host device
// (softefa run --device).
func TestStackPyverbsAllHostDevice(t *testing.T) {
	p := stackPrefix(t)
	s, _ := hostDevice(t, "rdma")
	stackPyverbsAll(t, p, s)
}

// stackPyverbsAll runs rdma-core 64's whole suite, from the stack at p, in setup s.
func stackPyverbsAll(t *testing.T, p string, s *Setup) {
	t.Helper()
	c := exec.Command("/usr/bin/python3", filepath.Join(p, "share", "doc", "rdma-core", "tests", "run_tests.py"), "--dev", s.Sysfs.IBDev)
	c.Env = append(s.Environ(), "PYTHONPATH="+filepath.Join(p, "lib", "python3", "dist-packages"))
	b, err := combinedOutputWithin(c, 10*time.Minute)
	out := string(b)
	if err != nil {
		t.Fatalf("rdma-core 64's suite did not pass: %v\n%s", err, out)
	}
	checkSuite(t, "rdma-core 64's suite", out, 384, 310)
}

// TestStackTwoProcesses runs perftest (Debian's binaries, with rdma-core 64's libibverbs and
// libefa) and libfabric 2.6's ping-pongs on both of its fabrics, checking data, between two
// processes. fi_pingpong runs on efa-direct only: it always asks for FI_MSG_PREFIX, which
// libfabric 2.6's efa fabric gets wrong whatever the device (docs/cabi.md, "What does not work
// yet"); fabtests' fi_rdm_pingpong (-v: data checked; no prefix) covers that fabric. perftest
// 4.5 refuses ib_write_* with -c SRD itself. Each pair runs twice: a device for each process, and
// both processes on one host device (softefa run --device).
func TestStackTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs perftest and fi_pingpong between two processes")
	}
	p := stackPrefix(t)
	host, _ := hostDevice(t)
	lib := "LD_LIBRARY_PATH=" + filepath.Join(p, "lib")
	bin := func(name string) string { return filepath.Join(p, "bin", name) }
	rdmPing := func(fabric string) []string {
		return []string{"-p", "efa", "-f", fabric, "-v", "-S", "64", "-I", "1000"}
	}
	for _, c := range []struct {
		name string
		pair
	}{
		{"ib_send_bw", pair{tool: "ib_send_bw", env: []string{lib}, want: "BW average", timeout: time.Minute}},
		{"ib_send_lat", pair{tool: "ib_send_lat", env: []string{lib}, want: "t_typical", timeout: time.Minute}},
		{"ib_read_bw", pair{tool: "ib_read_bw", env: []string{lib}, want: "BW average", timeout: time.Minute}},
		{"ib_read_lat", pair{tool: "ib_read_lat", env: []string{lib}, want: "t_typical", timeout: time.Minute}},
		{"fi_pingpong_efa_direct", pair{tool: bin("fi_pingpong"), want: "usec/xfer", timeout: time.Minute,
			args: []string{"-p", "efa", "-e", "rdm", "-f", "efa-direct", "-c", "-S", "64", "-I", "1000"}}},
		{"fi_rdm_pingpong_efa", pair{tool: bin("fi_rdm_pingpong"), args: rdmPing("efa"), want: "usec/xfer", timeout: time.Minute}},
		{"fi_rdm_pingpong_efa_direct", pair{tool: bin("fi_rdm_pingpong"), args: rdmPing("efa-direct"), want: "usec/xfer", timeout: time.Minute}},
	} {
		t.Run(c.name, func(t *testing.T) { runPair(t, c.pair) })
		h := c.pair
		h.setup = host
		t.Run(c.name+"_host_device", func(t *testing.T) { runPair(t, h) })
	}
}

// TestStackRawRing runs testdata/rawring.c, built against rdma-core 64: a UD ping-pong that posts
// through the rings efadv_query_qp_wqs hands out and reads the CQ buffer efadv_query_cq hands out,
// never calling libibverbs or libefa on its data path, as libfabric 2.x's efa provider does; every
// payload is checked. Between two processes and between two QPs of one process (same-device
// delivery: nothing but the doorbell's trap moves the engine). Every SQ doorbell store must have
// trapped and been emulated, and no RQ doorbell store (softefa run --debug makes each process
// report its count at exit: a SEND per round, per QP; docs/cabi.md, "Doorbells"), and between
// two processes most posts linger for their answer ("Lingering after a post").

func TestStackRawRing(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 20,000 round trips")
	}
	p := stackPrefix(t)
	exe := buildStackC(t, p, "rawring")
	const rounds = 5000
	for _, c := range []struct {
		name    string
		args    []string
		debug   bool
		reports int // processes reporting their traps
		stores  int // the doorbell stores each process reports
	}{
		{"two processes", nil, true, 2, rounds},
		{"one process", []string{"-l"}, true, 1, 2 * rounds},
		// A store to the read-only CQ buffer after a SEND: the program's own SIGSEGV handler
		// gets it (the shim's, in front of it for the doorbell traps, hands it on).
		{"two processes, CQ store", []string{"-w"}, false, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := runRawRing(t, exe, setupWith(t, Options{Settings: Conf{Debug: c.debug}}), c.args, rounds, c.reports, c.stores)
			if slices.Contains(c.args, "-w") && !strings.Contains(out, "ok CQ store faulted") {
				t.Fatalf("rawring -w: the program's SIGSEGV handler did not get the store:\n%s", out)
			}
			// The linger: a QP that talks to another process and ping-pongs has its trapped
			// posts wait for the answer; one that talks only to its own device never.
			lingered := regexp.MustCompile(`softefa: debug: posts lingered: (\d+)`).FindAllStringSubmatch(out, -1)
			if len(lingered) != c.reports {
				t.Fatalf("want %d processes to report their lingered posts:\n%s", c.reports, out)
			}
			for _, l := range lingered {
				if n, _ := strconv.Atoi(l[1]); (n >= rounds/2) != (c.reports == 2) || c.reports == 1 && n != 0 {
					t.Errorf("%s; want at least %d between two processes, none in one", l[0], rounds/2)
				}
			}
			t.Log(lastLines(out, 1))
		})
	}
}

// TestStackRawRingHostDevice is TestStackRawRing on one host device: libfabric 2.x's way of
// posting (the rings written directly, doorbells stored plainly) reaches the device through the
// shim's doorbell traps and kicks, in two processes and in one. Every SQ doorbell store traps and
// is emulated; between two processes most posts linger in the device for their answer, and in one
// process, whose thread drives both QPs, none does: each would wait for the receive the thread's
// own next post makes (uverbs.File.KickLinger).
func TestStackRawRingHostDevice(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 10,000 round trips")
	}
	p := stackPrefix(t)
	exe := buildStackC(t, p, "rawring")
	const rounds = 5000
	for _, c := range []struct {
		name    string
		args    []string
		reports int // processes reporting their traps
		stores  int // the doorbell stores each process reports
	}{
		{"two processes", nil, 2, rounds},
		{"one process", []string{"-l"}, 1, 2 * rounds},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, srv, d := hostDeviceWith(t, Options{Settings: Conf{Debug: true}})
			out := runRawRing(t, exe, s, c.args, rounds, c.reports, c.stores)
			if !srv.AwaitPrograms(0) {
				t.Fatal("a program is still connected")
			}
			lingered := d.Lingered()
			if c.reports == 2 && lingered < rounds || c.reports == 1 && lingered != 0 {
				t.Errorf("%d posts lingered on the device; want at least %d between two processes, none in one", lingered, rounds)
			}
			t.Logf("%s; %d posts lingered on the device", lastLines(out, 1), lingered)
		})
	}
}

// runRawRing runs rawring with args for rounds in setup s (its file with debug on, when reports
// is not 0), and returns its output once it has succeeded and reports processes have each
// reported stores doorbell stores trapped and emulated, none stepped, the traps never off.
func runRawRing(t *testing.T, exe string, s *Setup, args []string, rounds, reports, stores int) string {
	t.Helper()
	cmd := exec.Command(exe, append(args, "-n", fmt.Sprint(rounds))...)
	cmd.Env = s.Environ()
	b, err := combinedOutputWithin(cmd, 3*time.Minute)
	out := string(b)
	if err != nil || !strings.Contains(out, fmt.Sprintf("ok rounds=%d ", rounds)) {
		t.Fatalf("rawring %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	want := fmt.Sprintf("softefa: debug: doorbell stores trapped: %d emulated, 0 stepped", stores)
	if n := strings.Count(out, want); n != reports || strings.Contains(out, "traps off") {
		t.Fatalf("want %d processes to report %q:\n%s", reports, want, out)
	}
	return out
}

// buildStackC compiles testdata/name.c against the stack's rdma-core (prefix p), with an rpath to
// its libraries.
func buildStackC(t *testing.T, p, name string) string {
	t.Helper()
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skipf("cc not found: %v", err)
	}
	exe := filepath.Join(t.TempDir(), name)
	src, err := filepath.Abs(filepath.Join("testdata", name+".c"))
	if err != nil {
		t.Fatal(err)
	}
	lib := filepath.Join(p, "lib")
	out, err := exec.Command("cc", "-O2", "-Wall", "-Wextra", "-Werror", "-I", filepath.Join(p, "include"),
		"-L", lib, "-Wl,-rpath,"+lib, "-o", exe, src, "-libverbs", "-lefa").CombinedOutput()
	if err != nil {
		t.Fatalf("cc %s: %v\n%s", src, err, out)
	}
	return exe
}
