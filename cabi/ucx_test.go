//go:build linux

package cabi

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
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
	for _, c := range ucxPerfs {
		t.Run(fmt.Sprintf("%s_%d", c.test, c.size), func(t *testing.T) {
			runUCXPerf(t, u, c, setupOrSkip(t), setupOrSkip(t))
		})
	}
}

// TestUCXPerftestHostDevice is TestUCXPerftest with every pair on one host device (softefa run
// --device).
func TestUCXPerftestHostDevice(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ucx_perftest between two processes")
	}
	u := ucxPrefix(t)
	s, srv := hostDevice(t)
	for _, c := range ucxPerfs {
		t.Run(fmt.Sprintf("%s_%d", c.test, c.size), func(t *testing.T) {
			runUCXPerf(t, u, c, s, s)
		})
	}
	if !srv.AwaitPrograms(0) {
		t.Error("a program is still connected")
	}
}

// ucxPerfs are the ucx_perftest runs of TestUCXPerftest: each test the issue lists, short.
var ucxPerfs = []ucxPerf{
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
}

// runUCXPerf runs c's server in srvSetup and its client in cliSetup.
func runUCXPerf(t *testing.T, u string, c ucxPerf, srvSetup, cliSetup *Setup) {
	t.Helper()
	perftest := filepath.Join(u, "bin", "ucx_perftest")
	port := freeTCPPort(t)
	env := []string{"UCX_TLS=srd"}
	var uct []string
	if c.layout != "" {
		uct = []string{"-x", "srd", "-d", "efa_0:1"}
	}
	server := exec.Command(perftest, append([]string{"-p", fmt.Sprint(port)}, uct...)...)
	server.Env = append(srvSetup.Environ(), env...)
	args := append([]string{"127.0.0.1", "-p", fmt.Sprint(port), "-t", c.test, "-s", fmt.Sprint(c.size),
		"-n", fmt.Sprint(c.iters)}, uct...)
	if c.layout != "" {
		args = append(args, "-D", c.layout)
	}
	client := exec.Command(perftest, args...)
	client.Env = append(cliSetup.Environ(), env...)
	out := serverClient(t, server, client, port, 2*time.Minute)
	if !strings.Contains(out, "Final:") {
		t.Fatalf("the client printed no final figures:\n%s", out)
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
	ucxData(t, u, setupOrSkip(t), setupOrSkip(t))
}

// TestUCXDataHostDevice is TestUCXData with both processes on one host device (softefa run
// --device).
func TestUCXDataHostDevice(t *testing.T) {
	if testing.Short() {
		t.Skip("moves data between two processes")
	}
	u := ucxPrefix(t)
	s, _ := hostDevice(t)
	ucxData(t, u, s, s)
}

// ucxData runs testdata/ucxcheck.c, built against the UCX build at u, its server in setup
// srvSetup and its client in cliSetup.
func ucxData(t *testing.T, u string, srvSetup, cliSetup *Setup) {
	t.Helper()
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
	port := freeTCPPort(t)
	server := exec.Command(exe, fmt.Sprint(port))
	server.Env = append(srvSetup.Environ(), "UCX_TLS=srd")
	client := exec.Command(exe, fmt.Sprint(port), "127.0.0.1")
	client.Env = append(cliSetup.Environ(), "UCX_TLS=srd")
	out := serverClient(t, server, client, port, 3*time.Minute)
	for _, size := range []int{8, 64, 512, 4096, 32768, 262144, 4 << 20} {
		for _, w := range []string{fmt.Sprintf("ok tag %d B, ", size), fmt.Sprintf("ok put/get %d B, ", size)} {
			if !strings.Contains(out, w) {
				t.Errorf("client output lacks %q:\n%s", w, out)
			}
		}
	}
}

// TestUCXGtest runs UCX's own unit tests of its EFA transport: the gtest ucx.sh builds from the
// release's test/gtest (bin/ucx_gtest), with GTEST_FILTER=srd/* (every UCT and UCP test case
// instantiated for the srd transport), in one process, through softefa run. Every test the
// process creates opens the device again (its own context, PD, CQs and QPs), and the test's
// sender and receiver, on the one device, reach each other without the network (the device
// carries out messages between its own QPs at once). CLOUD_TYPE=aws, as upstream's EFA run
// sets it (contrib/test_efa.sh): the tests then make the choices they make on an EFA host.
//
// CI runs the named subset ucxGtestCI (the whole set takes longer than all of CI may);
// SOFTEFA_UCX_GTEST=full runs all of srd/*, with the exclusions of
// ucxGtestExcluded, each with its reason (docs/cabi.md, "UCX's gtest", has the full run's result). Every
// test must pass; one that UCX skips (it prints SKIP and gtest counts it as passed) must skip for
// a reason in ucxGtestSkips.
func TestUCXGtest(t *testing.T) {
	if testing.Short() {
		t.Skip("runs UCX's gtest of its srd transport")
	}
	u := ucxPrefix(t)
	gtest := filepath.Join(u, "bin", "ucx_gtest")
	if _, err := os.Stat(gtest); err != nil {
		msg := fmt.Sprintf("%s has no gtest (built by ucx.sh from recipe 2): %v", u, err)
		if os.Getenv("SOFTEFA_REQUIRE_STACK") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	s := setupOrSkip(t)
	incl, within := ucxGtestCI, 20*time.Minute
	if os.Getenv("SOFTEFA_UCX_GTEST") == "full" {
		incl, within = []string{"srd/*"}, 6*time.Hour
	}
	var excl []string
	for _, e := range ucxGtestExcluded {
		excl = append(excl, e.pattern)
	}
	filter := strings.Join(incl, ":") + "-" + strings.Join(excl, ":")
	if d, ok := t.Deadline(); ok {
		within = min(within, time.Until(d)-30*time.Second)
	}
	c := exec.Command(gtest, "--gtest_filter="+filter, "--gtest_color=no")
	c.Env = append(s.Environ(), "CLOUD_TYPE=aws", "UCX_HANDLE_ERRORS=bt", "UCX_LOG_LEVEL=warn",
		"UCX_LOG_PRINT_ENABLE=y")
	start := time.Now()
	b, runErr := combinedOutputWithin(c, within)
	out := string(b)
	r := parseUCXGtest(out)
	for _, name := range r.failed {
		t.Errorf("%s failed:\n%s", name, r.output[name])
	}
	for _, name := range r.unfinished {
		t.Errorf("%s did not finish:\n%s", name, r.output[name])
	}
	reasons := map[string]int{}
	for name, why := range r.skipped {
		if !ucxGtestSkipAllowed(why) {
			t.Errorf("%s skipped: %s", name, why)
		}
		reasons[why]++
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("gtest: %v with no failed test:\n%s", runErr, lastLines(out, 40))
	}
	if r.passed == 0 {
		t.Fatalf("no test passed (filter %s):\n%s", filter, lastLines(out, 40))
	}
	var lines []string
	for why, n := range reasons {
		lines = append(lines, fmt.Sprintf("  %4d skipped: %s", n, why))
	}
	sort.Strings(lines)
	t.Logf("UCX gtest (%s): %d tests run, %d passed, %d skipped, %d failed, in %v\n%s", filter,
		r.run, r.passed, len(r.skipped), len(r.failed)+len(r.unfinished),
		time.Since(start).Round(time.Second), strings.Join(lines, "\n"))
}

// ucxGtestResult is what a gtest run printed: UCX's skips are its own (a "[     SKIP ]" line
// with the reason, then "[       OK ]"), which gtest counts as passes.
type ucxGtestResult struct {
	run, passed int
	skipped     map[string]string // test: reason
	failed      []string
	unfinished  []string          // started and never ended (a crash or the watchdog)
	output      map[string]string // a failed or unfinished test's output
}

func parseUCXGtest(out string) ucxGtestResult {
	r := ucxGtestResult{skipped: map[string]string{}, output: map[string]string{}}
	var cur string
	var buf []string
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "[ RUN      ] "):
			cur = strings.Fields(strings.TrimPrefix(line, "[ RUN      ] "))[0]
			buf = buf[:0]
			r.run++
			continue
		case cur == "":
			continue
		case strings.HasPrefix(line, "[     SKIP ] "):
			why := strings.TrimPrefix(line, "[     SKIP ] ")
			why = strings.TrimSuffix(strings.TrimPrefix(why, "("), ")")
			r.skipped[cur] = why
		case strings.HasPrefix(line, "[       OK ] "):
			if _, ok := r.skipped[cur]; !ok {
				r.passed++
			}
			cur = ""
			continue
		case strings.HasPrefix(line, "[  FAILED  ] "):
			r.failed = append(r.failed, cur)
			r.output[cur] = lastLines(strings.Join(buf, "\n"), 60)
			cur = ""
			continue
		}
		buf = append(buf, line)
	}
	if cur != "" {
		r.unfinished = append(r.unfinished, cur)
		r.output[cur] = lastLines(strings.Join(buf, "\n"), 60)
	}
	return r
}

