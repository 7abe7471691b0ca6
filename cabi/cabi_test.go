//go:build linux

package cabi

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// setupOrSkip builds the libraries (skipping without go or a C compiler) and prepares a device.
func setupOrSkip(t *testing.T, tools ...string) *Setup {
	t.Helper()
	return setupWith(t, Options{}, tools...)
}

// setupWith is setupOrSkip with o for Prepare.
func setupWith(t *testing.T, o Options, tools ...string) *Setup {
	t.Helper()
	for _, tool := range append([]string{"go", "cc"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found: install Go, gcc and Debian 12's ibverbs-utils, libfabric-bin, python3-pyverbs (%v)", tool, err)
		}
	}
	libs, err := Locate(testWriter{t}, Where{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Prepare(libs, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(s.Dir) })
	return s
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

func run(t *testing.T, s *Setup, dir string, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	c := exec.Command(name, args...)
	c.Dir = dir
	c.Env = s.Environ()
	out, err := combinedOutputWithin(c, timeout)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestIbvDevinfo(t *testing.T) {
	s := setupOrSkip(t, "ibv_devinfo")
	out := run(t, s, "", time.Minute, "ibv_devinfo", "-v")
	for _, want := range []string{"hca_id:\tefa_0", "vendor_id:\t\t\t0x1d0f", "PORT_ACTIVE", "max_msg_sz:\t\t0x2000",
		":ffff:7f00:0001"} { // a per-process device on 127.0.0.1
		if !strings.Contains(out, want) {
			t.Errorf("ibv_devinfo -v lacks %q:\n%s", want, out)
		}
	}
}

// TestFileReadPastTheWrappers: the shim reads the program's file through libc, not through its
// own wrappers, which look things up in the file: in a temporary directory under one named
// hw_counters (whose files the wrappers take for counter reads, and ask the file about), a
// program runs, rather than waiting on the file's first reading for ever.
func TestFileReadPastTheWrappers(t *testing.T) {
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "hw_counters"))
	if err := os.Mkdir(os.Getenv("TMPDIR"), 0o700); err != nil {
		t.Fatal(err)
	}
	s := setupOrSkip(t, "ibv_devinfo")
	if !strings.Contains(s.Dir, "/hw_counters/") {
		t.Fatalf("the program's directory %s is not under hw_counters", s.Dir)
	}
	if out := run(t, s, "", time.Minute, "ibv_devinfo"); !strings.Contains(out, "hca_id:\tefa_0") {
		t.Errorf("ibv_devinfo:\n%s", out)
	}
}

// TestFixedAddr gives the program one device at a chosen address: its GID shows it.
func TestFixedAddr(t *testing.T) {
	for _, tool := range []string{"go", "cc", "ibv_devinfo"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not found", tool)
		}
	}
	libs, err := Locate(testWriter{t}, Where{})
	if err != nil {
		t.Fatal(err)
	}
	port := freeUDPPort(t)
	s, err := Prepare(libs, Options{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port)})
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(s.Dir)
	out := run(t, s, "", time.Minute, "ibv_devinfo", "-v")
	if want := "GID[  0]:\t\t" + hexGroups(s.Sysfs.GID[:]); !strings.Contains(out, want) {
		t.Errorf("ibv_devinfo -v lacks %q:\n%s", want, out)
	}
}

// TestDevicePerProcess runs two RDMA programs from one shell under one setup: each gets a device
// of its own (a different GID), so they can talk.
func TestDevicePerProcess(t *testing.T) {
	s := setupOrSkip(t, "ibv_devinfo", "sh")
	out := run(t, s, "", time.Minute, "sh", "-c", "ibv_devinfo -v | grep GID; ibv_devinfo -v | grep GID")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || lines[0] == lines[1] {
		t.Fatalf("want two different GIDs:\n%s", out)
	}
}

