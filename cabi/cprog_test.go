//go:build linux

package cabi

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildC compiles testdata/name.c against libibverbs and libefa (Debian's libibverbs-dev) into a
// temporary directory and returns the executable, skipping when the headers are missing.
func buildC(t *testing.T, name string) string {
	t.Helper()
	if _, err := exec.LookPath("cc"); err != nil {
		t.Skipf("cc not found: %v", err)
	}
	for _, h := range []string{"/usr/include/infiniband/verbs.h", "/usr/include/infiniband/efadv.h"} {
		if _, err := os.Stat(h); err != nil {
			t.Skipf("%s missing (apt-get install libibverbs-dev): %v", h, err)
		}
	}
	src, err := filepath.Abs(filepath.Join("testdata", name+".c"))
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(t.TempDir(), name)
	out, err := exec.Command("cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", exe, src, "-libverbs", "-lefa", "-lpthread").CombinedOutput()
	if err != nil {
		t.Fatalf("cc %s: %v\n%s", src, err, out)
	}
	return exe
}

// TestCQWrap runs testdata/cqwrap.c: a UD ping-pong between two processes for 70,000 rounds on a
// CQ of 256 entries, checking every payload: 140,000 completions per side wrap the CQ 546 times,
// and the 16-bit counters of the CQ doorbell and of the SQ and RQ doorbells past 2^16. With a CQ from efadv_create_cq read through ibv_start_poll/next_poll/end_poll, as
// libfabric reads it, libefa 44 never writes the CQ doorbell: a device that paced the CQ on the
// doorbell's consumer count stalled after exactly 256 completions (docs/cabi.md, "Completion
// queues"). The other two ways of reading a CQ run as well.
func TestCQWrap(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 70,000 round trips between two processes")
	}
	exe := buildC(t, "cqwrap")
	for _, c := range []struct{ name, args string }{
		{"efadv_start_poll", "-e -x"},
		{"efadv_poll_cq", "-e"},
		{"ibv_create_cq", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := setupOrSkip(t)
			args := append(strings.Fields(c.args), "-q", "256", "-n", "70000")
			out := run(t, s, "", 3*time.Minute, exe, args...)
			if !strings.Contains(out, "ok rounds=70000 cqes=140000 cq=256") {
				t.Fatalf("cqwrap %s:\n%s", strings.Join(args, " "), out)
			}
		})
	}
}
