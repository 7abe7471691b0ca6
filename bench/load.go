package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

// The loaded workloads run beside CPU hogs: one child process per core (the bench binary with
// the hidden flag --hog), each spinning in a tight loop until its stdin closes, at the same
// priority as the benchmark. They start before a loaded workload's first run and stop after its
// last, so that every transport, in every mode, meets the same load.

// hogs are the running CPU hogs.
type hogs struct {
	cmds []*exec.Cmd
	ins  []io.WriteCloser
}

// startHogs starts n hogs.
func startHogs(n int) (*hogs, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	h := &hogs{}
	for range n {
		cmd := exec.Command(self, "--hog")
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			h.stop()
			return nil, fmt.Errorf("starting a CPU hog: %w", err)
		}
		h.cmds, h.ins = append(h.cmds, cmd), append(h.ins, in)
	}
	return h, nil
}

// stop ends the hogs: it closes their stdin and waits, killing (by its PID) one that has not
// exited within a second.
func (h *hogs) stop() {
	for _, in := range h.ins {
		in.Close()
	}
	for _, cmd := range h.cmds {
		t := time.AfterFunc(time.Second, func() { cmd.Process.Kill() })
		cmd.Wait()
		t.Stop()
	}
	h.cmds, h.ins = nil, nil
}

// hog is the child's side (--hog): spin until stdin closes (the bench stopped the hog, or
// died).
func hog() {
	go func() {
		io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	// A linear congruential generator: its state is used, so the loop is not optimized away,
	// and it comes back to 0 once in 2⁶⁴ steps, which is never.
	for x := uint64(1); ; x = x*6364136223846793005 + 1442695040888963407 {
		if x == 0 {
			os.Exit(2)
		}
	}
}
