package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/verbs"
)

// softefa perf TEST: perftest's ib_{send,write,read}_{bw,lat} over SRD. The two sides exchange
// their GID, QP numbers, rkey and buffer address over a TCP connection on the same address and
// port as the server device's UDP endpoint, as perftest does over its own TCP socket.

var perfTests = []string{"send_bw", "send_lat", "write_bw", "write_lat", "read_bw", "read_lat"}

const (
	maxSendSize = 8192    // a SEND's largest message: the device's MTU (max_msg_sz)
	maxRDMASize = 1 << 30 // an RDMA operation's largest: the device's max_rdma_size
	maxQPs      = 64
	maxTxDepth  = 4096
	maxWarmup   = 1 << 20
)

type perfOpts struct {
	cpuprofile string
	procs      int
	test       string
	server     bool
	loopback   bool
	listen     string
	connect    string
	size       int
	iters      int
	warmup     int
	duration   time.Duration
	qps        int
	txDepth    int
	postList   int
	mtu        int
	paths      int
	rxSpin     time.Duration
	noSparse   bool
	noOffload  bool
	json       bool
	stats      bool
	metrics    string
	timeout    time.Duration
	keyFile    string
	key        []byte
	out        io.Writer

	metricsSrv *metricsServer // --metrics, listening from the start
}

// hello is what the two sides tell each other before a test.
type hello struct {
	Test  string   `json:"test,omitempty"`
	Size  int      `json:"size,omitempty"`
	Iters int      `json:"iters,omitempty"`
	QPs   int      `json:"qps,omitempty"`
	Depth int      `json:"depth,omitempty"`
	GID   string   `json:"gid"`
	QPNs  []uint32 `json:"qpns"`
	RKey  uint32   `json:"rkey"`
	Addr  uint64   `json:"addr"`
	Key   bool     `json:"key,omitempty"` // the sender encrypts (--key-file, SOFTEFA_KEY)
	Done  bool     `json:"done,omitempty"`
	Err   string   `json:"err,omitempty"`
}