// ucxGtestCI is the subset of srd/* that CI runs: every UCT test of the transport, its two
// performance envelopes included (test_uct_perf and test_uct_loopback, two threads each polling
// a worker: about 2 minutes), the first of UCP's (test_ucp_perf.envelope/0), and UCP's active
// message, stream, endpoint and peer failure tests (the groups upstream leaves out under ibmock
// among them): 469 tests, about 5.5 minutes on 2 vCPUs. The rest of srd/* (tagged messages,
// RMA, atomics emulated over active messages, wireup, sockaddr, UCP's other envelopes) runs
// with SOFTEFA_UCX_GTEST=full; docs/cabi.md, "UCX's gtest", has that run's result.
var ucxGtestCI = []string{
	"srd/uct_*", "srd/test_uct_*", "srd/test_many2one_am.*", "srd/test_p2p_rma_madvise.*",
	"srd/test_zcopy_comp.*", "srd/test_srd.*", "srd/test_ucp_am*", "srd/test_ucp_ep.*",
	"srd/test_ucp_stream*", "srd/test_ucp_peer_failure*", "srd/test_ucp_fault_tolerance.*",
	"srd/test_ucp_perf.envelope/0",
}

// ucxGtestExcluded are the srd/* tests left out of every run, each with why.
var ucxGtestExcluded = []struct{ pattern, why string }{
	{"srd/test_ucp_am_psn.some_duplicates/*", "the EFA device's send queue takes 2 SGEs " +
		"(EFA_IO_TX_DESC_NUM_BUFS, as EFA's), so srd's active-message zcopy takes 1 IOV " +
		"(max_send_sge - 1) and UCP's duplicate-dropping protocol am/egr/multi/zcopy/psn, which " +
		"needs 2, is never selected; UCP sends with multi-fragment copy-in, which keeps no " +
		"sequence, and delivers the test's deliberately repeated message IDs (the same on EFA)"},
	{"srd/test_ucp_am_psn.all_duplicates/*", "as some_duplicates"},
}