func freeUDPPort(t *testing.T) uint16 {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

func TestFiInfo(t *testing.T) {
	s := setupOrSkip(t, "fi_info")
	out := run(t, s, "", time.Minute, "fi_info", "-p", "efa")
	for _, want := range []string{"domain: efa_0-rdm", "domain: efa_0-dgrm"} {
		if !strings.Contains(out, want) {
			t.Errorf("fi_info -p efa lacks %q:\n%s", want, out)
		}
	}
}

// TestPyverbsEFA runs rdma-core's own EFA tests (test_efadv, test_efa_srd: 16 in v44), shipped
// gzipped with Debian's python3-pyverbs, against the device. Every one must pass: a skip (pyverbs
// skips a test whose verb answers EOPNOTSUPP) fails the test.
func TestPyverbsEFA(t *testing.T) {
	checkEFATests(t, pyverbs(t, "-k", "test_efa"))
}

// checkEFATests fails the test unless out, run_tests.py's output, shows at least 16 tests, every
// one ok and none skipped.
func checkEFATests(t *testing.T, out string) {
	t.Helper()
	var ran int
	if i := strings.Index(out, "\nRan "); i >= 0 {
		fmt.Sscanf(out[i+1:], "Ran %d tests", &ran)
	}
	// A test's verdict ends its line: "… ... ok", or "ok" alone after lines it printed.
	ok := len(regexp.MustCompile(`(?m)(\.\.\. |^)ok$`).FindAllString(out, -1))
	// 16 in Debian 12's rdma-core 44; later releases have more.
	if ran < 16 || ok != ran || !strings.Contains(out, "\nOK\n") || strings.Contains(out, "skipped") ||
		strings.Contains(out, "FAIL:") || strings.Contains(out, "ERROR:") {
		t.Fatalf("want at least 16 tests, every one ok, none skipped; ran %d, %d ok:\n%s", ran, ok, out)
	}
	t.Logf("pyverbs -k test_efa: %d ok: %s", ok, lastLines(out, 3))
}

// TestPyverbsAll runs the whole pyverbs suite: the generic verbs tests (device, PD, MR, CQ,
// completion events, UD QPs) must pass or skip, as they do on EFA hardware.
func TestPyverbsAll(t *testing.T) {
	checkSuite(t, "the pyverbs suite", pyverbs(t), 273, 220)
}

// checkSuite checks the output of a whole unittest suite: it ran tests tests, all passed, and at
// most maxSkipped skipped (a few skips depend on the random QP caps a run draws; a device that
// answered EOPNOTSUPP where it did not before would make more tests skip, which OK alone hides).
func checkSuite(t *testing.T, what, out string, tests, maxSkipped int) {
	t.Helper()
	ran := regexp.MustCompile(`(?m)^Ran (\d+) tests? in`).FindStringSubmatch(out)
	ok := regexp.MustCompile(`(?m)^OK(?: \(skipped=(\d+)\))?$`).FindStringSubmatch(out)
	if ran == nil || ok == nil || strings.Contains(out, "FAIL:") || strings.Contains(out, "ERROR:") {
		t.Fatalf("%s did not pass:\n%s", what, out)
	}
	skipped, _ := strconv.Atoi(ok[1])
	if n, _ := strconv.Atoi(ran[1]); n != tests || skipped > maxSkipped {
		t.Fatalf("%s ran %d tests, %d skipped; want %d, at most %d skipped:\n%s", what, n, skipped, tests, maxSkipped, out)
	}
	t.Logf("%s: %d tests, %d skipped", what, tests, skipped)
}

// pyverbs runs rdma-core's run_tests.py with args on the device and returns its output.
func pyverbs(t *testing.T, args ...string) string {
	t.Helper()
	return pyverbsOn(t, nil, args...)
}

// pyverbsOn is pyverbs on the device s prepares (nil: a device per process).
func pyverbsOn(t *testing.T, s *Setup, args ...string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs rdma-core's pyverbs tests")
	}
	const python, shipped = "/usr/bin/python3", "/usr/share/doc/rdma-core/tests"
	if err := exec.Command(python, "-c", "import pyverbs.providers.efa.efadv").Run(); err != nil {
		t.Skipf("%s cannot import pyverbs (apt-get install python3-pyverbs): %v", python, err)
	}
	if _, err := os.Stat(filepath.Join(shipped, "run_tests.py")); err != nil {
		t.Skipf("rdma-core's tests are not installed: %v", err)
	}
	if s == nil {
		s = setupOrSkip(t)
	}
	work := t.TempDir()
	if err := unpackTests(shipped, filepath.Join(work, "tests")); err != nil {
		t.Fatal(err)
	}
	return run(t, s, work, 5*time.Minute, python, append([]string{"tests/run_tests.py", "--dev", s.Sysfs.IBDev, "-v"}, args...)...)
}