func parsePerf(args []string, out io.Writer) (*perfOpts, error) {
	o := &perfOpts{out: out}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && !isHelp(args[0]) {
		return nil, fmt.Errorf("usage: softefa perf TEST [flags]; TEST is one of %s (softefa perf -h: the flags)",
			strings.Join(perfTests, ", "))
	}
	o.test = args[0]
	if isHelp(o.test) {
		o.test = "TEST"
	} else if !slices.Contains(perfTests, o.test) {
		return nil, fmt.Errorf("unknown test %q; one of %s", o.test, strings.Join(perfTests, ", "))
	}
	fs := flag.NewFlagSet("perf "+o.test, flag.ContinueOnError)
	fs.BoolVar(&o.server, "server", false, "wait for a client (on --listen); it takes -s, -n, -D, -q and -t from the client")
	fs.BoolVar(&o.loopback, "loopback", false, "run server and client in this process over UDP on 127.0.0.1")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:18515", "server: the TCP address for the exchange and the device's UDP port; with an\n"+
		"unspecified host (0.0.0.0, ::, none) the device binds the address each client reached, a\n"+
		"concrete UDP endpoint for its GID; with port 0 the kernel chooses a UDP port for the device\n"+
		"apart from the TCP one (an IPv4 client learns it from the GID); over IPv6 both devices bind\n"+
		"the listener's port (an IPv6 GID carries none)")
	fs.StringVar(&o.connect, "connect", "", "client: the server's address")
	fs.IntVar(&o.size, "s", 0, "message size in bytes; default, as perftest: 2 for the latency tests and 65536 for write_bw\n"+
		"and read_bw, but 8192 for send_bw, as a SEND carries at most the device's 8192-byte MTU\n"+
		"(max_msg_sz); RDMA up to 1 GiB")
	fs.IntVar(&o.iters, "n", 1000, "iterations")
	fs.IntVar(&o.warmup, "w", 10, "warm-up round trips before the timed ones, not among their figures, as fabtests' -w\n"+
		"(latency tests; the first, with a peer the device has not met, is reported on a line of its\n"+
		"own, as the figures are: half a round trip for the ping-pongs; errors counts theirs too)")
	fs.Var((*secondsFlag)(&o.duration), "D", "run for this long instead of -n iterations: seconds as perftest (2), or a Go duration (1m30s)")
	fs.IntVar(&o.qps, "q", 1, "number of QPs, 1 to 64 (bandwidth tests)")
	fs.IntVar(&o.txDepth, "t", 256, "tx depth: WRs outstanding per QP, 1 to 4096 (bandwidth tests; perftest's default is 128)")
	fs.IntVar(&o.postList, "l", 64, "post list: WRs posted at once, with one doorbell, 1 to 4096 (bandwidth tests;\n"+
		"perftest's default is 1, a doorbell per WR)")
	fs.IntVar(&o.mtu, "mtu", 0, "path MTU, 576 to 65535 (0: 9001 on loopback, else 1500)")
	fs.IntVar(&o.paths, "paths", 4, "paths (UDP source ports) per device, 1 to 255")
	fs.DurationVar(&o.rxSpin, "rx-spin", 0, "how long the receive loop keeps reading without waiting after traffic (0: the default,\n"+
		"200us; negative: never)")
	fs.BoolVar(&o.noSparse, "no-sparse-copies", false, "no second copy, on another path, of packets sent while few are in flight after a loss")
	fs.BoolVar(&o.noOffload, "no-offload", false, "UDP GSO and GRO off: every datagram a packet of its own, as a capture needs")
	fs.BoolVar(&o.json, "json", false, "print one JSON object instead of the table (the client prints the result)")
	fs.BoolVar(&o.stats, "stats", false, "print the device, QP and path counters at the end")
	fs.StringVar(&o.metrics, "metrics", "", "serve counters for Prometheus on this address (HOST:PORT) while running")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "give up when a completion, or the exchange before or after the test, takes longer")
	fs.StringVar(&o.keyFile, "key-file", "", "encrypt with the 32-byte key in this file (or set SOFTEFA_KEY to 64 hex digits)")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of this process (Go pprof) to this file")
	fs.IntVar(&o.procs, "procs", -1, "GOMAXPROCS for this process; default 1 with --server or --connect (the process busy-polls\n"+
		"one device: a second thread per process only competes for the cores; docs/performance.md)\n"+
		"unless the GOMAXPROCS variable is set, and Go's own choice with --loopback; 0: Go's own choice")
	rest := args[1:]
	if isHelp(args[0]) {
		rest = []string{"-h"}
	}
	if err := parseFlags(fs, "softefa perf "+strings.Join(perfTests, "|")+" [flags]", rest); err != nil {
		return nil, err
	}
	set := setFlags(fs)
	lat := strings.HasSuffix(o.test, "_lat")
	send := strings.HasPrefix(o.test, "send")
	if !set["s"] {
		switch {
		case lat:
			o.size = 2
		case send:
			o.size = maxSendSize
		default:
			o.size = 65536
		}
	}
	if err := checkMode(set, o.server, o.loopback, o.connect); err != nil {
		return nil, err
	}
	if o.procs < -1 {
		return nil, fmt.Errorf("--procs %d: 0 (Go's own choice) or more", o.procs)
	}
	switch {
	case o.size < 1 || o.size > maxRDMASize:
		return nil, fmt.Errorf("-s %d: 1 byte to 1 GiB", o.size)
	case send && o.size > maxSendSize:
		return nil, fmt.Errorf("-s %d: SEND messages are at most the 8192-byte MTU", o.size)
	case o.iters < 1:
		return nil, fmt.Errorf("-n %d: iterations must be positive", o.iters)
	case o.warmup < 0 || o.warmup > maxWarmup:
		return nil, fmt.Errorf("-w %d: 0 to %d warm-up round trips", o.warmup, maxWarmup)
	case !lat && set["w"]:
		return nil, errors.New("-w: only the latency tests warm up")
	case set["D"] && o.duration <= 0:
		return nil, fmt.Errorf("-D %v: the duration must be positive", o.duration)
	case set["D"] && set["n"]:
		return nil, errors.New("-D and -n: a test runs for a time or for a count, give one")
	case o.qps < 1 || o.qps > maxQPs:
		return nil, fmt.Errorf("-q %d: 1 to %d QPs", o.qps, maxQPs)
	case lat && o.qps > 1:
		return nil, fmt.Errorf("-q %d: the latency tests use one QP", o.qps)
	case o.txDepth < 1 || o.txDepth > maxTxDepth:
		return nil, fmt.Errorf("-t %d: tx depth 1 to %d", o.txDepth, maxTxDepth)
	case lat && set["t"]:
		return nil, errors.New("-t: the latency tests keep one WR outstanding")
	case o.postList < 1 || o.postList > maxTxDepth:
		return nil, fmt.Errorf("-l %d: a post list of 1 to %d WRs", o.postList, maxTxDepth)
	case lat && set["l"]:
		return nil, errors.New("-l: the latency tests post one WR at a time")
	case o.mtu != 0 && (o.mtu < 576 || o.mtu > 65535):
		return nil, fmt.Errorf("--mtu %d: a path MTU is 576 to 65535 (0: the default)", o.mtu)
	case o.paths < 1 || o.paths > 255:
		return nil, fmt.Errorf("--paths %d: 1 to 255 paths", o.paths)
	case o.timeout <= 0:
		return nil, fmt.Errorf("--timeout %v: must be positive", o.timeout)
	case o.server && o.json:
		return nil, errors.New("--json: the client prints the result; a server prints none")
	}
	for _, a := range []struct{ flag, addr string }{{"--listen", o.listen}, {"--connect", o.connect}, {"--metrics", o.metrics}} {
		if a.addr == "" && a.flag != "--listen" {
			continue
		}
		if err := checkHostPort(a.flag, a.addr); err != nil {
			return nil, err
		}
	}
	if o.keyFile != "" {
		k, err := config.KeyFromFile(o.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--key-file: %w", err)
		}
		o.key = k
	} else {
		k, err := config.KeyFromEnvIfSet()
		if err != nil {
			return nil, err
		}
		o.key = k
	}
	return o, nil
}

