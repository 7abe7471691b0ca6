package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Bad flag sets are refused at once: a non-zero exit, and the reason on stderr naming the flag.
func TestBadFlags(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0") // --metrics on a port in use
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() }) // after the parallel subtests
	dir := t.TempDir()
	conf := func(name, text string) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	badLoss := conf("loss.json", `{"default": {"loss": 2}}`)
	badKey := conf("key.json", `{"default": {"los": 0.1}}`)
	badPath := conf("path.json", `{"paths": 2, "path": {"5": {"down": true}}}`)
	noQueue := conf("queue.json", `{"default": {"rate": 1000}}`)
	negDelay := conf("delay.json", `{"path": {"1": {"delay": "-1ms"}}}`)
	to := "--to=127.0.0.1:9"
	for _, c := range []struct {
		args []string
		want string // in stderr
	}{
		// perf
		{[]string{"perf"}, "TEST"},
		{[]string{"perf", "bogus_bw", "--loopback"}, `"bogus_bw"`},
		{[]string{"perf", "send_lat"}, "--loopback"},
		{[]string{"perf", "send_lat", "--loopback", "--server"}, "--server and --loopback"},
		{[]string{"perf", "send_lat", "--server", "--connect=h:1"}, "--server and --connect"},
		{[]string{"perf", "send_lat", "--loopback", "--connect=h:1"}, "--connect and --loopback"},
		{[]string{"perf", "send_lat", "--connect=h:1", "--listen=127.0.0.1:1"}, "--listen"},
		{[]string{"perf", "send_lat", "--loopback", "extra"}, `"extra"`},
		{[]string{"perf", "send_lat", "--loopback", "-x"}, "-x"},
		{[]string{"perf", "send_lat", "--loopback", "-D", "-1s"}, "-D"},
		{[]string{"perf", "send_lat", "--loopback", "-D", "0"}, "-D"},
		{[]string{"perf", "send_lat", "--loopback", "-D", "soon"}, "-D"},
		{[]string{"perf", "write_bw", "--loopback", "-D", "2", "-n", "10"}, "-D and -n"},
		{[]string{"perf", "send_lat", "--loopback", "--paths", "0"}, "--paths"},
		{[]string{"perf", "send_lat", "--loopback", "--paths", "-1"}, "--paths"},
		{[]string{"perf", "send_lat", "--loopback", "--paths", "256"}, "--paths"},
		{[]string{"perf", "send_lat", "--loopback", "--mtu", "100"}, "--mtu"},
		{[]string{"perf", "send_lat", "--loopback", "--mtu", "70000"}, "--mtu"},
		{[]string{"perf", "send_lat", "--loopback", "-s", "0"}, "-s"},
		{[]string{"perf", "write_lat", "--loopback", "-s", "-5"}, "-s"},
		{[]string{"perf", "send_bw", "--loopback", "-s", "9000"}, "-s"},
		{[]string{"perf", "send_bw", "--server", "-s", "65536"}, "-s"},
		{[]string{"perf", "write_bw", "--loopback", "-s", "2147483648"}, "-s"},
		{[]string{"perf", "write_bw", "--loopback", "-n", "0"}, "-n"},
		{[]string{"perf", "write_bw", "--loopback", "-n", "-1"}, "-n"},
		{[]string{"perf", "write_bw", "--loopback", "-q", "0"}, "-q"},
		{[]string{"perf", "write_bw", "--loopback", "-q", "65"}, "-q"},
		{[]string{"perf", "send_lat", "--loopback", "-q", "2"}, "-q"},
		{[]string{"perf", "write_bw", "--loopback", "-t", "0"}, "-t"},
		{[]string{"perf", "write_bw", "--loopback", "-t", "5000"}, "-t"},
		{[]string{"perf", "write_lat", "--loopback", "-t", "8"}, "-t"},
		{[]string{"perf", "send_bw", "--loopback", "-l", "0"}, "-l"},
		{[]string{"perf", "send_bw", "--loopback", "-l", "5000"}, "-l"},
		{[]string{"perf", "send_lat", "--loopback", "-l", "8"}, "-l"},
		{[]string{"perf", "send_lat", "--loopback", "-w", "-1"}, "-w"},
		{[]string{"perf", "send_lat", "--loopback", "-w", "1048577"}, "-w"},
		{[]string{"perf", "send_bw", "--loopback", "-w", "10"}, "-w"},
		{[]string{"perf", "write_bw", "--loopback", "--timeout", "0s"}, "--timeout"},
		{[]string{"perf", "write_bw", "--loopback", "--timeout", "-1s"}, "--timeout"},
		{[]string{"perf", "write_bw", "--loopback", "--metrics", busy.Addr().String()}, "--metrics"},
		{[]string{"perf", "write_bw", "--loopback", "--metrics", "nowhere"}, "--metrics"},
		{[]string{"perf", "write_bw", "--connect", "nohostport"}, "--connect"},
		{[]string{"perf", "write_bw", "--connect="}, "--connect"},
		{[]string{"perf", "write_bw", "--connect", "h:99999"}, "--connect"},
		{[]string{"perf", "write_bw", "--server", "--listen", "noport"}, "--listen"},
		{[]string{"perf", "write_bw", "--server", "--json"}, "--json"},
		{[]string{"perf", "write_bw", "--loopback", "--key-file", filepath.Join(dir, "none")}, "--key-file"},
		// pingpong
		{[]string{"pingpong"}, "--loopback"},
		{[]string{"pingpong", "--loopback", "--server"}, "--server and --loopback"},
		{[]string{"pingpong", "--connect=h:1", "--listen=127.0.0.1:1"}, "--listen"},
		{[]string{"pingpong", "--loopback", "-s", "0"}, "-s"},
		{[]string{"pingpong", "--loopback", "-s", "9000"}, "-s"},
		{[]string{"pingpong", "--loopback", "-n", "0"}, "-n"},
		{[]string{"pingpong", "--loopback", "--timeout", "-1s"}, "--timeout"},
		{[]string{"pingpong", "--connect", "nohostport"}, "--connect"},
		{[]string{"pingpong", "--loopback", "extra"}, `"extra"`},
		// fabric
		{[]string{"fabric"}, "--to"},
		{[]string{"fabric", "--to", "nohostport"}, "--to"},
		{[]string{"fabric", to, "--listen", "noport"}, "--listen"},
		{[]string{"fabric", to, "--client-addr", "x"}, "--client-addr"},
		{[]string{"fabric", to, "--paths", "0"}, "--paths"},
		{[]string{"fabric", to, "--paths", "-1"}, "--paths"},
		{[]string{"fabric", to, "--paths", "65"}, "--paths"},
		{[]string{"fabric", to, "--loss", "1.5"}, "--loss"},
		{[]string{"fabric", to, "--loss", "-0.1"}, "--loss"},
		{[]string{"fabric", to, "--dup", "2"}, "--dup"},
		{[]string{"fabric", to, "--corrupt", "-1"}, "--corrupt"},
		{[]string{"fabric", to, "--delay", "-1ms"}, "--delay"},
		{[]string{"fabric", to, "--jitter", "-1ms"}, "--jitter"},
		{[]string{"fabric", to, "--rate", "-5"}, "--rate"},
		{[]string{"fabric", to, "--rate", "1000", "--queue", "0"}, "--queue"},
		{[]string{"fabric", to, "--queue", "-1"}, "--queue"},
		{[]string{"fabric", to, "--duration", "-1s"}, "--duration"},
		{[]string{"fabric", to, "--stats", "-1s"}, "--stats"},
		{[]string{"fabric", to, "--down", "1", "--down-after", "-1s"}, "--down-after"},
		{[]string{"fabric", to, "--down-after", "1s"}, "--down-after"},
		{[]string{"fabric", to, "--down", "7"}, "--down"},
		{[]string{"fabric", to, "extra"}, `"extra"`},
		{[]string{"fabric", to, "--config", badLoss}, "--config"},
		{[]string{"fabric", to, "--config", badKey}, "--config"},
		{[]string{"fabric", to, "--config", badPath}, "--config"},
		{[]string{"fabric", to, "--config", noQueue}, "--config"},
		{[]string{"fabric", to, "--config", negDelay}, "--config"},
		{[]string{"fabric", to, "--config", badPath, "--loss", "0.1"}, "--loss"},
		{[]string{"fabric", to, "--config", badPath, "--paths", "3"}, "--paths"},
		// demo
		{[]string{"demo", "-n", "0"}, "-n"},
		{[]string{"demo", "-s", "2"}, "-s"},
		{[]string{"demo", "-s", "9000"}, "-s"},
		{[]string{"demo", "--rdma", "0"}, "--rdma"},
		{[]string{"demo", "--rdma", "2147483648"}, "--rdma"},
		{[]string{"demo", "--paths", "0"}, "--paths"},
		{[]string{"demo", "--mtu", "100"}, "--mtu"},
		{[]string{"demo", "--addr", "nohostport"}, "--addr"},
		{[]string{"demo", "--addr", "127.0.0.1:18999"}, "--addr"},
		{[]string{"demo", "--same-device", "--addr", "127.0.0.1:0"}, "--addr"},
		{[]string{"demo", "--same-device", "--paths", "2"}, "--paths"},
		{[]string{"demo", "extra"}, `"extra"`},
		// devinfo
		{[]string{"devinfo", "--mtu", "10"}, "--mtu"},
		{[]string{"devinfo", "--addr", "nohostport"}, "--addr"},
		{[]string{"devinfo", "extra"}, `"extra"`},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			t.Parallel()
			code, stderr := runMain(t, c.args...)
			if code == 0 || !strings.Contains(stderr, c.want) {
				t.Errorf("exit %d, stderr %q; want a failure naming %s", code, stderr, c.want)
			}
		})
	}
}