// unpackTests copies dir to dst, gunzipping *.gz files.
func unpackTests(dir, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return err
		}
		name := e.Name()
		if strings.HasSuffix(name, ".gz") {
			zr, err := gzip.NewReader(bytes.NewReader(b))
			if err != nil {
				return err
			}
			if b, err = io.ReadAll(zr); err != nil {
				return err
			}
			name = strings.TrimSuffix(name, ".gz")
		}
		if err := os.WriteFile(filepath.Join(dst, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

func TestSysfsTree(t *testing.T) {
	dir := t.TempDir()
	s := Sysfs{IBDev: "efa_0", Uverbs: "uverbs_x", Major: 231, Minor: 250, GID: [16]byte{15: 1}, VendorPartID: 0xefa2, PCIAddr: "0000:00:06.0"}
	if err := s.Write(dir); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(dir, "sys", p))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := read("class/infiniband_verbs/uverbs_x/dev"); got != "231:250" {
		t.Errorf("dev %q", got)
	}
	if got := read("class/infiniband/efa_0/device/modalias"); !strings.HasPrefix(got, "pci:v00001D0Fd0000EFA2sv") {
		t.Errorf("modalias %q", got)
	}
	if got := read("class/infiniband/efa_0/ports/1/gids/0"); got != "0000:0000:0000:0000:0000:0000:0000:0001" {
		t.Errorf("gid %q", got)
	}
	if got := read("class/infiniband/efa_0/node_type"); got != "7: unspecified" { // RDMA_NODE_UNSPECIFIED, as EFA's driver sets
		t.Errorf("node_type %q", got)
	}
	for link, base := range map[string]string{"class/infiniband/efa_0/device": "0000:00:06.0", "class/infiniband/efa_0/device/driver": "efa"} {
		p, err := filepath.EvalSymlinks(filepath.Join(dir, "sys", link))
		if err != nil || filepath.Base(p) != base {
			t.Errorf("%s resolves to %q (%v), want …/%s", link, p, err, base)
		}
	}
	// The links read as the kernel's do.
	for link, want := range map[string]string{
		"class/infiniband/efa_0":                 "../../devices/pci0000:00/0000:00:06.0/infiniband/efa_0",
		"class/infiniband_verbs/uverbs_x":        "../../devices/pci0000:00/0000:00:06.0/infiniband_verbs/uverbs_x",
		"dev/char/231:250":                       "../../devices/pci0000:00/0000:00:06.0/infiniband_verbs/uverbs_x",
		"class/infiniband/efa_0/device":          "../../../0000:00:06.0",
		"class/infiniband_verbs/uverbs_x/device": "../../../0000:00:06.0",
		"devices/pci0000:00/0000:00:06.0/driver": "../../../bus/pci/drivers/efa",
		"bus/pci/drivers/efa/0000:00:06.0":       "../../../../devices/pci0000:00/0000:00:06.0",
	} {
		if got, err := os.Readlink(filepath.Join(dir, "sys", link)); got != want {
			t.Errorf("%s -> %q (%v), want %q", link, got, err, want)
		}
	}
	for p, want := range map[string]string{
		"class/infiniband/efa_0/device/vendor":                "0x1d0f",
		"class/infiniband/efa_0/device/device":                "0xefa2",
		"class/infiniband/efa_0/ports/1/gid_attrs/types/0":    "IB/RoCE v1",
		"class/infiniband/efa_0/ports/1/rate":                 "100 Gb/sec (4X EDR)",
		"class/infiniband/efa_0/ports/1/hw_counters/tx_bytes": "0",
		"class/infiniband/efa_0/hw_counters/keep_alive_rcvd":  "0",
		"class/infiniband/efa_0/ports/1/hw_counters/lifespan": "10",
	} {
		if got := read(p); got != want {
			t.Errorf("%s: %q, want %q", p, got, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, s.DevPath())); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the node's stand-in %s: %v", s.DevPath(), err)
	}
}

// TestTwoProcesses runs perftest's SRD tests and libfabric's ping-pong between two processes,
// each with its own device, over SRD on UDP loopback: the cross-process acceptance list.
// fi_pingpong checks every byte it receives (-c); perftest 4.5 has no such check. The *_wrap
// cases run 20,000 round trips of 64 bytes, or 2,000 of 64 KiB (libfabric's long-message
// protocol), which wrap every CQ, ring and request-id space of libfabric's endpoints many times
// over (a 64-byte fi_pingpong stalled after a few thousand when the device
// paced CQs on a doorbell that libefa 44's extended polling never writes).
func TestTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("runs perftest and fi_pingpong between two processes")
	}
	ping := func(size, iters string, ep ...string) []string {
		return append([]string{"-p", "efa", "-c", "-I", iters, "-S", size}, ep...)
	}
	cases := []struct {
		name    string
		tool    string
		args    []string
		want    string
		timeout time.Duration
	}{
		{"ib_send_bw", "ib_send_bw", nil, "BW average", time.Minute},
		{"ib_send_lat", "ib_send_lat", nil, "t_typical", time.Minute},
		{"ib_read_bw", "ib_read_bw", nil, "BW average", time.Minute},
		{"ib_read_lat", "ib_read_lat", nil, "t_typical", time.Minute},
		{"fi_pingpong_dgram", "fi_pingpong", ping("1024", "100"), "usec/xfer", time.Minute},
		{"fi_pingpong_rdm", "fi_pingpong", ping("1024", "100", "-e", "rdm"), "usec/xfer", time.Minute},
		{"fi_pingpong_dgram_wrap", "fi_pingpong", ping("64", "20000"), "=20k", 2 * time.Minute},
		{"fi_pingpong_rdm_wrap", "fi_pingpong", ping("64", "20000", "-e", "rdm"), "=20k", 2 * time.Minute},
		{"fi_pingpong_rdm_64k_wrap", "fi_pingpong", ping("65536", "2000", "-e", "rdm"), "=2k", 2 * time.Minute},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			runPair(t, pair{tool: c.tool, args: c.args, want: c.want, timeout: c.timeout})
		})
	}
}

