package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/verbs"
)

func TestParsePerf(t *testing.T) {
	for _, bad := range [][]string{
		nil, {"-s", "1"}, {"bogus_bw", "--loopback"}, {"send_bw"}, {"send_bw", "--loopback", "-s", "9000"},
		{"write_bw", "--loopback", "-q", "0"}, {"read_lat", "--loopback", "-x"},
	} {
		if _, err := parsePerf(bad, nil); err == nil {
			t.Errorf("perf %q parsed", bad)
		}
	}
	o, err := parsePerf([]string{"write_bw", "--connect", "h:1", "-s", "1048576", "-q", "2", "-t", "3", "-D", "2s",
		"--mtu", "9000", "--paths", "8", "--json", "--stats"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.size != 1<<20 || o.qps != 2 || o.txDepth != 3 || o.duration != 2*time.Second || o.mtu != 9000 ||
		o.paths != 8 || !o.json || !o.stats || o.connect != "h:1" {
		t.Fatalf("parsed %+v", o)
	}
	if _, err := parsePerf([]string{"send_bw", "--server"}, nil); err != nil {
		t.Fatalf("a server takes the client's size: %v", err)
	}
}

// perfJSON runs softefa perf with args (which include --json) and returns its result object.
func perfJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	var out bytes.Buffer
	o, err := parsePerf(args, &out)
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	if err := perf(o); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	var res map[string]any
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("%v: %v: %s", args, err, out.Bytes())
	}
	return res
}

// Each perf test runs in loopback mode, over UDP, with 0 errors and the JSON keys users rely on.
func TestPerfLoopback(t *testing.T) {
	for _, test := range perfTests {
		t.Run(test, func(t *testing.T) {
			args := []string{test, "--loopback", "-n", "50", "-s", "4096", "--json"}
			if strings.HasSuffix(test, "_bw") {
				args = append(args, "-q", "2")
			}
			res := perfJSON(t, args...)
			keys := []string{"test", "size", "errors", "iterations"}
			if strings.HasSuffix(test, "_bw") {
				keys = append(keys, "bw_gbps", "msg_rate_mpps", "bytes")
			} else {
				keys = append(keys, "p50_us", "p99_us", "p999_us", "avg_us")
			}
			for _, k := range keys {
				if _, ok := res[k]; !ok {
					t.Errorf("JSON lacks %q: %v", k, res)
				}
			}
			if res["errors"] != 0.0 || res["iterations"] != 50.0 || res["test"] != test {
				t.Fatalf("result %v", res)
			}
		})
	}
}

func TestPerfTables(t *testing.T) {
	var out bytes.Buffer
	o, _ := parsePerf([]string{"send_lat", "--loopback", "-n", "20", "-s", "64", "--stats"}, &out)
	if err := perf(o); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"t_typical[usec]", "99.9% percentile[usec]", "send_wrs", "tx_pkts", "path 0 to"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	o, _ = parsePerf([]string{"write_bw", "--loopback", "-n", "20", "-s", "8192"}, &out)
	if err := perf(o); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "BW average[Gb/sec]") || !strings.Contains(out.String(), " 8192 ") {
		t.Errorf("bandwidth table:\n%s", out.String())
	}
}

func TestDevinfo(t *testing.T) {
	var out bytes.Buffer
	if err := devinfo([]string{"--json"}, &out); err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(out.Bytes(), &d); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]float64{"vendor_id": 0x1d0f, "vendor_part_id": 0xefa2, "max_msg_sz": 8192,
		"max_rdma_size": 1 << 30, "device_caps": 0x1f} {
		if d[k] != want {
			t.Errorf("%s = %v, want %v", k, d[k], want)
		}
	}
	out.Reset()
	if err := devinfo([]string{"-v"}, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"vendor_id:              0x1d0f", "max_msg_sz:", "RDMA_READ, RNR_RETRY, CQ_WITH_SGID, RDMA_WRITE, UNSOLICITED_WRITE_RECV"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("devinfo -v lacks %q:\n%s", want, out.String())
		}
	}
}