// -h prints the flags and succeeds.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"perf", "-h"}, {"perf", "send_lat", "-h"}, {"pingpong", "-h"}, {"fabric", "-h"},
		{"demo", "-h"}, {"devinfo", "-h"}} {
		code, stderr := runMain(t, args...)
		if code != 0 || !strings.Contains(stderr, "usage: softefa "+args[0]) || !strings.Contains(stderr, "-") {
			t.Errorf("%q: exit %d, stderr %q", args, code, stderr)
		}
	}
}

// Every perf test runs with its default size, as perftest's (a SEND's capped at the MTU).
func TestPerfDefaultSizes(t *testing.T) {
	want := map[string]float64{"send_bw": 8192, "send_lat": 2, "write_bw": 65536, "write_lat": 2, "read_bw": 65536, "read_lat": 2}
	for _, test := range perfTests {
		res := perfJSON(t, test, "--loopback", "-n", "20", "--json")
		if res["size"] != want[test] || res["iterations"] != 20.0 || res["errors"] != 0.0 {
			t.Errorf("%s: %v", test, res)
		}
	}
}

// -D takes perftest's seconds as well as Go durations.
func TestPerfDuration(t *testing.T) {
	for arg, want := range map[string]time.Duration{"2": 2 * time.Second, "0.5": 500 * time.Millisecond,
		"1m30s": 90 * time.Second, "300ms": 300 * time.Millisecond} {
		o, err := parsePerf([]string{"write_bw", "--loopback", "-D", arg}, nil)
		if err != nil || o.duration != want {
			t.Errorf("-D %s: %v, %v; want %v", arg, o, err, want)
		}
	}
}

