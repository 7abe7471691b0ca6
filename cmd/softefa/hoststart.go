//go:build linux

package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/softefa/softefa/internal/hostdev"
)

// hostStartWait is how long softefa run --host waits for a device it started to answer.
const hostStartWait = 10 * time.Second

// startDevice makes sure that a host device answers at socket. When none does, it starts one:
// this executable's softefa device, named name, at addr (its default when empty) with paths UDP
// paths (the default when 0), in a session of its own so that the program's signals and exit
// leave it running, as a NIC outlives the programs that use it; its output goes to socket's
// path with ".log" added. It returns once the device answers, which may be one another process
// started meanwhile; started says whether it was this call's.
func startDevice(socket, name, addr string, paths int) (started bool, err error) {
	if answers(socket) {
		return false, nil
	}
	dir := filepath.Dir(socket)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	if err := hostdev.CheckDir(dir); err != nil {
		return false, err
	}
	exe, err := os.Executable()
	if err != nil {
		return false, err
	}
	logPath := socket + ".log"
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return false, err
	}
	args := []string{"device", "--name", name, "--socket", socket}
	if addr != "" {
		args = append(args, "--addr", addr)
	}
	if paths > 0 {
		args = append(args, "--paths", strconv.Itoa(paths))
	}
	c := exec.Command(exe, args...)
	c.Stdout, c.Stderr = log, log
	c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = c.Start()
	log.Close()
	if err != nil {
		return false, err
	}
	exited := make(chan error, 1)
	go func() { exited <- c.Wait() }()
	deadline := time.NewTimer(hostStartWait)
	defer deadline.Stop()
	poll := time.NewTicker(10 * time.Millisecond)
	defer poll.Stop()
	for {
		if answers(socket) {
			return true, nil
		}
		select {
		case err := <-exited:
			if answers(socket) {
				return false, nil // another process's device took the socket first
			}
			b, _ := os.ReadFile(logPath)
			return false, fmt.Errorf("the host's device exited (%v): %s", err, lastLine(b))
		case <-deadline.C:
			return false, fmt.Errorf("the host's device did not answer at %s within %v (log: %s)", socket, hostStartWait, logPath)
		case <-poll.C:
		}
	}
}

// answers reports whether a host device answers at socket.
func answers(socket string) bool {
	c, err := hostdev.Dial(socket)
	if err != nil {
		return false
	}
	_, err = c.Info()
	c.Close()
	return err == nil
}

// lastLine returns b's last non-empty line.
func lastLine(b []byte) string {
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	return string(b)
}