// The README's main job: every operation over UDP and on one device, each transfer checked. With
// GOMAXPROCS 1 too, where the demo's one goroutine must sleep for the other device to run.
func TestDemo(t *testing.T) {
	for _, c := range []struct {
		args  []string
		procs int
	}{
		{[]string{"-n", "200", "--rdma", "300000"}, 0},
		{[]string{"-n", "200", "--rdma", "300000"}, 1},
		{[]string{"-n", "200", "--same-device"}, 0},
	} {
		var out bytes.Buffer
		err := func() error {
			if c.procs > 0 {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(c.procs))
			}
			return demo(c.args, &out)
		}()
		if err != nil {
			t.Fatalf("demo %v: %v\n%s", c.args, err, out.String())
		}
		rows := 0
		for _, line := range strings.Split(out.String(), "\n") {
			if strings.HasSuffix(strings.TrimSpace(line), "yes") {
				rows++
			}
		}
		if rows != len(demoOps()) || !strings.Contains(out.String(), "send_wrs 400 rdma_write_wrs 604 rdma_read_wrs 404") {
			t.Fatalf("demo %v printed %d checked rows, want %d, and the requester's counts:\n%s", c.args, rows, len(demoOps()), out.String())
		}
	}
}

func TestPingpongLoopback(t *testing.T) {
	for _, ud := range []bool{false, true} {
		var out bytes.Buffer
		args := []string{"--loopback", "-n", "100", "-s", "1000"}
		if ud {
			args = append(args, "--ud")
		}
		o, err := parsePingpong(args, &out)
		if err != nil {
			t.Fatal(err)
		}
		if err := pingpong(o); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "200 messages checked, 0 errors") {
			t.Fatalf("ud %v:\n%s", ud, out.String())
		}
	}
}

func TestCounterNames(t *testing.T) {
	for in, want := range map[string]string{"SendWRs": "send_wrs", "RDMAReadWRErr": "rdma_read_wr_err", "TxBytes": "tx_bytes",
		"RDMAWriteRecvBytes": "rdma_write_recv_bytes", "ImpairedRemoteConnEvents": "impaired_remote_conn_events"} {
		if got := snake(in); got != want {
			t.Errorf("snake(%s) = %s, want %s", in, got, want)
		}
	}
}

// A server and a client in two processes: the test binary runs main as the server.
func TestPerfTwoProcesses(t *testing.T) {
	if os.Getenv("SOFTEFA_MAIN") != "" {
		t.Skip()
	}
	srv := exec.Command(os.Args[0], "-test.run=^TestMainHelper$")
	srv.Env = append(os.Environ(), "SOFTEFA_MAIN=perf read_bw --server --listen 127.0.0.1:0")
	stderr, err := srv.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Process.Kill()
	// The server says where it listens once it does.
	lines := bufio.NewScanner(stderr)
	var addr string
	var errBuf bytes.Buffer
	for addr == "" && lines.Scan() {
		errBuf.WriteString(lines.Text() + "\n")
		if _, a, ok := strings.Cut(lines.Text(), "waiting for a client on "); ok {
			addr = a
		}
	}
	if addr == "" {
		t.Fatalf("the server did not say where it listens: %s", errBuf.String())
	}
	rest := make(chan struct{})
	go func() { io.Copy(&errBuf, stderr); close(rest) }()
	var out bytes.Buffer
	o, err := parsePerf([]string{"read_bw", "--connect", addr, "-n", "200", "-s", "65536", "--json"}, &out)
	if err != nil {
		t.Fatal(err)
	}
	cerr := perf(o)
	if cerr != nil {
		srv.Process.Kill() // a server whose client failed waits for another
	}
	<-rest
	if cerr != nil {
		t.Fatalf("%v (server: %s)", cerr, errBuf.String())
	}
	if err := srv.Wait(); err != nil {
		t.Fatalf("server: %v: %s", err, errBuf.String())
	}
	if !strings.Contains(out.String(), `"errors":0`) {
		t.Fatalf("client: %s", out.String())
	}
}