// ucxGtestSkips are the reasons UCX's tests give for the skips allowed in TestUCXGtest (a
// reason starting with one of these), each with why it is right here.
var ucxGtestSkips = []struct{ prefix, why string }{
	{"!check_caps(", "the srd transport lacks a capability the test needs (put and get short, " +
		"async callbacks, endpoint checks, receive events) or has one it excludes"},
	{"!check_atomics(", "the srd transport has no atomics (EFA has none)"},
	{"(!check_atomics(", "the srd transport has no atomics (EFA has none)"},
	{"true || ", "disabled upstream (its skip condition is always true)"},
	{"proto v1", "the test is for UCP's protocols v2; its proto_v1 variant skips"},
	{"mlx5 PRM not supported", "a test of mlx5 devices"},
	{"RC_FC_ENABLE is not a valid configuration", "a test of RC's flow control"},
	{"Test does not apply to the current transport", "the test's transports are others"},
	{"KSM and indirect atomics are required for MT registration", "mlx5's KSM memory keys; " +
		"EFA has neither"},
	{"efa_0:1 is not Ethernet", "a RoCE test; EFA's link layer is unspecified"},
	{"skipping on loopback", "the test needs two interfaces; its loopback variant skips"},
	{"non-inline data arrived", "the test checks data delivered inline in the completion, which " +
		"EFA does not do: the data arrives in a receive buffer"},
	{"No AMO lanes with ODP support", "no atomics on srd"},
	{"transport has no rma_bw lanes", "UCP selects no RMA bandwidth lane on srd in the test's " +
		"configuration"},
	{"At least 2 RMA BW lanes are required, but only 0 available", "as above"},
	// Seen in the full run of srd/* only:
	{"No interface for testing", "UCP's client-server (sockaddr) tests need an interface " +
		"RDMA CM can use (IPoIB or RoCE) when no TCP transport is allowed; EFA has no RDMA CM, so " +
		"they skip on an EFA host too"},
	{"nonparameterized_test()", "the test runs in its first variant only"},
	{"wait mode sleep on EFA not available", "UCX's own condition for EFA devices"},
	{"(send_recv_type() != SEND_RECV_TAG)", "the test is for another variant"},
	{"!cm_use_all_devices()", "the test is for another variant"},
	{"!(get_variant_ctx_params().features & UCP_FEATURE_TAG)", "the test is for another variant"},
	{"get_variant_value() & UNIFIED_MODE", "the test is for another variant"},
	{"(get_variant_value() == RECV_REQ_EXTERNAL)", "the test is for another variant"},
	{"!is_proto_enabled()", "the test is for another protocol version"},
	{"No tag offload", "hardware tag matching: EFA has none"},
	{"no remote registered memory access transport to", "exporting a memory key to another " +
		"process (ucp_memh_pack with EXPORT, mlx5's cross-GVMI keys): EFA's memory domain cannot"},
	{"cannot remove last memory domain", "the test needs two memory domains"},
	{"no active messages transport to", "UCP's wakeup tests need send-completion events " +
		"(no send completion event), which srd does not offer"},
	{"max_hdr + 2 exceeds maximal bcopy size", "the test's header does not fit srd's bcopy size"},
	{"protoV2/prereg are not supported for partial md reg failure", "the test is for another " +
		"protocol version"},
	{"Unsupported", "test_ucp_wireup_keepalive.attr: UCP's keepalive needs an endpoint check, " +
		"which srd does not offer"},
	{"Test is skipped due to unresolved failure", "disabled upstream"},
}

