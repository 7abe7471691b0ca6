//go:build linux

package cabi

import (
	"bufio"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestStackFabtests runs libfabric 2.6's own EFA test suite, fabtests' pytest suite
// (share/fabtests/pytest/efa) as its runner runfabtests.py runs it, with server and client both on
// this host (docs/cabi.md, "fabtests"). The suite reaches its hosts with ssh: testdata/fabtests/ssh,
// first on PATH, runs each command here, in the environment of softefa run, so that every fabtests
// program of the suite loads the shim and gets a device of its own. The server is 127.0.0.1 and
// the client localhost: the same address, but two names, so that the suite treats them as the two
// nodes they are (every process has its own device, and the shm provider is off), and runs the
// tests it keeps for two nodes (RNR, truncation, device selection, the implicit AV's unexpected
// path) instead of skipping them as if server and client shared one device. Its options:
//
//   - -t quick, the runner's default set: the unit and functional tests and the short form (-I 5)
//     of the performance tests, whose standard form differs only in its iteration count;
//   - --expression "not (cuda or neuron or rocr)": the parametrizations with GPU, Neuron or ROCr
//     memory are deselected (this host has none; each would only skip after asking for one);
//   - -b: EFA addresses exchanged out of band (the efa provider takes a node given to fi_getinfo
//     as an EFA address, an IPv6 GID, never an IP address; fabtests' README runs efa with -b);
//   - -S, strict mode: a test that ends with ENODATA or ENOSYS fails instead of skipping;
//   - -e: the exclusions of testdata/fabtests/efa.exclude, on top of the efa provider's own
//     (test_configs/efa/efa.exclude, which the runner applies), each with its reason there;
//   - --nworkers 2, so the parallel part runs two tests at a time.
//
// Every test must pass or skip for a reason in fabtestsSkips; any failure, error or other skip
// fails this test.
func TestStackFabtests(t *testing.T) {
	p := fabtestsStack(t)
	s := setupOrSkip(t, "/usr/bin/python3")
	sshDir, err := filepath.Abs(filepath.Join("testdata", "fabtests"))
	if err != nil {
		t.Fatal(err)
	}
	exclude, err := fabtestsExclusions(filepath.Join(sshDir, "efa.exclude"))
	if err != nil {
		t.Fatal(err)
	}
	// SOFTEFA_FABTESTS_EXPR narrows the run to the tests a pytest expression selects (docs/cabi.md,
	// "fabtests"), for timing or chasing one test; CI runs the whole set.
	runFabtests(t, p, s, os.Getenv("SOFTEFA_FABTESTS_EXPR"), exclude, 60*time.Minute, 90*time.Minute)
}

// TestStackFabtestsHostDevice runs, with every program of the suite on one host device (softefa
// run --device), the fabtests TestStackFabtests excludes because each of its processes has a
// device of its own: test_dgram_pingpong and test_efa_device_selection read the device's
// hw_counters (tx_bytes) with cat, another process, before and after their traffic, and check that
// it grew. On the host device every process sees the one device's counters, as on EFA.
//
// SOFTEFA_FABTESTS_HOST_EXPR, when set, runs the tests that pytest expression selects instead (the
// whole quick set when it is empty), with the exclusions of none but the provider, and checks
// them as TestStackFabtests does.
func TestStackFabtestsHostDevice(t *testing.T) {
	p := fabtestsStack(t)
	s, _ := hostDevice(t)
	if sel, ok := os.LookupEnv("SOFTEFA_FABTESTS_HOST_EXPR"); ok {
		runFabtests(t, p, s, sel, nil, 60*time.Minute, 90*time.Minute)
		return
	}
	passed, skipped := runFabtests(t, p, s, "test_dgram_pingpong or test_efa_device_selection", nil, 3*time.Minute, 10*time.Minute)
	if len(skipped) > 0 {
		t.Errorf("on the host device these skipped: %s", strings.Join(skipped, ", "))
	}
	// The five: test_dgram_pingpong's one parametrization, test_efa_device_selection's four
	// (two fabrics, two ways to select the device).
	for f, want := range map[string]int{"test_dgram_pingpong": 1, "test_efa_device_selection": 4} {
		if n := len(slices.DeleteFunc(slices.Clone(passed), func(n string) bool { return testFunc(n) != f })); n != want {
			t.Errorf("%d of %s passed on the host device, want %d (passed: %s)", n, f, want, strings.Join(passed, ", "))
		}
	}
}

// fabtestsStack returns the stack's prefix, or skips: the suite runs only when asked for
// (SOFTEFA_FABTESTS=1) and with the runner's Python modules.
func fabtestsStack(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs libfabric's EFA test suite")
	}
	if os.Getenv("SOFTEFA_FABTESTS") != "1" {
		// 30 to 45 minutes on 2 vCPUs: asked for by name, not part of go test ./... (docs/testing.md).
		t.Skip("libfabric's EFA suite runs with SOFTEFA_FABTESTS=1 (and go test -timeout 120m)")
	}
	p := stackPrefix(t)
	if out, err := exec.Command("/usr/bin/python3", "-c", "import pytest, xdist, yaml, retrying, junitparser").CombinedOutput(); err != nil {
		msg := fmt.Sprintf("fabtests' runner needs python3-pytest python3-pytest-xdist python3-yaml python3-retrying python3-junitparser: %v\n%s", err, out)
		if os.Getenv("SOFTEFA_REQUIRE_STACK") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

// runFabtests runs the suite of the stack at p, its programs in setup s, on the tests the pytest
// expression sel selects ("" for all), with the exclusions exclude on top of the provider's own,
// for at most within; it skips (fails, with SOFTEFA_REQUIRE_STACK=1) unless go test's deadline
// leaves need. It checks the suite's report: every test must pass or skip for a reason in
// fabtestsSkips. It returns the tests that passed, and those that skipped.
func runFabtests(t *testing.T, p string, s *Setup, sel string, exclude []string, need, within time.Duration) (passed, skipped []string) {
	t.Helper()
	sshDir, err := filepath.Abs(filepath.Join("testdata", "fabtests"))
	if err != nil {
		t.Fatal(err)
	}
	// The whole suite takes 30 to 45 minutes on 2 vCPUs (docs/cabi.md); go test's default
	// timeout is 10 minutes a package.
	if d, ok := t.Deadline(); ok {
		if left := time.Until(d) - time.Minute; left < need {
			msg := fmt.Sprintf("these tests of libfabric's EFA suite need %v; go test's deadline leaves %v: run with -timeout 120m",
				need, left.Round(time.Minute))
			if os.Getenv("SOFTEFA_REQUIRE_STACK") == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		} else {
			within = min(within, left)
		}
	}
	expr := "not (cuda or neuron or rocr)"
	if sel != "" {
		expr += " and (" + sel + ")"
	}
	report := filepath.Join(t.TempDir(), "fabtests.xml")
	bin := filepath.Join(p, "bin")
	args := []string{filepath.Join(bin, "runfabtests.py"),
		"-b", "-S", "-p", bin, "--nworkers", "2", "-v", "--junit-xml", report,
		"-t", "quick", "--expression", expr}
	if len(exclude) > 0 {
		args = append(args, "-e", strings.Join(exclude, ","))
	}
	c := exec.Command("/usr/bin/python3", append(args, "efa", "127.0.0.1", "localhost")...)
	c.Env = append(s.Environ(), "PATH="+sshDir+":"+bin+":"+os.Getenv("PATH"),
		"PYTEST_ADDOPTS=-p no:cacheprovider") // the suite's directory is the stack's, maybe read-only
	start := time.Now()
	out, runErr := combinedOutputWithin(c, within)
	cases, err := readJUnit(report)
	if err != nil {
		t.Fatalf("runfabtests.py: %v; its report: %v\n%s", runErr, err, lastLines(string(out), 60))
	}
	xfailed := 0
	reasons := map[string]int{}
	for _, tc := range cases {
		switch {
		case tc.Failure != nil || tc.Error != nil:
			t.Errorf("%s: %s\n%s", tc.Name, tc.message(), lastLines(tc.SystemOut, 40))
		case tc.Skipped != nil && tc.Skipped.Type == "pytest.xfail":
			if _, ok := fabtestsXfails[testFunc(tc.Name)]; !ok {
				t.Errorf("%s failed, as marked expected (xfail), but not one of fabtestsXfails: %s", tc.Name, tc.Skipped.Message)
			}
			xfailed++
		case tc.Skipped != nil:
			why := skipReason(tc.Skipped.Message)
			if _, ok := fabtestsSkips[why]; !ok {
				t.Errorf("%s skipped: %s", tc.Name, tc.Skipped.Message)
			}
			reasons[why]++
			skipped = append(skipped, tc.Name)
		default:
			passed = append(passed, tc.Name)
		}
	}
	if runErr != nil && !t.Failed() {
		t.Errorf("runfabtests.py: %v with no failed test in its report:\n%s", runErr, lastLines(string(out), 60))
	}
	if len(passed) == 0 {
		t.Fatalf("no test passed:\n%s", lastLines(string(out), 60))
	}
	var lines []string
	for r, n := range reasons {
		lines = append(lines, fmt.Sprintf("  %4d skipped: %s", n, r))
	}
	sort.Strings(lines)
	t.Logf("fabtests (efa, quick): %d tests, %d passed, %d failed as expected (xfail), %d skipped, in %v\n%s\nslowest: %s",
		len(cases), len(passed), xfailed, len(skipped), time.Since(start).Round(time.Second), strings.Join(lines, "\n"), slowest(cases, 8))
	return passed, skipped
}

// slowest names the n test functions that took longest in all, with their times.
func slowest(cases []junitCase, n int) string {
	total := map[string]float64{}
	for _, c := range cases {
		total[testFunc(c.Name)] += c.Time
	}
	names := make([]string, 0, len(total))
	for f := range total {
		names = append(names, f)
	}
	sort.Slice(names, func(i, j int) bool { return total[names[i]] > total[names[j]] })
	var out []string
	for _, f := range names[:min(n, len(names))] {
		out = append(out, fmt.Sprintf("%s %.0fs", f, total[f]))
	}
	return strings.Join(out, ", ")
}

// testFunc is a test's function name: its name without the parameters in brackets.
func testFunc(name string) string {
	if i := strings.IndexByte(name, '['); i >= 0 {
		return name[:i]
	}
	return name
}

// fabtestsSkips are the reasons fabtests' EFA suite gives for the skips allowed in
// TestStackFabtests, each with why it is right here; docs/cabi.md ("fabtests") counts them.
var fabtestsSkips = map[string]string{
	"excluded": "excluded by the efa provider's test_configs/efa/efa.exclude or by testdata/fabtests/efa.exclude",
	"Duplicate completion semantic for fi_read test": "an RDMA read is the same with transmit and delivery " +
		"completion; the suite runs it once",
	"Duplicate completion semantic for fi_write* test": "the device has RDMA write, with which every write " +
		"completes on delivery; the suite runs the delivery-complete form only",
	"the rx cq data mode is only applied for writedata": "a parameter that only fi_writedata takes; the suite " +
		"runs the others once",
	"efa fabric ignores the rx cq data mode": "a parameter only the efa-direct fabric takes",
	"Cannot hit EFA MR limit": "the suite's own bound: the test would need a memory region of 4 GiB or " +
		"more, past what EFA registers",
	"fi_efa_hw_cntr requires efadv_create_comp_cntr": "rdma-core 64 has no efadv_create_comp_cntr (hardware " +
		"completion counters), so fabtests did not build fi_efa_hw_cntr; the device has no completion " +
		"counters either",
}

// fabtestsXfails are the tests the suite marks as expected to fail (pytest.mark.xfail, strict:
// passing fails them), with the suite's reason.
var fabtestsXfails = map[string]string{
	"test_implicit_av_limited_av_size_unexpected_path": "an implicit AV of 3 entries for 5 server " +
		"endpoints evicts entries the client still needs, and the test hangs until its timeout",
}

// skipReason is a skip message without pytest's location prefix ("file.py:12: why").
func skipReason(msg string) string {
	if i := strings.Index(msg, ": "); i >= 0 && strings.Contains(msg[:i], ".py:") {
		return msg[i+2:]
	}
	return msg
}

// fabtestsExclusions reads an exclusion file as runfabtests.py's reads them (a regular
// expression a line, matched against each test's command; # starts a comment line) for its -e
// option, which takes them joined by commas, so none may hold a comma.
func fabtestsExclusions(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var pats []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.Contains(line, ",") {
			return nil, fmt.Errorf("%s: pattern %q has a comma", path, line)
		}
		pats = append(pats, line)
	}
	if len(pats) == 0 {
		return nil, fmt.Errorf("%s: no patterns", path)
	}
	return pats, sc.Err()
}

// junitCase is a testcase of pytest's JUnit XML report (xunit1, as fabtests' pytest.ini asks).
type junitCase struct {
	Name      string        `xml:"name,attr"`
	Class     string        `xml:"classname,attr"`
	Time      float64       `xml:"time,attr"`
	Failure   *junitOutcome `xml:"failure"`
	Error     *junitOutcome `xml:"error"`
	Skipped   *junitOutcome `xml:"skipped"`
	SystemOut string        `xml:"system-out"`
}

type junitOutcome struct {
	Type    string `xml:"type,attr"`
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

func (c junitCase) message() string {
	for _, o := range []*junitOutcome{c.Failure, c.Error} {
		if o != nil {
			return strings.TrimSpace(o.Message + "\n" + lastLines(o.Text, 20))
		}
	}
	return ""
}

// readJUnit returns the test cases of a JUnit XML report: one testsuite, or several under
// testsuites (runfabtests.py merges its parallel and serial runs' reports so).
func readJUnit(path string) ([]junitCase, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Cases  []junitCase `xml:"testcase"`
		Suites []struct {
			Cases []junitCase `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	cases := doc.Cases
	for _, s := range doc.Suites {
		cases = append(cases, s.Cases...)
	}
	return cases, nil
}

// TestReadJUnit reads a report as pytest 7 writes it (xunit1) and as runfabtests.py merges two.
func TestReadJUnit(t *testing.T) {
	suite := `<testsuite name="pytest" tests="3"><testcase classname="efa.test_a" name="test_ok[x y]" time="1.5" />` +
		`<testcase classname="efa.test_a" name="test_skip" time="0.1"><skipped type="pytest.skip" message="excluded">common.py:587: excluded</skipped></testcase>` +
		`<testcase classname="efa.test_a" name="test_xf[1]" time="15.0"><skipped type="pytest.xfail" message="" /></testcase></testsuite>`
	for _, doc := range []string{suite, "<testsuites>" + suite + suite + "</testsuites>"} {
		p := filepath.Join(t.TempDir(), "r.xml")
		if err := os.WriteFile(p, []byte(`<?xml version="1.0" encoding="utf-8"?>`+doc), 0o644); err != nil {
			t.Fatal(err)
		}
		cases, err := readJUnit(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(cases)%3 != 0 || len(cases) == 0 || cases[0].Name != "test_ok[x y]" || cases[0].Time != 1.5 ||
			cases[1].Skipped == nil || skipReason(cases[1].Skipped.Message) != "excluded" ||
			cases[2].Skipped == nil || cases[2].Skipped.Type != "pytest.xfail" || testFunc(cases[2].Name) != "test_xf" {
			t.Fatalf("%+v", cases)
		}
	}
	if got := skipReason("efa/test_rma_bw.py:89: Duplicate completion semantic for fi_read test"); got != "Duplicate completion semantic for fi_read test" {
		t.Errorf("skipReason: %q", got)
	}
}