// pair is one two-process run: a server and a client of tool, each under softefa run with a
// device of its own.
type pair struct {
	tool    string        // the program (a path, or a name looked up in PATH)
	args    []string      // fi_pingpong: its arguments; perftest: none (the SRD arguments are added)
	env     []string      // added to both processes' environment
	want    string        // what the client's output must contain
	timeout time.Duration // for the client
	setup   *Setup        // both processes' device (nil: each its own)
}

// runPair runs c's server and then its client against it on 127.0.0.1, fails the test unless
// both exit successfully and the client printed c.want, and returns the client's output.
func runPair(t *testing.T, c pair) string {
	t.Helper()
	srvSetup, cliSetup := c.setup, c.setup
	if c.setup == nil {
		srvSetup, cliSetup = setupOrSkip(t, c.tool), setupOrSkip(t, c.tool)
	} else if _, err := exec.LookPath(c.tool); err != nil {
		t.Skipf("%s: %v", c.tool, err) // (as setupOrSkip skips without it)
	}
	port := freeTCPPort(t)
	var srv, cli []string
	switch base := filepath.Base(c.tool); {
	case base == "fi_pingpong":
		srv = append([]string{"-B", fmt.Sprint(port)}, c.args...)
		cli = append([]string{"-P", fmt.Sprint(port)}, c.args...)
	case strings.HasPrefix(base, "fi_"): // fabtests' own programs: addresses out of band
		srv = append([]string{fmt.Sprintf("-E=%d", port)}, c.args...)
		cli = srv
	default:
		srv = append([]string{"-d", "efa_0", "-c", "SRD", "-x", "0", "-n", "200", "-p", fmt.Sprint(port)}, c.args...)
		cli = srv
	}
	server := exec.Command(c.tool, srv...)
	server.Env = append(srvSetup.Environ(), c.env...)
	client := exec.Command(c.tool, append(cli, "127.0.0.1")...)
	client.Env = append(cliSetup.Environ(), c.env...)
	out := serverClient(t, server, client, port, c.timeout)
	if !strings.Contains(out, c.want) {
		t.Fatalf("client output lacks %q:\n%s", c.want, out)
	}
	t.Log(lastLines(out, 2))
	return out
}