// A latency test with -D runs for that long rather than -n round trips: with -D 1ns the clock
// has passed the end after the first round trip at the latest.
func TestPerfLatencyDuration(t *testing.T) {
	res := perfJSON(t, "send_lat", "--loopback", "-s", "64", "-D", "1ns", "--json")
	if n, _ := res["iterations"].(float64); n > 1 || res["errors"] != 0.0 {
		t.Fatalf("-D 1ns: %v", res)
	}
}

// The warm-up's round trips (-w) come before the timed ones and are not among them; the first
// is reported on its own.
func TestPerfWarmup(t *testing.T) {
	for _, test := range []string{"send_lat", "write_lat", "read_lat"} {
		res := perfJSON(t, test, "--loopback", "-s", "64", "-n", "5", "-w", "3", "--json")
		if res["iterations"] != 5.0 || res["warmup"] != 3.0 || res["errors"] != 0.0 {
			t.Errorf("%s -n 5 -w 3: %v", test, res)
		}
		if first, _ := res["warmup_first_us"].(float64); first <= 0 {
			t.Errorf("%s -w 3: the first warm-up round trip took %v us", test, res["warmup_first_us"])
		}
	}
	if res := perfJSON(t, "send_lat", "--loopback", "-s", "64", "-n", "5", "-w", "0", "--json"); res["warmup_first_us"] != 0.0 {
		t.Errorf("-w 0: %v", res)
	}
}

