package main

import (
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A dial that goes unanswered (a listener whose accept queue is full drops SYNs, as a
// firewall or an absent host does) fails after --timeout, not after the kernel's minutes of
// retries.
func TestPerfConnectUnanswered(t *testing.T) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil { // never accepted: the queue fills at once
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	full := false
	for range 8 { // fill the accept queue until a dial goes unanswered
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			full = true
			break
		}
		defer c.Close()
	}
	if !full {
		t.Skip("this kernel answers SYNs past a full accept queue")
	}
	code, stderr := runMain(t, "perf", "write_bw", "--connect", addr, "--timeout", "200ms")
	if code == 0 || !strings.Contains(stderr, "connecting to "+addr) || !strings.Contains(stderr, "timeout") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}