func isHelp(s string) bool { return s == "-h" || s == "-help" || s == "--help" || s == "--h" }

func runPerf(args []string) error {
	o, err := parsePerf(args, os.Stdout)
	if err != nil {
		return err
	}
	_, env := os.LookupEnv("GOMAXPROCS")
	if n := perfProcs(o.procs, o.loopback, env); n > 0 {
		runtime.GOMAXPROCS(n) // (here, not in perf: the tests run perf in their own process)
		fmt.Fprintf(os.Stderr, "softefa perf: GOMAXPROCS %d (--procs; 0 leaves Go's choice)\n", n)
	}
	return perf(o)
}

func perf(o *perfOpts) error {
	m, err := listenMetrics(o.metrics) // at once: a busy port is refused before anything starts
	if err != nil {
		return err
	}
	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	defer m.stop()
	o.metricsSrv = m
	if o.loopback {
		ln, port, err := listenServer("127.0.0.1:0")
		if err != nil {
			return err
		}
		so := *o
		so.metricsSrv = nil // the client's device is the one measured
		o.connect = ln.Addr().String()
		return serveBeside(ln, func() error { return perfServe(&so, ln, port, false) }, func() error { return perfClient(o) })
	}
	if o.server {
		ln, port, err := listenServer(o.listen)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "softefa perf: %s server waiting for a client on %s\n", o.test, ln.Addr())
		return perfServe(o, ln, port, true)
	}
	return perfClient(o)
}

// perfProcs is the GOMAXPROCS perf sets (--procs), 0 for none: flag as given (0: none), or by
// default 1 for a server or client process, unless the environment sets GOMAXPROCS or both ends
// run in this process (--loopback), which then keep Go's own choice. A process that busy-polls
// one device has one thread of work to do at a time; with more, the device's receive loop runs
// beside the polling thread, and two such processes on two cores had four threads wanting two
// (docs/performance.md, "Threads per process").
func perfProcs(flag int, loopback, env bool) int {
	switch {
	case flag >= 0:
		return flag
	case loopback || env:
		return 0
	}
	return 1
}

// dialExchange connects to a server's exchange port within timeout.
func dialExchange(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", addr, err)
	}
	return c, nil
}

// exchangeErr names what a failed read or write of the exchange was waiting for; a deadline
// passing says which timeout it was.
func exchangeErr(what string, timeout time.Duration, err error) error {
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%s: nothing within --timeout %v", what, timeout)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// listenServer listens for clients on listen (--listen) and returns the UDP port of the server's
// device: the listener's port, as --listen says, unless listen asks for the kernel's choice
// (port 0, or --loopback). Then the device's port is the kernel's choice too, a port of its own
// apart from the TCP one: a UDP port of the listener's number may be another program's (a test
// run's, now and then), and an IPv4 client learns the device's endpoint from the GID in the
// hello. (Over IPv6 deviceAddr binds the listener's port whatever this says.)
func listenServer(listen string) (net.Listener, int, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, 0, err
	}
	if _, p, err := net.SplitHostPort(listen); err == nil {
		if n, err := strconv.ParseUint(p, 10, 16); err == nil && n == 0 {
			return ln, 0, nil
		}
	}
	return ln, ln.Addr().(*net.TCPAddr).Port, nil
}