func TestMainHelper(t *testing.T) {
	args := os.Getenv("SOFTEFA_MAIN")
	if args == "" {
		t.Skip("runs main in a child process")
	}
	os.Args = append([]string{"softefa"}, strings.Fields(args)...)
	main()
}

// --metrics serves the counters in Prometheus' text format while a test runs.
func TestMetrics(t *testing.T) {
	e, err := newEndpoint(endpointConfig{addr: "127.0.0.1:0", typ: 0xff, qps: 1, bufSize: 4096, depth: 16, paths: 2, pathMTU: 1500})
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	m, err := listenMetrics("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	m.serve(e)
	defer m.stop()
	resp, err := http.Get("http://" + m.ln.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	_, err = out.ReadFrom(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# TYPE softefa_tx_pkts counter", `softefa_send_wrs{device="efa_0"} 0`,
		`softefa_qp_wr_errors{device="efa_0",qpn="2"} 0`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("metrics lack %q:\n%s", want, out.String())
		}
	}
}

// softefa devices talk through the fabric, with loss and reordering on its paths, and every
// path carries traffic.
func TestFabricSoftefa(t *testing.T) {
	srv, err := newEndpoint(endpointConfig{addr: "127.0.0.1:0", typ: 0xff, qps: 1, bufSize: 1 << 20, depth: 64, paths: 4, pathMTU: 1500})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.close()
	fb := startFabric(t, "--to", srv.dev.Addr().String(), "--loss", "0.05", "--jitter", "200us", "--paths", "4")

	cl, err := newEndpoint(endpointConfig{addr: "127.0.0.1:0", typ: 0xff, qps: 1, bufSize: 1 << 20, depth: 64, paths: 4, pathMTU: 1500})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.close()
	if err := cl.connect(verbs.GID(config.GIDFromAddr(fb.frontAddr()))); err != nil {
		t.Fatal(err)
	}
	qpn := srv.qps[0].QPN()
	for i := range 20 {
		fillPing(cl.buf[:100000], i)
		if err := cl.post(cl.qps[0], uint64(i), qpn, func(x *verbs.QPEx) {
			x.WRRDMAWrite(srv.mr.RKey(), srv.mr.Addr())
			x.WRSetSGE(cl.mr.LKey(), cl.mr.Addr(), 100000)
		}); err != nil {
			t.Fatal(err)
		}
		if err := cl.await(verbs.WCRDMAWrite, 10*time.Second, nil); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if err := cl.post(cl.qps[0], uint64(i), qpn, func(x *verbs.QPEx) {
			x.WRRDMARead(srv.mr.RKey(), srv.mr.Addr())
			x.WRSetSGE(cl.mr.LKey(), cl.mr.Addr()+200000, 100000)
		}); err != nil {
			t.Fatal(err)
		}
		if err := cl.await(verbs.WCSend, 10*time.Second, nil); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		if !checkPing(cl.buf[200000:300000], i) {
			t.Fatalf("round %d: data read back differs", i)
		}
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	used, dropped := 0, uint64(0)
	for _, s := range fb.stats {
		if s.In > 0 {
			used++
		}
		dropped += s.Dropped
	}
	if used < 2 || dropped == 0 { // 8 flows hashed onto 4 paths: ECMP may leave one idle
		t.Errorf("%d paths carried traffic, %d datagrams dropped: %+v", used, dropped, fb.stats)
	}
}

// udpEcho is a UDP server on loopback that sends every datagram back, until the test ends.
func udpEcho(t *testing.T) *net.UDPConn {
	echo, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort("127.0.0.1:0")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, a, err := echo.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			echo.WriteToUDPAddrPort(buf[:n], a)
		}
	}()
	return echo
}

