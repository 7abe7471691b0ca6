package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// hangGuard is how long a test waits for something that should end by its own timeout before
// it reports a hang (instead of hanging the test binary): not a speed bound, a failure mode.
const hangGuard = time.Minute

// runMain runs softefa with args in a child process (the test binary, as TestMainHelper) and
// returns its exit code and stderr.
func runMain(t *testing.T, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestMainHelper$")
	cmd.Env = append(os.Environ(), "SOFTEFA_MAIN="+strings.Join(args, " "))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("softefa %s: still running after %v (stderr: %s)", strings.Join(args, " "), hangGuard, stderr.String())
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), stderr.String()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0, stderr.String()
}

// silentListener accepts connections on loopback and never reads or writes, until the test ends.
func silentListener(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// within runs f and returns its error, failing the test if f has not returned after hangGuard.
func within(t *testing.T, f func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- f() }()
	select {
	case err := <-errc:
		return err
	case <-time.After(hangGuard):
		t.Fatalf("no return after %v: not bounded by its timeout", hangGuard)
		return nil
	}
}

// A client whose server accepts and never answers gives up after --timeout, saying why.
func TestPerfConnectSilentServer(t *testing.T) {
	addr := silentListener(t)
	o, err := parsePerf([]string{"send_lat", "--connect", addr, "-s", "64", "--timeout", "200ms"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	err = within(t, func() error { return perf(o) })
	if err == nil || !strings.Contains(err.Error(), "server's hello") || !strings.Contains(err.Error(), "--timeout 200ms") {
		t.Fatalf("perf against a silent server: %v", err)
	}
	code, stderr := runMain(t, "perf", "send_lat", "--connect", addr, "-s", "64", "--timeout", "200ms")
	if code == 0 || !strings.Contains(stderr, "--timeout 200ms") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

func TestPingpongConnectSilentServer(t *testing.T) {
	addr := silentListener(t)
	code, stderr := runMain(t, "pingpong", "--connect", addr, "--timeout", "200ms")
	if code == 0 || !strings.Contains(stderr, "--timeout 200ms") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
}

// A client of a port nothing listens on fails at once, naming the address.
func TestPerfConnectNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, args := range [][]string{{"perf", "write_bw", "--connect", addr}, {"pingpong", "--connect", addr}} {
		code, stderr := runMain(t, args...)
		if code == 0 || !strings.Contains(stderr, "connecting to "+addr) || !strings.Contains(stderr, "refused") {
			t.Errorf("%q: exit %d, stderr %q", args, code, stderr)
		}
	}
}

// A client that connects and says nothing does not hold the server: after the server's
// --timeout it is dropped (its connection closed), and the server takes the next.
func TestPerfServerDropsSilentClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	so, err := parsePerf([]string{"write_lat", "--server", "--timeout", "200ms"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	serr := make(chan error, 1)
	go func() { serr <- perfServe(so, ln, 0, true) }()
	checkDropped(t, ln.Addr().String())
	ln.Close()
	if err := within(t, func() error { return <-serr }); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("server: %v", err)
	}
}

func TestPingpongServerDropsSilentClient(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	so, err := parsePingpong([]string{"--server", "--timeout", "200ms"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	serr := make(chan error, 1)
	go func() { serr <- pingServe(so, ln, 0, true) }()
	checkDropped(t, ln.Addr().String())
	ln.Close()
	if err := within(t, func() error { return <-serr }); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("server: %v", err)
	}
}

// checkDropped connects two silent clients in turn to the server at addr and sees each
// connection closed by the server (the second shows the server went back to accepting).
func checkDropped(t *testing.T, addr string) {
	t.Helper()
	for i := range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		err = within(t, func() error {
			_, err := io.ReadAll(c) // until the server closes: EOF is a nil error here
			return err
		})
		c.Close()
		if err != nil {
			t.Fatalf("silent client %d: %v", i, err)
		}
	}
}