// deviceAddr is the UDP endpoint of the device on c's side of an exchange: c's local address,
// which is concrete even when the listener's is unspecified (0.0.0.0, ::), with port. An IPv6
// GID is an address alone, and the devices it names share one port number (config.GIDFromAddr):
// on IPv6 both devices bind the port the client reached, the server's listener's.
func deviceAddr(c net.Conn, port int, server bool) string {
	la := c.LocalAddr().(*net.TCPAddr).AddrPort()
	ip := la.Addr().Unmap()
	switch {
	case ip.Is4():
	case server:
		port = int(la.Port())
	default:
		port = int(c.RemoteAddr().(*net.TCPAddr).AddrPort().Port())
	}
	return netip.AddrPortFrom(ip, uint16(port)).String()
}

// errSharedV6 is the refusal of two ends on one IPv6 address: their devices would have one GID
// (an IPv6 GID carries no port) and each would send to itself.
var errSharedV6 = errors.New("the two ends are on one IPv6 address: an IPv6 GID carries no port, so they need addresses of their own (on one host, use IPv4)")

// checkEnds refuses, before either end makes its device, an exchange between two ends on one
// IPv6 address (errSharedV6). The server checks too: a client from before the check would measure
// its own device.
func checkEnds(c net.Conn) error {
	la := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	ra := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	if la.Is6() && la == ra {
		return errSharedV6
	}
	return nil
}

// checkPeerGID refuses a peer whose GID is the local device's own (errSharedV6).
func checkPeerGID(own, peer verbs.GID) error {
	if own == peer {
		return fmt.Errorf("GID %v: %w", netip.AddrFrom16(peer), errSharedV6)
	}
	return nil
}

// clientFault is an exchange that failed on the client's account (silence, a bad hello): a
// server drops that client and waits for another.
type clientFault struct{ error }

func (e clientFault) Unwrap() error { return e.error }

func endpointFor(o *perfOpts, addr string, h *hello) (*endpoint, error) {
	depth := max(o.txDepth, 64)
	if h != nil { // the server keeps four times the client's tx depth of receives posted
		depth = min(4*max(h.Depth, 64), 4096)
	}
	size, qps := o.size, o.qps
	if h != nil {
		size, qps = h.Size, h.QPs
	}
	return newEndpoint(endpointConfig{addr: addr, typ: verbs.QPTDriver, qps: qps, bufSize: max(size, 8192),
		depth: depth, paths: o.paths, pathMTU: o.mtu, events: h != nil, key: o.key,
		rxSpin: o.rxSpin, noSparseCopies: o.noSparse, noOffload: o.noOffload})
}

func (e *endpoint) hello() hello {
	h := hello{GID: netip.AddrFrom16(e.dev.GID()).String(), RKey: e.mr.RKey(), Addr: e.mr.Addr()}
	for _, qp := range e.qps {
		h.QPNs = append(h.QPNs, qp.QPN())
	}
	return h
}

func parseGID(s string) (verbs.GID, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return verbs.GID{}, err
	}
	return verbs.GID(a.As16()), nil
}

// perfServe answers one client: it creates its device on the address the client reached,
// tells the client its QPs, and plays the passive side until the client is done. With retry, a
// client that says nothing within the timeout, or not a usable hello, is dropped and the
// server waits for another. Its device binds UDP port `port` (0: the kernel's choice;
// listenServer).
func perfServe(o *perfOpts, ln net.Listener, port int, retry bool) error {
	defer ln.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		err = perfServeConn(o, port, c)
		var cf clientFault
		if !retry || !errors.As(err, &cf) {
			return err
		}
		fmt.Fprintf(os.Stderr, "softefa perf: %v; waiting for another client\n", err)
	}
}