// A server listening on an unspecified address gives its device the concrete address the
// client reached it at, and the test runs.
func TestPerfListenUnspecified(t *testing.T) {
	so, err := parsePerf([]string{"send_lat", "--server", "--listen", "0.0.0.0:0", "-s", "64"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	ln, udp, err := listenServer(so.listen)
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	sendLatThrough(t, so, ln, udp, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

// sendLatThrough serves so on ln, its device on UDP port udp, and runs a send_lat client of 20
// iterations against connect: both must end without error, and the client count all 20.
func sendLatThrough(t *testing.T, so *perfOpts, ln net.Listener, udp int, connect string) {
	t.Helper()
	serr := make(chan error, 1)
	go func() { serr <- perfServe(so, ln, udp, false) }()
	var out bytes.Buffer
	co, err := parsePerf([]string{"send_lat", "--connect", connect, "-s", "64", "-n", "20", "--json"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if err := within(t, func() error { return perf(co) }); err != nil {
		t.Fatalf("client: %v", err)
	}
	if err := within(t, func() error { return <-serr }); err != nil {
		t.Fatalf("server: %v", err)
	}
	if !strings.Contains(out.String(), `"iterations":20`) {
		t.Fatalf("client: %s", out.String())
	}
}

// A server whose --listen port is 0 has the kernel choose its device's UDP port too: a UDP
// port of the TCP listener's number may be another program's (CI saw "address already in use"
// from perf --loopback). The client reaches the device through the GID in the hello.
func TestPerfServerPortZero(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "127.0.0.1:00", ":0"} {
		if ln, port, err := listenServer(listen); err != nil || port != 0 {
			t.Fatalf("--listen %s: UDP port %d, %v", listen, port, err)
		} else {
			ln.Close()
		}
	}
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	given := probe.Addr().String()
	probe.Close()
	if ln, port, err := listenServer(given); err == nil {
		if want := ln.Addr().(*net.TCPAddr).Port; port != want {
			t.Fatalf("--listen %s: UDP port %d, want %d", given, port, want)
		}
		ln.Close()
	}
	so, err := parsePerf([]string{"send_lat", "--server", "--listen", "127.0.0.1:0", "-s", "64"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	ln, port, err := listenServer(so.listen)
	if err != nil {
		t.Fatal(err)
	}
	// The listener's number taken for UDP, by this test or by whoever had it.
	if u, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: ln.Addr().(*net.TCPAddr).Port}); err == nil {
		defer u.Close()
	}
	sendLatThrough(t, so, ln, port, ln.Addr().String())
}

// A server refuses a client asking for another test, and the client says why.
func TestPerfServerOtherTest(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	so, err := parsePerf([]string{"read_bw", "--server"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	serr := make(chan error, 1)
	go func() { serr <- perfServe(so, ln, 0, false) }()
	co, err := parsePerf([]string{"send_lat", "--connect", ln.Addr().String(), "-s", "64", "-n", "5"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	err = within(t, func() error { return perf(co) })
	if err == nil || !strings.Contains(err.Error(), "runs read_bw, not send_lat") {
		t.Fatalf("client: %v", err)
	}
	if err := within(t, func() error { return <-serr }); err == nil {
		t.Fatal("server: no error")
	}
}

// A client and a server of which one encrypts and the other does not are refused at the
// exchange, saying so, instead of timing out when the traffic goes unread.
func TestPerfKeyMismatch(t *testing.T) {
	for _, serverKey := range []bool{true, false} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		so, err := parsePerf([]string{"write_bw", "--server"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		co, err := parsePerf([]string{"write_bw", "--connect", ln.Addr().String(), "-n", "5"}, &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		key := bytes.Repeat([]byte{7}, 32)
		if serverKey {
			so.key = key
		} else {
			co.key = key
		}
		serr := make(chan error, 1)
		go func() { serr <- perfServe(so, ln, 0, false) }()
		err = within(t, func() error { return perf(co) })
		if err == nil || !strings.Contains(err.Error(), "give both the key") {
			t.Errorf("server key %v: client: %v", serverKey, err)
		}
		if err := within(t, func() error { return <-serr }); err == nil {
			t.Errorf("server key %v: server: no error", serverKey)
		}
	}
}

// --procs: a server or client process runs on one processor unless told otherwise; --loopback
// and a GOMAXPROCS variable keep Go's choice; an explicit flag wins; negative counts are refused.
func TestPerfProcs(t *testing.T) {
	for _, c := range []struct {
		flag          int
		loopback, env bool
		want          int
	}{
		{-1, false, false, 1}, {-1, true, false, 0}, {-1, false, true, 0},
		{0, false, false, 0}, {2, true, true, 2},
	} {
		if got := perfProcs(c.flag, c.loopback, c.env); got != c.want {
			t.Errorf("perfProcs(%d, loopback %v, env %v) = %d, want %d", c.flag, c.loopback, c.env, got, c.want)
		}
	}
	if _, err := parsePerf([]string{"send_lat", "--loopback", "--procs", "-2"}, io.Discard); err == nil {
		t.Error("--procs -2 accepted")
	}
}

// On IPv6 both ends' devices bind the port the client reached (an IPv6 GID carries no port, so
// the devices it names share one port number); on IPv4 the port given, which the GID carries,
// also on a dual-stack listener reached over IPv4 (its addresses v4-mapped), where checkEnds
// lets two ends on one address be.
func TestDeviceAddrIPv6Port(t *testing.T) {
	for _, tc := range []struct{ listen, host string }{{"127.0.0.1", "127.0.0.1"}, {"::1", "::1"}, {"::", "127.0.0.1"}} {
		host := tc.host
		ln, err := net.Listen("tcp", net.JoinHostPort(tc.listen, "0"))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cc, err := net.Dial("tcp", net.JoinHostPort(host, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		sc, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer sc.Close()
		want := 0
		if host == "::1" {
			want = ln.Addr().(*net.TCPAddr).Port
		}
		for _, a := range []string{deviceAddr(sc, 0, true), deviceAddr(cc, 0, false)} {
			ap := netip.MustParseAddrPort(a)
			if ap.Addr().String() != host || int(ap.Port()) != want {
				t.Errorf("%s on %s: device address %s, want port %d", host, tc.listen, a, want)
			}
		}
		if err := checkEnds(cc); (err != nil) != (host == "::1") {
			t.Errorf("%s on %s: checkEnds: %v", host, tc.listen, err)
		}
	}
}

// A client on the server's own IPv6 address is refused before it makes its device: the two
// devices would have one GID and each send to itself (perf measured a device sending to itself,
// 0.3 µs a round trip).
func TestPerfRefusesSharedIPv6Address(t *testing.T) {
	so, err := parsePerf([]string{"send_lat", "--server", "--listen", "[::1]:0", "-s", "64"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	ln, port, err := listenServer(so.listen)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = perfServe(so, ln, port, true) }() // (it drops a refused client and waits for another)
	defer ln.Close()
	co, err := parsePerf([]string{"send_lat", "--connect", ln.Addr().String(), "-s", "64", "-n", "20"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if err := within(t, func() error { return perf(co) }); !errors.Is(err, errSharedV6) {
		t.Fatalf("client on the server's IPv6 address: %v", err)
	}
	// A client from before the check says hello all the same: the server refuses it.
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(hangGuard))
	h := hello{Test: "send_lat", Size: 64, Iters: 20, QPs: 1, Depth: 64, GID: "::1", QPNs: []uint32{1}}
	if err := json.NewEncoder(c).Encode(h); err != nil {
		t.Fatal(err)
	}
	var sh hello
	if err := json.NewDecoder(c).Decode(&sh); err != nil || !strings.Contains(sh.Err, errSharedV6.Error()) {
		t.Fatalf("the server's answer to a client on its own IPv6 address: %+v, %v", sh, err)
	}
}