// ucxGtestSkipsUnexplained is the one skip that prints no reason: UCX's tagged-message tests
// (test_ucp_tag_xfer, every variant; the offload variants of test_ucp_tag_match and
// test_ucp_tag_limits) ask for hardware tag-matching offload in their constructor, and the gtest
// skips that on every transport (ucs::skip_hw_tm_offload returns true: upstream issue
// RM4602065), giving no reason.
const ucxGtestSkipsUnexplained = ""

// ucxGtestSkipAllowed reports whether a skip's reason is one of ucxGtestSkips.
func ucxGtestSkipAllowed(why string) bool {
	if why == ucxGtestSkipsUnexplained {
		return true
	}
	for _, s := range ucxGtestSkips {
		if strings.HasPrefix(why, s.prefix) {
			return true
		}
	}
	return false
}

// TestParseUCXGtest checks the reading of gtest's output: passes, UCX's skips (which gtest
// counts as passes), failures and a test cut short.
func TestParseUCXGtest(t *testing.T) {
	out := `[ RUN      ] srd/uct_p2p_am_test.am_short/0 <srd/efa_0:1>
[       OK ] srd/uct_p2p_am_test.am_short/0 (12 ms)
[ RUN      ] srd/uct_amo_add_xor_test.add32/0 <srd/efa_0:1>
[     SKIP ] (!check_atomics(UCS_BIT(UCT_ATOMIC_OP_ADD), OP32))
[       OK ] srd/uct_amo_add_xor_test.add32/0 (0 ms)
[ RUN      ] srd/test_ucp_am_psn.some_duplicates/0 <srd>
common/mem_buffer.cc:379: Failure
[  FAILED  ] srd/test_ucp_am_psn.some_duplicates/0, where GetParam() = srd (176 ms)
[ RUN      ] srd/test_ucp_am_nbx_rndv.invalid_recv_desc/1 <srd/proto_v1>
[vm:23457:0:23457]        rndv.c:573  Assertion ` + "`status == UCS_OK'" + ` failed
`
	r := parseUCXGtest(out)
	if r.run != 4 || r.passed != 1 || len(r.skipped) != 1 ||
		r.skipped["srd/uct_amo_add_xor_test.add32/0"] != "!check_atomics(UCS_BIT(UCT_ATOMIC_OP_ADD), OP32)" ||
		len(r.failed) != 1 || r.failed[0] != "srd/test_ucp_am_psn.some_duplicates/0" ||
		len(r.unfinished) != 1 || r.unfinished[0] != "srd/test_ucp_am_nbx_rndv.invalid_recv_desc/1" {
		t.Errorf("parseUCXGtest: %+v", r)
	}
	if !strings.Contains(r.output[r.failed[0]], "mem_buffer.cc:379") {
		t.Errorf("the failure's output: %q", r.output[r.failed[0]])
	}
	if !ucxGtestSkipAllowed("!check_caps(UCT_IFACE_FLAG_PUT_SHORT)") || ucxGtestSkipAllowed("no reason") {
		t.Error("ucxGtestSkipAllowed")
	}
}