func perfServeConn(o *perfOpts, port int, c net.Conn) error {
	defer c.Close()
	who := c.RemoteAddr().String()
	_ = c.SetDeadline(time.Now().Add(o.timeout))
	r, w := json.NewDecoder(bufio.NewReader(c)), json.NewEncoder(c)
	var h hello
	if err := r.Decode(&h); err != nil {
		return clientFault{exchangeErr("server: reading the hello of client "+who, o.timeout, err)}
	}
	err := checkHello(&h)
	if err == nil && h.Test != o.test {
		err = fmt.Errorf("this server runs %s, not %s", o.test, h.Test)
	}
	if err == nil && h.Key != (o.key != nil) {
		err = keyMismatch(o.key != nil)
	}
	if err == nil {
		err = checkEnds(c)
	}
	if err != nil {
		_ = w.Encode(hello{Err: err.Error()})
		return clientFault{fmt.Errorf("server: client %s: %w", who, err)}
	}
	e, err := endpointFor(o, deviceAddr(c, port, true), &h)
	if err != nil {
		_ = w.Encode(hello{Err: err.Error()})
		return err
	}
	defer e.close()
	peer, err := parseGID(h.GID)
	if err == nil {
		err = e.connect(peer)
	}
	if err != nil {
		_ = w.Encode(hello{Err: err.Error()})
		return clientFault{fmt.Errorf("server: client %s: GID %q: %w", who, h.GID, err)}
	}
	runtime.GC() // the start-up's garbage collected before the client starts: see latency
	if err := w.Encode(e.hello()); err != nil {
		return clientFault{exchangeErr("server: sending the hello to client "+who, o.timeout, err)}
	}
	_ = c.SetDeadline(time.Time{}) // the test runs as long as the client says
	done := make(chan error, 1)
	go func() {
		var fin hello
		done <- r.Decode(&fin)
	}()
	fmt.Fprintf(os.Stderr, "softefa perf: serving %s (%d bytes, %d QPs) for %s\n", h.Test, h.Size, h.QPs, who)
	o.metricsSrv.serve(e)
	defer o.metricsSrv.stop()
	serr := e.servePassive(&h, done, o.timeout)
	if o.stats {
		printStats(o.out, e)
	}
	_ = c.SetDeadline(time.Now().Add(o.timeout))
	if serr != nil {
		_ = w.Encode(hello{Done: true, Err: serr.Error()})
		return fmt.Errorf("server: %w", serr)
	}
	return w.Encode(hello{Done: true})
}

// keyMismatch says which side of an exchange encrypts and which does not.
func keyMismatch(serverEncrypts bool) error {
	if serverEncrypts {
		return errors.New("the server encrypts (--key-file or SOFTEFA_KEY) and the client does not: give both the key")
	}
	return errors.New("the client encrypts (--key-file or SOFTEFA_KEY) and the server does not: give both the key")
}

// checkHello refuses a client's hello the server cannot serve, before making anything for it.
func checkHello(h *hello) error {
	switch {
	case !slices.Contains(perfTests, h.Test):
		return fmt.Errorf("unknown test %q", h.Test)
	case h.Size < 1 || h.Size > maxRDMASize || strings.HasPrefix(h.Test, "send") && h.Size > maxSendSize:
		return fmt.Errorf("size %d out of range for %s", h.Size, h.Test)
	case h.QPs < 1 || h.QPs > maxQPs || len(h.QPNs) != h.QPs:
		return fmt.Errorf("%d QPs with %d QP numbers (1 to %d)", h.QPs, len(h.QPNs), maxQPs)
	case h.Depth < 1 || h.Depth > maxTxDepth:
		return fmt.Errorf("tx depth %d (1 to %d)", h.Depth, maxTxDepth)
	}
	return nil
}

// passiveSpin is how long the server of a SEND test polls its CQ after a completion before it
// sleeps until the next completion event: while the client sends, the server answers from a busy
// poll, as perftest's does (its ACKs then ride on its answers, and its receives are posted again
// as fast as they are used); an idle server sleeps.
const passiveSpin = time.Millisecond

