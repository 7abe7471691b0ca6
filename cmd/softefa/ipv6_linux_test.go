package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// perf between two IPv6 hosts: two network namespaces joined by a veth pair, fd00::1 and
// fd00::2. An IPv6 GID carries no port, so both devices bind the server's --listen port, each on
// its own address; before, the client's device bound a port of the kernel's choice and sent to
// the server's address at that port, where nothing listened.
func TestPerfIPv6TwoHosts(t *testing.T) {
	if os.Getenv("SOFTEFA_MAIN") != "" {
		t.Skip()
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to make network namespaces")
	}
	a, b := fmt.Sprintf("softefa-6a-%d", os.Getpid()), fmt.Sprintf("softefa-6b-%d", os.Getpid())
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v\n%s", args, err, out)
		}
	}
	run("netns", "add", a)
	defer exec.Command("ip", "netns", "del", a).Run()
	run("netns", "add", b)
	defer exec.Command("ip", "netns", "del", b).Run()
	run("-n", a, "link", "add", "v6a", "type", "veth", "peer", "name", "v6b", "netns", b)
	for _, ns := range []struct{ name, dev, addr string }{{a, "v6a", "fd00::1/64"}, {b, "v6b", "fd00::2/64"}} {
		run("-n", ns.name, "link", "set", "lo", "up")
		run("-n", ns.name, "addr", "add", ns.addr, "dev", ns.dev, "nodad")
		run("-n", ns.name, "link", "set", ns.dev, "up")
	}
	in := func(ns, args string) *exec.Cmd {
		c := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestMainHelper$")
		c.Env = append(os.Environ(), "SOFTEFA_MAIN="+args)
		return c
	}
	srv := in(a, "perf send_lat --server --listen [fd00::1]:18515")
	stderr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	lines := bufio.NewScanner(stderr)
	var errBuf bytes.Buffer
	for lines.Scan() {
		errBuf.WriteString(lines.Text() + "\n")
		if strings.Contains(lines.Text(), "waiting for a client on ") {
			break
		}
	}
	rest := make(chan struct{})
	go func() { io.Copy(&errBuf, stderr); close(rest) }()
	cl := in(b, "perf send_lat --connect [fd00::1]:18515 -s 64 -n 200 --timeout 5s --json")
	var clErr bytes.Buffer
	cl.Stderr = &clErr
	out, err := cl.Output()
	if err != nil {
		srv.Process.Kill() // (a server whose client failed waits for another)
	}
	select {
	case <-rest:
	case <-time.After(hangGuard):
		srv.Process.Kill()
		<-rest
		t.Fatalf("the server did not end: %s", errBuf.String())
	}
	if err != nil {
		t.Fatalf("client: %v: %s%s (server: %s)", err, out, clErr.String(), errBuf.String())
	}
	if !strings.Contains(string(out), `"iterations":200`) {
		t.Fatalf("client: %s", out)
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("server: %v: %s", err, errBuf.String())
	}
	if !strings.Contains(errBuf.String(), "for [fd00::2]:") {
		t.Fatalf("the server did not serve fd00::2: %s", errBuf.String())
	}
}
