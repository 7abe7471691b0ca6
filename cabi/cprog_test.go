//go:build linux

package cabi

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
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

// onDevices runs f once with a device in each process (setupOrSkip) and once with every program
// on one host device (hostDevice), as subtests "own" and "host".
func onDevices(t *testing.T, f func(t *testing.T, s *Setup)) {
	t.Run("own", func(t *testing.T) { f(t, setupOrSkip(t)) })
	t.Run("host", func(t *testing.T) {
		s, _ := hostDevice(t)
		f(t, s)
	})
}

// TestCQWrap runs testdata/cqwrap.c: a UD ping-pong between two processes for 70,000 rounds on a
// CQ asked for 256 entries, checking every payload: 140,000 completions per side wrap the CQ (512
// entries: docs/cabi.md, "Completion queues") 273 times, and the 16-bit counters of the CQ
// doorbell and of the SQ and RQ doorbells past 2^16; on the host device, the 31-bit kick numbers
// of each program past their wrap. With a CQ from efadv_create_cq read through
// ibv_start_poll/next_poll/end_poll, as libfabric reads it, libefa 44 never writes the CQ
// doorbell: a device that paced the CQ on the doorbell's consumer count stalled after exactly 256
// completions (docs/cabi.md, "Completion queues"). The other two ways of reading a CQ run as
// well, each with a device per process and on a host device.
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
			onDevices(t, func(t *testing.T, s *Setup) {
				args := append(strings.Fields(c.args), "-q", "256", "-n", "70000")
				out := run(t, s, "", 3*time.Minute, exe, args...)
				if !strings.Contains(out, "ok rounds=70000 cqes=140000 cq=256") {
					t.Fatalf("cqwrap %s:\n%s", strings.Join(args, " "), out)
				}
			})
		})
	}
}

// TestThreadsInEngine runs testdata/threads.c: two threads of one process ping-pong 20,000
// messages through the device, each busy-polling its CQ, as UCX's performance envelope tests do.
// Both keep calling into the engine, whose Go runtime starts with one processor: a thread coming
// back into Go waited for ever behind the other, which took the processor back each time it
// re-entered (docs/cabi.md, "Threads of the program in the engine"); the run stalled within its
// first rounds.
//
// On the host device, where no Go runtime runs in the program, the two threads' posts and waits
// share the program's doorbell socket and its answers (docs/architecture.md, "Doorbells on the
// host device").
func TestThreadsInEngine(t *testing.T) {
	exe := buildC(t, "threads")
	onDevices(t, func(t *testing.T, s *Setup) {
		out := run(t, s, "", 3*time.Minute, exe, "-n", "20000")
		if !strings.Contains(out, "ok rounds=20000") {
			t.Fatalf("threads:\n%s", out)
		}
	})
}

// TestSignals sends SIGTERM to testdata/sigpoll.c while its three threads busy-poll the device
// through the shim (most of their time is spent inside calls into the engine), 50 times with a
// handler that calls verbs entering the device and then re-raises the signal, and 50 times
// without a handler. Every run must end as it would on EFA: the handler ran to its end, and the
// process died of SIGTERM; no hang, no Go runtime crash. A handler that ran on a thread inside the
// engine re-entered Go there ("fatal error: exitsyscall: syscall frame is no longer valid", or a
// SIGSEGV): about 3 runs in 4 failed before the shim blocked signals around its calls into the
// engine (docs/cabi.md, "Signals").
//
// On the host device the signal finds the threads polling their CQs and waiting for their kicks'
// answers in the shim's C code (docs/architecture.md, "Doorbells on the host device").
func TestSignals(t *testing.T) {
	if testing.Short() {
		t.Skip("runs 200 processes")
	}
	exe := buildC(t, "sigpoll")
	onDevices(t, func(t *testing.T, s *Setup) {
		for _, handler := range []bool{true, false} {
			failed := 0
			for i := range 50 {
				args := []string{"-t", "3"}
				if handler {
					args = append(args, "-h")
				}
				if err := sigtermRun(s, exe, args, handler); err != nil {
					failed++
					t.Errorf("handler %v, run %d: %v", handler, i, err)
					if failed == 3 {
						t.FailNow()
					}
				}
			}
		}
	})
}