// servePassive does the server's part of h.Test until the client says it is done.
func (e *endpoint) servePassive(h *hello, done <-chan error, timeout time.Duration) error {
	switch h.Test {
	case "write_bw", "read_bw", "read_lat":
		return <-done // the client's RDMA needs nothing from the server's software
	}
	// SEND tests: keep receives posted; latency tests answer each message (write_lat with an
	// RDMA write with immediate, as softefa has no ordering promise to poll memory on).
	depth := min(4*h.Depth, 4096)
	for i, qp := range e.qps {
		for j := range depth {
			if err := e.recv(qp, uint64(i<<32|j), 0, h.Size); err != nil {
				return err
			}
		}
	}
	pong := h.Test == "send_lat" || h.Test == "write_lat"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var doneErr error
	finished := make(chan struct{})
	go func() { doneErr = <-done; cancel(); close(finished) }()
	if err := e.cq.ReqNotify(false); err != nil {
		return err
	}
	var last time.Time // the last completion
	for spins := 0; ; spins++ {
		n, err := e.cq.Poll(e.wc)
		if err != nil {
			return err
		}
		if n == 0 {
			if spins&63 != 63 {
				continue
			}
			if time.Since(last) < passiveSpin {
				runtime.Gosched()
				continue
			}
			if err := e.waitEvent(ctx); err != nil {
				<-finished
				return doneErr
			}
			continue
		}
		last = time.Now()
		wcs := e.wc[:n]
		for _, wc := range wcs {
			if wc.Status != verbs.WCSuccess {
				return fmt.Errorf("wr_id %d: %v (EFA status %d)", wc.WRID, wc.Status, wc.VendorErr)
			}
			if wc.Opcode != verbs.WCRecv && wc.Opcode != verbs.WCRecvRDMAWithImm {
				continue // our own pong's completion
			}
			i := int(wc.WRID >> 32)
			qp := e.qps[i]
			if err := e.recv(qp, wc.WRID, 0, h.Size); err != nil {
				return err
			}
			if !pong {
				continue
			}
			qpn := h.QPNs[i]
			err := e.post(qp, wc.WRID, qpn, func(x *verbs.QPEx) {
				if h.Test == "send_lat" {
					x.WRSend()
				} else {
					x.WRRDMAWriteImm(h.RKey, h.Addr, 0)
				}
				x.WRSetSGE(e.mr.LKey(), e.mr.Addr(), uint32(h.Size))
			})
			if err != nil {
				return err
			}
		}
	}
}

func perfClient(o *perfOpts) error {
	c, err := dialExchange(o.connect, o.timeout)
	if err != nil {
		return err
	}
	defer c.Close()
	// The exchange before and after the test is bounded by the timeout, the test itself by the
	// timeout per completion.
	_ = c.SetDeadline(time.Now().Add(o.timeout))
	if err := checkEnds(c); err != nil {
		return err
	}
	e, err := endpointFor(o, deviceAddr(c, 0, false), nil)
	if err != nil {
		return err
	}
	defer e.close()
	r, w := json.NewDecoder(bufio.NewReader(c)), json.NewEncoder(c)
	h := e.hello()
	h.Test, h.Size, h.Iters, h.QPs, h.Depth, h.Key = o.test, o.size, o.iters, o.qps, max(o.txDepth, 64), o.key != nil
	if err := w.Encode(h); err != nil {
		return exchangeErr("client: sending the hello to "+o.connect, o.timeout, err)
	}
	var sh hello
	if err := r.Decode(&sh); err != nil {
		return exchangeErr("client: reading the server's hello from "+o.connect, o.timeout, err)
	}
	if sh.Err != "" {
		return fmt.Errorf("server: %s", sh.Err)
	}
	if len(sh.QPNs) != o.qps {
		return fmt.Errorf("server %s: %d QP numbers for %d QPs", o.connect, len(sh.QPNs), o.qps)
	}
	peer, err := parseGID(sh.GID)
	if err != nil {
		return fmt.Errorf("server %s: GID %q: %w", o.connect, sh.GID, err)
	}
	if err := checkPeerGID(e.dev.GID(), peer); err != nil {
		return err
	}
	if err := e.connect(peer); err != nil {
		return err
	}
	_ = c.SetDeadline(time.Time{})
	o.metricsSrv.serve(e)
	defer o.metricsSrv.stop()
	res, runErr := e.runClient(o, &sh)
	_ = c.SetDeadline(time.Now().Add(o.timeout))
	_ = w.Encode(hello{Done: true})
	var fin hello
	if err := r.Decode(&fin); err == nil && fin.Err != "" && runErr == nil {
		runErr = fmt.Errorf("server: %s", fin.Err)
	}
	if res != nil {
		res.print(o)
		if o.stats {
			printStats(o.out, e)
		}
	}
	return runErr
}

// result is a test's outcome: completion times (bandwidth) or latencies.
type result struct {
	test    string
	size    int
	iters   int
	errors  int
	elapsed time.Duration
	peak    float64   // bytes/s over the best window
	lat     latencies // (latency tests)

	warmFirst time.Duration // the first warm-up round trip, as lat's samples (latency tests, -w)
}

func (e *endpoint) runClient(o *perfOpts, sh *hello) (*result, error) {
	if strings.HasSuffix(o.test, "_bw") {
		return e.bandwidth(o, sh)
	}
	return e.latency(o, sh)
}

