//go:build linux

package cabi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// UCX 1.21 with its EFA transport (srd), built by cabi/thirdparty/ucx.sh against the stack's
// rdma-core 64 (docs/cabi.md, "UCX"). Without the build these tests skip, unless
// SOFTEFA_REQUIRE_STACK=1, when they fail.

// ucxPrefix returns the UCX build's prefix: $SOFTEFA_UCX, or the one ucx.sh --prefix names.
func ucxPrefix(t *testing.T) string {
	t.Helper()
	p := os.Getenv("SOFTEFA_UCX")
	if p == "" {
		out, err := exec.Command("bash", filepath.Join("thirdparty", "ucx.sh"), "--prefix").Output()
		p = strings.TrimSpace(string(out))
		if err != nil {
			p = ""
		}
	}
	if _, err := os.Stat(filepath.Join(p, ".complete")); p == "" || err != nil {
		msg := fmt.Sprintf("UCX is not built (%q): run cabi/thirdparty/ucx.sh", p)
		if os.Getenv("SOFTEFA_REQUIRE_STACK") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// TestUCXInfo runs `ucx_info -d` through softefa run: UCX must find the device (memory domain
// efa_0, transport srd on efa_0:1; before the shim answered access(2) on the device node, UCX
// skipped it silently). Then `ucx_info -e -u t` with UCX_TLS=srd: UCP must choose srd on
// efa_0:1 for a tagged endpoint, without warnings (rdma-core 64's ibv_query_port_speed failed
// with EPROTONOSUPPORT before softefa answered its ioctl, and UCX warned at every interface).
func TestUCXInfo(t *testing.T) {
	u := ucxPrefix(t)
	s := setupOrSkip(t)
	info := filepath.Join(u, "bin", "ucx_info")
	out := run(t, s, "", time.Minute, info, "-d")
	for _, w := range []string{"# Memory domain: efa_0\n", "#      Transport: srd\n", "#         Device: efa_0:1\n"} {
		if !strings.Contains(out, w) {
			t.Errorf("ucx_info -d lacks %q:\n%s", w, out)
		}
	}
	c := exec.Command(info, "-e", "-u", "t")
	c.Env = append(s.Environ(), "UCX_TLS=srd")
	b, err := combinedOutputWithin(c, time.Minute)
	out = string(b)
	if err != nil {
		t.Fatalf("ucx_info -e -u t: %v\n%s", err, out)
	}
	if !strings.Contains(out, "srd/efa_0:1") {
		t.Errorf("ucx_info -e -u t names no srd/efa_0:1 lane:\n%s", out)
	}
	if strings.Contains(out, " WARN ") || strings.Contains(out, " ERROR ") {
		t.Errorf("ucx_info -e -u t warns:\n%s", out)
	}
}

// ucxPerf is one ucx_perftest run between two softefa run processes over srd.
type ucxPerf struct {
	test   string // -t
	size   int    // -s
	iters  int    // -n
	layout string // UCT tests (-x srd -d efa_0:1 at both ends): the sender's data layout (-D)
}

// TestUCXPerftest runs a short form of each ucx_perftest test the issue lists between two
// processes, each with its device, over UCX's srd transport (UCX_TLS=srd): the server is
// `ucx_perftest -p PORT`, the client names it and the test; both must exit successfully and the
// client must print its final figures. ucx_perftest checks no payload: TestUCXData does.
func TestUCXPerftest(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ucx_perftest between two processes")
	}
	u := ucxPrefix(t)
	for _, c := range []ucxPerf{
		{"am_lat", 8, 1000, "short"},
		{"am_lat", 4000, 200, "bcopy"},
		{"tag_lat", 8, 1000, ""},
		{"tag_lat", 4 << 20, 10, ""},
		{"tag_bw", 64 << 10, 200, ""},
		{"tag_bw", 4 << 20, 10, ""},
		{"put_bw", 8, 1000, "zcopy"},
		{"put_bw", 4 << 20, 10, "zcopy"},
		{"get_bw", 8, 1000, "zcopy"},
		{"get_bw", 4 << 20, 10, "zcopy"},
		{"stream_bw", 64 << 10, 200, ""},
		{"stream_bw", 4 << 20, 10, ""},
	} {
		t.Run(fmt.Sprintf("%s_%d", c.test, c.size), func(t *testing.T) {
			runUCXPerf(t, u, c)
		})
	}
}

func runUCXPerf(t *testing.T, u string, c ucxPerf) {
	t.Helper()
	perftest := filepath.Join(u, "bin", "ucx_perftest")
	srvSetup, cliSetup := setupOrSkip(t), setupOrSkip(t)
	port := freeTCPPort(t)
	env := []string{"UCX_TLS=srd"}
	var uct []string
	if c.layout != "" {
		uct = []string{"-x", "srd", "-d", "efa_0:1"}
	}
	server := exec.Command(perftest, append([]string{"-p", fmt.Sprint(port)}, uct...)...)
	server.Env = append(srvSetup.Environ(), env...)
	srvOut, srvDone := startServer(t, server)
	stopped := false
	stop := func() string {
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
	args := append([]string{"127.0.0.1", "-p", fmt.Sprint(port), "-t", c.test, "-s", fmt.Sprint(c.size),
		"-n", fmt.Sprint(c.iters)}, uct...)
	if c.layout != "" {
		args = append(args, "-D", c.layout)
	}
	client := exec.Command(perftest, args...)
	client.Env = append(cliSetup.Environ(), env...)
	b, err := combinedOutputWithin(client, 2*time.Minute)
	out := string(b)
	if err != nil {
		t.Fatalf("client: %v\n%s\nserver:\n%s", err, out, stop())
	}
	if !strings.Contains(out, "Final:") {
		t.Fatalf("the client printed no final figures:\n%s", out)
	}
	select {
	case err := <-srvDone:
		stopped = true
		if err != nil {
			t.Fatalf("server: %v\n%s", err, srvOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not finish:\n%s", stop())
	}
	t.Log(lastLines(out, 1))
}

// TestUCXData runs testdata/ucxcheck.c, built against the UCX build, between two processes over
// srd (UCX_TLS=srd): tagged messages of 8 B to 4 MiB echoed back (eager, fragmented and, from
// 256 KiB, rendezvous by RDMA read) and RDMA put then get of the same sizes into the server's
// region, every byte checked at both ends, which ucx_perftest does not do.
func TestUCXData(t *testing.T) {
	if testing.Short() {
		t.Skip("moves data between two processes")
	}
	u := ucxPrefix(t)
	src, err := filepath.Abs(filepath.Join("testdata", "ucxcheck.c"))
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), "ucxcheck")
	if out, err := exec.Command("cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", exe, src,
		"-isystem", filepath.Join(u, "include"), "-L"+filepath.Join(u, "lib"),
		"-Wl,-rpath,"+filepath.Join(u, "lib"), "-lucp", "-lucs").CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	srvSetup, cliSetup := setupOrSkip(t), setupOrSkip(t)
	port := freeTCPPort(t)
	server := exec.Command(exe, fmt.Sprint(port))
	server.Env = append(srvSetup.Environ(), "UCX_TLS=srd")
	srvOut, srvDone := startServer(t, server)
	stopped := false
	stop := func() string {
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
	client := exec.Command(exe, fmt.Sprint(port), "127.0.0.1")
	client.Env = append(cliSetup.Environ(), "UCX_TLS=srd")
	b, err := combinedOutputWithin(client, 3*time.Minute)
	out := string(b)
	if err != nil {
		t.Fatalf("client: %v\n%s\nserver:\n%s", err, out, stop())
	}
	for _, size := range []int{8, 64, 512, 4096, 32768, 262144, 4 << 20} {
		for _, w := range []string{fmt.Sprintf("ok tag %d B, ", size), fmt.Sprintf("ok put/get %d B, ", size)} {
			if !strings.Contains(out, w) {
				t.Errorf("client output lacks %q:\n%s", w, out)
			}
		}
	}
	select {
	case err := <-srvDone:
		stopped = true
		if err != nil {
			t.Fatalf("server: %v\n%s", err, srvOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the server did not finish:\n%s", stop())
	}
}