// sigtermRun starts exe, waits for its "ready", sends SIGTERM and checks how it ended.
func sigtermRun(s *Setup, exe string, args []string, handler bool) error {
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	c := exec.Command(exe, args...)
	c.Env = s.Environ()
	c.Stdout, c.Stderr = w, w
	err = c.Start()
	w.Close()
	if err != nil {
		r.Close()
		return err
	}
	ready := make(chan struct{})
	output := make(chan string, 1)
	go func() { // reads everything the program writes, noting "ready"
		defer r.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		told := false
		for {
			n, err := r.Read(buf)
			b.Write(buf[:n])
			if !told && strings.Contains(b.String(), "ready\n") {
				close(ready)
				told = true
			}
			if err != nil {
				output <- b.String()
				return
			}
		}
	}()
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	select {
	case <-ready:
	case err := <-exited:
		return fmt.Errorf("ended before it was ready: %v\n%s", err, <-output)
	case <-time.After(time.Minute):
		c.Process.Kill()
		<-exited
		return fmt.Errorf("not ready within a minute\n%s", <-output)
	}
	if err := c.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		c.Process.Kill()
		<-exited
		return fmt.Errorf("still running 30 s after SIGTERM\n%s", <-output)
	}
	out := <-output
	ws := c.ProcessState.Sys().(syscall.WaitStatus)
	switch {
	case !ws.Signaled() || ws.Signal() != syscall.SIGTERM:
		return fmt.Errorf("ended with %v, not killed by SIGTERM\n%s", c.ProcessState, out)
	case strings.Contains(out, "fatal error") || strings.Contains(out, "panic") || strings.Contains(out, "failed"):
		return fmt.Errorf("killed by SIGTERM, but:\n%s", out)
	case handler && !strings.HasSuffix(out, "ready\nhandled\n"):
		return fmt.Errorf("the handler did not run to its end:\n%s", out)
	case !handler && out != "ready\n":
		return fmt.Errorf("unexpected output:\n%s", out)
	}
	return nil
}

// TestEngineTimerSlack runs testdata/slack.c, which opens the device and waits, and reads the
// timer slack of each of its threads: the program's own thread keeps its slack, and the threads
// the engine's Go runtime started while it was loaded have the engine's, 1 ms. The Go runtime's
// monitor thread, which the slack slows, is among them (docs/cabi.md, "The engine's timer
// slack"). Reading another thread's slack needs CAP_SYS_NICE (root, as in CI).
func TestEngineTimerSlack(t *testing.T) {
	exe := buildC(t, "slack")
	s := setupOrSkip(t)
	own, slacks := threadSlacks(t, s, exe)
	if own != 50000 {
		t.Errorf("the program's thread has slack %d ns, want the default 50000", own)
	}
	if !slices.Contains(slacks, 1000000) {
		t.Errorf("no engine thread has slack 1 ms: %v", slacks)
	}
}

// threadSlacks runs exe and returns its main thread's timer slack and those of its other
// threads, in nanoseconds.
func threadSlacks(t *testing.T, s *Setup, exe string) (own int, others []int) {
	t.Helper()
	c := exec.Command(exe)
	c.Env = s.Environ()
	stdin, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.Stderr = os.Stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		if err := c.Wait(); err != nil {
			t.Errorf("slack: %v", err)
		}
	}()
	var pid, tid int
	if _, err := fmt.Fscanf(stdout, "ready pid=%d tid=%d slack=%d\n", &pid, &tid, &own); err != nil {
		t.Fatalf("slack did not get ready: %v", err)
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		if task.Name() == fmt.Sprint(tid) {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%s/timerslack_ns", task.Name())) // (not under task/)
		if errors.Is(err, os.ErrPermission) {
			t.Skipf("reading another thread's timer slack needs CAP_SYS_NICE: %v", err)
		}
		if err != nil {
			continue // (the thread ended)
		}
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, v)
	}
	if len(others) == 0 {
		t.Fatal("the program has no thread but its own: the engine was not loaded")
	}
	return own, others
}