// bandwidth keeps tx-depth WRs outstanding per QP until -n completions (or -D elapses).
func (e *endpoint) bandwidth(o *perfOpts, sh *hello) (*result, error) {
	res := &result{test: o.test, size: o.size}
	outstanding := make([]int, len(e.qps))
	var posted int
	start := time.Now()
	peak := newPeakMeter(max(o.iters/20, o.txDepth), o.txDepth*len(e.qps), start)
	lastProgress := start
	more := func() bool {
		if o.duration > 0 {
			return time.Since(start) < o.duration
		}
		return posted < o.iters
	}
	for more() || slices.ContainsFunc(outstanding, func(n int) bool { return n > 0 }) {
		postedAt := time.Now() // (one clock read for the round's posts)
		for i, qp := range e.qps {
			for outstanding[i] < o.txDepth && more() {
				// Up to a post list of WRs in one session: one doorbell, and the device's step
				// takes them together (small ones share datagrams).
				k := min(o.txDepth-outstanding[i], o.postList)
				if o.duration == 0 {
					k = min(k, o.iters-posted)
				}
				err := e.postN(qp, k, uint64(i), sh.QPNs[i], func(x *verbs.QPEx) {
					switch o.test {
					case "send_bw":
						x.WRSend()
					case "write_bw":
						x.WRRDMAWrite(sh.RKey, sh.Addr)
					case "read_bw":
						x.WRRDMARead(sh.RKey, sh.Addr)
					}
					x.WRSetSGE(e.mr.LKey(), e.mr.Addr(), uint32(o.size))
				})
				if err != nil {
					return res, err
				}
				outstanding[i] += k
				posted += k
				for range k {
					peak.posted(postedAt)
				}
			}
		}
		wcs, err := e.poll(o.timeout)
		now := time.Now()
		for _, wc := range wcs {
			outstanding[wc.WRID]--
			peak.add(now) // every completion, as every post is counted
			if wc.Status != verbs.WCSuccess {
				res.errors++
				continue
			}
			res.iters++
		}
		if err != nil {
			res.elapsed = time.Since(start)
			return res, err
		}
		if now.Sub(lastProgress) > time.Second {
			lastProgress = now
			el := now.Sub(start).Seconds()
			fmt.Fprintf(os.Stderr, "\r%s: %d iterations, %.2f Gb/s ", o.test, res.iters, float64(res.iters)*float64(o.size)*8/el/1e9)
		}
	}
	res.elapsed = time.Since(start)
	if res.elapsed > time.Second {
		fmt.Fprintln(os.Stderr)
	}
	res.peak = peak.rate(o.size)
	return res, nil
}

// latency runs -n round trips one at a time: SEND ping-pong, RDMA write-with-immediate
// ping-pong, or RDMA reads. Ping-pong latencies are half the round trip, as perftest reports.
func (e *endpoint) latency(o *perfOpts, sh *hello) (*result, error) {
	res := &result{test: o.test, size: o.size}
	qp := e.qps[0]
	pong := o.test != "read_lat"
	if pong {
		for j := range 4 {
			if err := e.recv(qp, uint64(1<<40|j), 0, o.size); err != nil {
				return res, err
			}
		}
	}
	// trip makes round trip i and returns half its time for the ping-pongs (our send's
	// completion and the answer's arrival), all of it for read_lat; it counts the completions
	// with an error status in res.errors.
	trip := func(i int) (time.Duration, error) {
		t0 := time.Now()
		err := e.post(qp, uint64(i), sh.QPNs[0], func(x *verbs.QPEx) {
			switch o.test {
			case "send_lat":
				x.WRSend()
			case "write_lat":
				x.WRRDMAWriteImm(sh.RKey, sh.Addr, uint32(i))
			case "read_lat":
				x.WRRDMARead(sh.RKey, sh.Addr)
			}
			x.WRSetSGE(e.mr.LKey(), e.mr.Addr(), uint32(o.size))
		})
		if err != nil {
			return 0, err
		}
		need := 1
		if pong {
			need = 2
		}
		for need > 0 {
			wcs, err := e.poll(o.timeout)
			for _, wc := range wcs {
				if wc.Status != verbs.WCSuccess {
					res.errors++
				}
				if wc.Opcode == verbs.WCRecv || wc.Opcode == verbs.WCRecvRDMAWithImm {
					if err := e.recv(qp, wc.WRID, 0, o.size); err != nil {
						return 0, err
					}
				}
				need--
			}
			if err != nil {
				return 0, err
			}
		}
		d := time.Since(t0)
		if pong {
			d /= 2
		}
		return d, nil
	}
	// Room for every sample kept, and the heap collected, before the clock starts: a slice
	// grown by append as samples come, and the start-up's garbage, each brought a collection
	// into the run, and with one processor the collector held the process up for 2 ms or more
	// (the peer's retransmission timer fired: the run's maximum).
	settle := func() {
		res.lat.reserve(o.iters, o.duration > 0)
		runtime.GC()
	}
	// The warm-up: the first round trip with a peer the device has not met pays for the first
	// contact (address validation) and for the code and memory the processes touch for the
	// first time, up to a millisecond or more on this machine kind (docs/performance.md); it is
	// reported, not timed with the rest. The collection comes before the last warm-up round
	// trip, not between it and the clock: a pause there would leave the server asleep
	// (passiveSpin) for the first timed one.
	for i := range o.warmup {
		if i == o.warmup-1 {
			settle()
		}
		d, err := trip(i)
		if err != nil {
			return res, err
		}
		if i == 0 {
			res.warmFirst = d
		}
	}
	if o.warmup == 0 {
		settle()
	} else if !o.json {
		fmt.Fprintf(os.Stderr, "softefa perf: warm-up of %d round trips (-w): the first took %.2f usec\n", o.warmup, float64(res.warmFirst)/1e3)
	}
	start := time.Now()
	more := func(i int) bool {
		if o.duration > 0 {
			return time.Since(start) < o.duration
		}
		return i < o.iters
	}
	for i := 0; more(i); i++ {
		d, err := trip(i)
		if err != nil {
			res.elapsed = time.Since(start)
			return res, err
		}
		res.lat.add(d)
		res.iters++
	}
	res.elapsed = time.Since(start)
	return res, nil
}