// awaitListening waits until a TCP socket listens on port (the server's out-of-band channel), as
// /proc/net/tcp and tcp6 show; an error if the server exits first or d passes.
func awaitListening(port int, exited chan error, d time.Duration) error {
	want := fmt.Sprintf(":%04X ", port)
	deadline := time.After(d)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
			b, _ := os.ReadFile(f)
			for _, line := range strings.Split(string(b), "\n") {
				fields := strings.Fields(line)
				if len(fields) > 3 && strings.HasSuffix(fields[1]+" ", want) && fields[3] == "0A" {
					return nil
				}
			}
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("exited before listening on port %d: %v", port, err)
		case <-deadline:
			return fmt.Errorf("not listening on port %d after %v", port, d)
		case <-tick.C:
		}
	}
}

func freeTCPPort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// serverClient starts server, waits until it listens on port, and runs client against it within
// timeout; it fails the test unless both exit successfully (the server within 30 s of the
// client), and returns the client's output.
func serverClient(t *testing.T, server, client *exec.Cmd, port int, timeout time.Duration) string {
	t.Helper()
	srvOut, srvDone := startServer(t, server)
	stopped := false
	stop := func() string { // ends the server; then its output may be read
		if !stopped {
			server.Process.Kill()
			<-srvDone
			stopped = true
		}
		return srvOut.String()
	}
	defer stop()
	if err := awaitListening(port, srvDone, 30*time.Second); err != nil {
		t.Fatalf("server: %v\n%s", err, stop())
	}
	b, err := combinedOutputWithin(client, timeout)
	out := string(b)
	if err != nil {
		t.Fatalf("client: %v\n%s\nserver:\n%s", err, out, stop())
	}
	select {
	case err := <-srvDone:
		stopped = true
		if err != nil {
			t.Fatalf("server: %v\n%s\nclient:\n%s", err, srvOut.String(), out)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not finish:\n%s", stop())
	}
	return out
}

// startServer starts c in the background with its output collected, and returns the output and
// a channel that gets c's exit.
func startServer(t *testing.T, c *exec.Cmd) (*bytes.Buffer, chan error) {
	t.Helper()
	out := new(bytes.Buffer)
	c.Stdout, c.Stderr = out, out
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	return out, done
}

func combinedOutputWithin(c *exec.Cmd, d time.Duration) ([]byte, error) {
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	c.WaitDelay = 10 * time.Second // (a process c left behind holding the output does not hold the test)
	if err := c.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	select {
	case err := <-done:
		return out.Bytes(), err
	case <-time.After(d):
		c.Process.Kill()
		<-done
		return out.Bytes(), fmt.Errorf("no exit within %v", d)
	}
}

// TestRawABI drives the device node with hand-built commands through the shim (a Python script,
// since the node is only visible to preloaded programs): a NETLINK_RDMA request and its ACK,
// fstat, GET_CONTEXT, dup, QUERY_DEVICE on the duplicate after the original is closed, an ioctl
// method answered EPROTONOSUPPORT and another ioctl ENOTTY, a second context refused, a forked
// child refused.
func TestRawABI(t *testing.T) {
	s := setupOrSkip(t, "python3")
	script, err := filepath.Abs("testdata/rawabi.py")
	if err != nil {
		t.Fatal(err)
	}
	out := run(t, s, "", time.Minute, "python3", script)
	if strings.TrimSpace(out) != "ok" {
		t.Fatalf("rawabi.py: %s", out)
	}
}

// TestUnmappedBuffer: a region a C program registered is a plain virtual-address range, which the
// program may unmap or protect afterwards. A SEND from such a page (or a receive into one) must
// complete with an error, IBV_WC_LOC_PROT_ERR, and the process go on: a SEND from a good page of
// the same region is then received with its bytes (testdata/badbuf.py, with pyverbs).
func TestUnmappedBuffer(t *testing.T) {
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import pyverbs.qp").Run(); err != nil {
		t.Skipf("%s cannot import pyverbs (apt-get install python3-pyverbs): %v", python, err)
	}
	s := setupOrSkip(t)
	script, err := filepath.Abs("testdata/badbuf.py")
	if err != nil {
		t.Fatal(err)
	}
	out := run(t, s, "", time.Minute, python, script, s.Sysfs.IBDev)
	if !strings.HasSuffix(strings.TrimSpace(out), "\nok") {
		t.Fatalf("badbuf.py:\n%s", out)
	}
	t.Log(strings.TrimSpace(out))
}

