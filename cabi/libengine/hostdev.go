//go:build linux && cgo

package main

import (
	"os"
	"sync"

	"github.com/softefa/softefa/internal/hostdev"
	"github.com/softefa/softefa/internal/uverbs"
	"golang.org/x/sys/unix"
)

// With SOFTEFA_DEVICE set (softefa run --device), the program has no engine of its own: the
// device node's operations go to the host's device over its socket (package internal/hostdev),
// which reaches the program's memory and rings itself. A trapped doorbell store sends the device
// a kick (one datagram, no reply; the device's watcher scans only QPs whose stores do not trap),
// CQ rings are not guarded, and no thread of the program does the device's work.

// remote is the program's connection to the host device, once made; nil without SOFTEFA_DEVICE.
var remote struct {
	once sync.Once
	c    *hostdev.Client
	err  error
}

// hostDevice returns the connection to the host device, or nil when the program has an engine
// of its own.
func hostDevice() (*hostdev.Client, error) {
	path := os.Getenv("SOFTEFA_DEVICE")
	if path == "" {
		return nil, nil
	}
	remote.once.Do(func() { remote.c, remote.err = hostdev.Dial(path) })
	return remote.c, remote.err
}

// remoteOpen is softefa_open on the host device: the open's memfd becomes the program's fd.
func remoteOpen(c *hostdev.Client, flags int) (int, error) {
	h, mfd, err := c.Open()
	if err != nil {
		return -1, err
	}
	cmd := unix.F_DUPFD
	if flags&unix.O_CLOEXEC != 0 {
		cmd = unix.F_DUPFD_CLOEXEC
	}
	fd, err := unix.FcntlInt(uintptr(mfd), cmd, 3)
	unix.Close(mfd)
	if err != nil {
		_ = c.CloseFile(h)
		return -1, err
	}
	state.Lock()
	if state.files == nil {
		state.files = make(map[int32]*open)
	}
	state.files[int32(fd)] = &open{remote: h, refs: 1}
	state.Unlock()
	return fd, nil
}

// remoteErr is the negative errno a remote call's error returns to the shim.
func remoteErr(err error) int { return -int(uverbs.Errno(err)) }