func (r *result) print(o *perfOpts) {
	w := o.out
	if strings.HasSuffix(r.test, "_bw") {
		bytes := uint64(r.iters) * uint64(r.size)
		avg := float64(bytes) / r.elapsed.Seconds()
		if o.json {
			_ = json.NewEncoder(w).Encode(map[string]any{
				"test": r.test, "size": r.size, "iterations": r.iters, "bytes": bytes, "errors": r.errors,
				"bw_gbps": avg * 8 / 1e9, "bw_peak_gbps": r.peak * 8 / 1e9,
				"msg_rate_mpps": float64(r.iters) / r.elapsed.Seconds() / 1e6,
			})
			return
		}
		line := strings.Repeat("-", 87)
		fmt.Fprintln(w, line)
		fmt.Fprintf(w, " %-10s %-14s %-18s %-20s %s\n", "#bytes", "#iterations", "BW peak[Gb/sec]", "BW average[Gb/sec]", "MsgRate[Mpps]")
		fmt.Fprintf(w, " %-10d %-14d %-18.2f %-20.2f %.6f\n", r.size, r.iters, r.peak*8/1e9, avg*8/1e9,
			float64(r.iters)/r.elapsed.Seconds()/1e6)
		fmt.Fprintln(w, line)
		return
	}
	s := r.lat.summary()
	if o.json {
		_ = json.NewEncoder(w).Encode(map[string]any{
			"test": r.test, "size": r.size, "iterations": r.iters, "errors": r.errors,
			"p50_us": s.p50, "p99_us": s.p99, "p999_us": s.p999, "avg_us": s.avg, "min_us": s.min, "max_us": s.max,
			"stdev_us": s.stdev, "warmup": o.warmup, "warmup_first_us": float64(r.warmFirst) / 1e3,
		})
		return
	}
	line := strings.Repeat("-", 128)
	fmt.Fprintln(w, line)
	fmt.Fprintf(w, " %-7s %-12s %-12s %-12s %-16s %-12s %-14s %-22s %s\n", "#bytes", "#iterations", "t_min[usec]",
		"t_max[usec]", "t_typical[usec]", "t_avg[usec]", "t_stdev[usec]", "99% percentile[usec]", "99.9% percentile[usec]")
	fmt.Fprintf(w, " %-7d %-12d %-12.2f %-12.2f %-16.2f %-12.2f %-14.2f %-22.2f %.2f\n", r.size, r.iters, s.min, s.max,
		s.p50, s.avg, s.stdev, s.p99, s.p999)
	fmt.Fprintln(w, line)
}

func parseAddr(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	ua, err := net.ResolveUDPAddr("udp", s)
	if err != nil {
		return netip.AddrPort{}, err
	}
	ap := ua.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}