// TestPerftestNoGID runs ib_send_bw without -x: perftest then asks for an AH without a GRH
// (is_global 0, so a zero destination GID), which the device refuses (EINVAL: it addresses peers
// by GID alone). Both ends must exit with an error at once, the first to build its AH saying
// "Failed to create AH" and the other losing its peer (docs/cabi.md), rather than run traffic that
// goes nowhere.
func TestPerftestNoGID(t *testing.T) {
	if testing.Short() {
		t.Skip("runs perftest between two processes")
	}
	srvSetup := setupOrSkip(t, "ib_send_bw")
	cliSetup := setupOrSkip(t, "ib_send_bw")
	port := freeTCPPort(t)
	args := []string{"-d", "efa_0", "-c", "SRD", "-n", "200", "-p", fmt.Sprint(port)}
	server := exec.Command("ib_send_bw", args...)
	server.Env = srvSetup.Environ()
	srvOut, srvDone := startServer(t, server)
	if err := awaitListening(port, srvDone, 30*time.Second); err != nil {
		server.Process.Kill()
		<-srvDone
		t.Fatalf("server: %v\n%s", err, srvOut.String())
	}
	client := exec.Command("ib_send_bw", append(args, "127.0.0.1")...)
	client.Env = cliSetup.Environ()
	out, cliErr := combinedOutputWithin(client, time.Minute)
	if cliErr != nil && strings.Contains(cliErr.Error(), "no exit within") {
		server.Process.Kill()
		<-srvDone
		t.Fatalf("the client hung: %v\n%s\nserver:\n%s", cliErr, out, srvOut.String())
	}
	var srvErr error
	select {
	case srvErr = <-srvDone:
	case <-time.After(time.Minute):
		server.Process.Kill()
		<-srvDone
		t.Fatalf("the server still runs a minute after the client ended:\n%s", srvOut.String())
	}
	if cliErr == nil || srvErr == nil || !strings.Contains(string(out)+srvOut.String(), "Failed to create AH") {
		t.Fatalf("want both ends to fail, one with \"Failed to create AH\"; client: %v\n%s\nserver: %v\n%s",
			cliErr, out, srvErr, srvOut.String())
	}
}

// TestRdmaTool runs iproute2's rdma tool, which speaks RDMA netlink (NETLINK_RDMA), on the
// device: rdma-core 64's tests find a device's netdev with `rdma link show -j` (an EFA device has
// none), and the counters show under EFA's hw_counters names.
func TestRdmaTool(t *testing.T) {
	s := setupOrSkip(t, "rdma", "sh")
	for _, c := range []struct {
		cmd  string
		want []string
	}{
		{"rdma link show -j", []string{`[{"ifindex":0,"ifname":"efa_0","port":1,"state":"ACTIVE","physical_state":"LINK_UP"}]`}},
		{"rdma dev", []string{"0: efa_0: node_type unspecified fw 0.0.0.0 node_guid "}},
		{"rdma link", []string{"link efa_0/1 state ACTIVE physical_state LINK_UP"}},
		{"rdma resource", []string{"0: efa_0: pd 0 cq 0 qp 0 cm_id 0 mr 0 ctx 0 srq 0"}},
		{"rdma statistic show link efa_0/1", []string{"link efa_0/1 tx_bytes 0 tx_pkts 0 rx_bytes 0", "rdma_read_resp_bytes 0", "impaired_remote_conn_events 0"}},
		{"rdma system", []string{"netns shared copy-on-fork on"}},
	} {
		out := run(t, s, "", time.Minute, "sh", "-c", c.cmd)
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: output lacks %q:\n%s", c.cmd, w, out)
			}
		}
	}
}

