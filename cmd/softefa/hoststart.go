//go:build linux

package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/hostdev"
)

// hostStartWait is how long softefa run --host waits for a device it started to answer.
const hostStartWait = 10 * time.Second

// startDevice makes sure that a host device answers at socket. When none does, it starts one:
// this executable's softefa device, named name, at addr (its default when empty) with paths UDP
// paths (the default when 0), in a session of its own so that the program's signals and exit
// leave it running, as a NIC outlives the programs that use it; its output goes to socket's
// path with ".log" added. Runs of softefa run that start a device at one socket at once take
// turns (a lock file beside the socket, ".lock" added), so that one starts it and the others find
// it. It returns once the device answers; started says whether this call started it.
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
	lock, err := os.OpenFile(socket+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return false, err
	}
	defer lock.Close()                                               // (and the lock with it)
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil { // (a starter holds it at most hostStartWait)
		return false, err
	}
	if answers(socket) {
		return false, nil // another run's device
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
	logStart, _ := log.Seek(0, io.SeekEnd) // what this device writes comes after
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
			return false, fmt.Errorf("the host's device exited (%v): %s", err, lastLine(logPath, logStart))
		case <-deadline.C:
			c.Process.Kill()
			<-exited
			return false, fmt.Errorf("the host's device did not answer at %s within %v, and was stopped: %s",
				socket, hostStartWait, lastLine(logPath, logStart))
		case <-poll.C:
		}
	}
}

// answers reports whether a host device answers at socket.
func answers(socket string) bool {
	_, ok := deviceInfo(socket)
	return ok
}

// deviceInfo asks the host device at socket for its info; ok is false when none answers.
func deviceInfo(socket string) (info hostdev.Info, ok bool) {
	c, err := hostdev.Dial(socket)
	if err != nil {
		return info, false
	}
	defer c.Close()
	info, err = c.Info()
	return info, err == nil
}

// lastLine returns the last non-empty line written to the file at path past offset from.
func lastLine(path string, from int64) string {
	b, _ := os.ReadFile(path)
	if from > int64(len(b)) {
		from = int64(len(b))
	}
	b = bytes.TrimRight(b[from:], "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		b = b[i+1:]
	}
	if len(b) == 0 {
		return "(it wrote nothing)"
	}
	return string(b)
}

// closeInherited closes the descriptors from 3 up that this process inherited open across exec
// (without close-on-exec; Go opens every descriptor of its own with it). A device started by
// softefa run would otherwise hold, for as long as it runs, whatever the run inherited: a pipe to
// a caller waiting for the run's output to end, a make jobserver's descriptors.
func closeInherited() {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		if flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil && flags&unix.FD_CLOEXEC == 0 {
			unix.Close(fd)
		}
	}
}

// warnOtherAddr warns when the device already answering at socket is not at addr, which
// softefa run --host was given for a device it would start.
func warnOtherAddr(socket, addr string) {
	info, ok := deviceInfo(socket)
	if !ok {
		return
	}
	if at := config.AddrFromGID(info.GID, 0); at.String() != addr {
		fmt.Fprintf(os.Stderr, "softefa run: the host's device at %s runs at %v already; --addr %s is not used\n", socket, at, addr)
	}
}