// startFabric runs a fabric with args on a free loopback port until the test ends.
func startFabric(t *testing.T, args ...string) *fabric {
	o, imps, err := parseFabric(append([]string{"--listen", "127.0.0.1:0"}, args...), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := newFabric(o, imps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- fb.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return fb
}

// Plain UDP through the fabric (--raw): what a quic-go or kcp-go pair sees.
func TestFabricRaw(t *testing.T) {
	echo := udpEcho(t)
	fb := startFabric(t, "--raw", "--to", echo.LocalAddr().String())
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(fb.frontAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 100)
	for i := range 20 {
		msg := []byte{byte(i), 1, 2, 3}
		c.Write(msg)
		n, err := c.Read(buf)
		if err != nil || !bytes.Equal(buf[:n], msg) {
			t.Fatalf("echo %d: % x, %v", i, buf[:n], err)
		}
	}
}

// --spread: four flows each way take the four paths one each, whatever their ports hash to.
func TestFabricSpread(t *testing.T) {
	echo := udpEcho(t)
	fb := startFabric(t, "--raw", "--spread", "--to", echo.LocalAddr().String())
	buf := make([]byte, 100)
	for i := range 4 {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(fb.frontAddr()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for range 3 { // a flow keeps its path
			c.Write([]byte{byte(i)})
			if n, err := c.Read(buf); err != nil || n != 1 || buf[0] != byte(i) {
				t.Fatalf("flow %d: % x, %v", i, buf[:n], err)
			}
		}
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	for i, st := range fb.stats {
		if st.In != 6 { // three datagrams of one flow each way
			t.Fatalf("path %d carried %d datagrams, want 6 (%+v)", i, st.In, fb.stats)
		}
	}
}

func TestParseFabricConfig(t *testing.T) {
	f := filepath.Join(t.TempDir(), "fabric.json")
	os.WriteFile(f, []byte(`{"paths": 3, "default": {"loss": 0.01, "delay": "1ms"}, "path": {"2": {"down": true}}}`), 0o600)
	o, imps, err := parseFabric([]string{"--to", "127.0.0.1:1", "--config", f, "--down", "0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.paths != 3 || len(imps) != 3 || !imps[0].Down || imps[1].Loss != 0.01 || imps[1].Delay != time.Millisecond || !imps[2].Down {
		t.Fatalf("%+v %+v", o, imps)
	}
	// --down-after: the paths start up and are remembered for later.
	o, imps, err = parseFabric([]string{"--to", "127.0.0.1:1", "--down", "1", "--down-after", "2s"}, nil)
	if err != nil || imps[1].Down || o.downAfter != 2*time.Second || len(o.downPaths) != 1 || o.downPaths[0] != 1 {
		t.Fatalf("--down-after: %v %+v %+v", err, o, imps)
	}
	if _, _, err := parseFabric([]string{"--to", "127.0.0.1:1", "--down", "busiest"}, nil); err == nil {
		t.Fatal("--down busiest accepted without --down-after")
	}
	if _, _, err := parseFabric([]string{"--listen", "x"}, nil); err == nil {
		t.Fatal("no --to accepted")
	}
}

// poll yields while it spins on an empty CQ: with one Go processor, nothing else of the process
// (the device's timers, its receive loop) runs otherwise until the runtime preempts the spinner,
// 10 ms later (a release of poll that never yielded showed perf send_lat maxima of 8-13 ms).
func TestPollYields(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	e, err := newEndpoint(endpointConfig{addr: "127.0.0.1:0", typ: 0xff, qps: 1, bufSize: 64, depth: 4, paths: 1, pathMTU: 1500})
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	ran := make(chan struct{})
	go close(ran)
	if _, err := e.poll(5 * time.Millisecond); err != errTimeout {
		t.Fatalf("poll of an empty CQ: %v, want the timeout", err)
	}
	select {
	case <-ran:
	default:
		t.Fatal("a goroutine made runnable before poll did not run while it spun")
	}
}