// TestInstalledRun installs cmd/softefa with go install into an empty directory and runs
// `softefa run -- ibv_devinfo` from another, with no source tree above either and no --src:
// the libraries are built from the sources embedded in the executable.
func TestInstalledRun(t *testing.T) {
	if testing.Short() {
		t.Skip("installs softefa and builds the libraries from its embedded sources")
	}
	setupOrSkip(t, "ibv_devinfo")
	bin, work := t.TempDir(), t.TempDir()
	install := exec.Command("go", "install", "./cmd/softefa")
	install.Dir = ".."
	install.Env = append(os.Environ(), "GOBIN="+bin)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("go install: %v\n%s", err, out)
	}
	c := exec.Command(filepath.Join(bin, "softefa"), "run", "--", "ibv_devinfo")
	c.Dir = work
	out, err := combinedOutputWithin(c, 5*time.Minute)
	if err != nil {
		t.Fatalf("softefa run from %s: %v\n%s", work, err, out)
	}
	if !strings.Contains(string(out), "hca_id:\tefa_0") {
		t.Fatalf("ibv_devinfo through the installed softefa lacks efa_0:\n%s", out)
	}
}

// TestDeviceAccess checks the device node with access(2) and faccessat(2) (Python's os.access
// with and without effective_ids), as UCX does before it opens a device: readable, writable, not
// executable, like the crw-rw-rw- node stat(2) describes.
func TestDeviceAccess(t *testing.T) {
	s := setupOrSkip(t, "python3")
	out := run(t, s, "", time.Minute, "python3", "-c", `import os
p = "/dev/infiniband/uverbs_softefa0"
for e in (False, True):
    print(os.access(p, os.R_OK | os.W_OK, effective_ids=e), os.access(p, os.F_OK, effective_ids=e),
          os.access(p, os.X_OK, effective_ids=e))`)
	if want := "True True False\nTrue True False\n"; out != want {
		t.Fatalf("got %q, want %q", out, want)
	}
}

// TestSysfsDirect reads the device's sysfs files by their /sys paths, as tools do (rdma-core's
// tests cat a port's pkeys): the shim answers them from the process's own tree.
func TestSysfsDirect(t *testing.T) {
	s := setupOrSkip(t, "sh", "cat")
	out := run(t, s, "", time.Minute, "sh", "-c",
		"cat /sys/class/infiniband/efa_0/ports/1/pkeys/0 /sys/class/infiniband_verbs/abi_version /sys/class/infiniband/efa_0/node_type")
	if want := "0xffff\n6\n7: unspecified\n"; out != want { // RDMA_NODE_UNSPECIFIED, as on EFA
		t.Fatalf("got %q, want %q", out, want)
	}
}

// TestKeyReachesTheEngine: the key in a program's SOFTEFA_KEY is the one its engine seals with.
// ib_send_lat between two processes with the same key runs; with different
// keys the server opens nothing the client sends, and the client's send fails after the transport
// timeout with EFA's status 15 (unreachable: never answered), which ends it with an error.
func TestKeyReachesTheEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ib_send_lat between two processes")
	}
	keyA, keyB := "SOFTEFA_KEY="+strings.Repeat("a1", 32), "SOFTEFA_KEY="+strings.Repeat("b2", 32)
	runPair(t, pair{tool: "ib_send_lat", env: []string{keyA}, want: "t_typical", timeout: time.Minute})

	srvSetup, cliSetup := setupOrSkip(t, "ib_send_lat"), setupOrSkip(t, "ib_send_lat")
	port := freeTCPPort(t)
	args := []string{"-d", "efa_0", "-c", "SRD", "-x", "0", "-n", "200", "-p", fmt.Sprint(port)}
	server := exec.Command("ib_send_lat", args...)
	server.Env = append(srvSetup.Environ(), keyA)
	srvOut, srvDone := startServer(t, server)
	defer func() {
		server.Process.Kill()
		<-srvDone
	}()
	if err := awaitListening(port, srvDone, 30*time.Second); err != nil {
		t.Fatalf("server: %v\n%s", err, srvOut)
	}
	client := exec.Command("ib_send_lat", append(args, "127.0.0.1")...)
	client.Env = append(cliSetup.Environ(), keyB)
	b, err := combinedOutputWithin(client, time.Minute)
	if err == nil || !strings.Contains(string(b), "syndrom 0xf\n") {
		t.Fatalf("with another key than the server's: %v, want a send failed with status 15\n%s", err, b)
	}
	out := string(b)
	i := strings.Index(out, "Failed status")
	t.Log(out[max(i, 0):strings.Index(out, "syndrom 0xf\n")] + "syndrom 0xf")
}
