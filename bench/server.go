package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The server end of every run lives either in this process, as goroutines beside the client
// (mode 1proc), or in a process of its own (mode 2proc): the bench binary run again with the
// hidden flag --serve=TRANSPORT/KIND/SIZE, which is how softefa is deployed (one device per
// process). The child writes one JSON line on stdout, its hello (address and QP number), and
// then answers each request it reads from stdin, one JSON line each, with one line; it stops
// when its stdin closes. Its stderr is the bench's. Either way the client sees a server.

// A mode is where server ends run.
type mode struct {
	name  string
	spawn func(j job) (server, error)
	procs int // GOMAXPROCS of both processes during a run (0: Go's own choice)
}

const (
	oneProc    = "1proc"
	twoProc    = "2proc"
	twoProcOne = "2proc-1p" // 2proc with GOMAXPROCS=1 in both processes, for every transport
)

var modes = []mode{
	{oneProc, func(j job) (server, error) {
		t, err := transportNamed(j.transport)
		if err != nil {
			return nil, err
		}
		return t.serve(j)
	}, 0},
	{twoProc, func(j job) (server, error) { return startChild(j, 0) }, 0},
	{twoProcOne, func(j job) (server, error) { return startChild(j, 1) }, 1},
}

// useProcs sets this process's GOMAXPROCS for a run in md and returns what puts it back.
func (md mode) useProcs() func() {
	if md.procs == 0 {
		return func() {}
	}
	prev := runtime.GOMAXPROCS(md.procs)
	return func() { runtime.GOMAXPROCS(prev) }
}

// job is what one server end serves.
type job struct {
	transport string
	kind      string // kindStream, kindPingpong or kindPeers
	size      int    // message size
}

const (
	kindStream   = "stream"   // count size-byte messages until Finish says how many were sent
	kindPingpong = "pingpong" // answer every size-byte message with one of the same size
	kindPeers    = "peers"    // softefa only: one QP that answers many peers (peers.go)
)

func (j job) String() string { return fmt.Sprintf("%s/%s/%d", j.transport, j.kind, j.size) }

func parseJob(s string) (job, error) {
	f := strings.Split(s, "/")
	if len(f) != 3 {
		return job{}, fmt.Errorf("--serve %q: want TRANSPORT/KIND/SIZE", s)
	}
	n, err := strconv.Atoi(f[2])
	if err != nil || n < 1 {
		return job{}, fmt.Errorf("--serve %q: size %q", s, f[2])
	}
	switch f[1] {
	case kindStream, kindPingpong, kindPeers:
	default:
		return job{}, fmt.Errorf("--serve %q: kind %q", s, f[1])
	}
	return job{transport: f[0], kind: f[1], size: n}, nil
}

// A server is the receiving end of one run, started for a job.
type server interface {
	// Addr is where the client sends: the server's UDP or TCP address.
	Addr() netip.AddrPort
	// QPN is the server's QP number (softefa), 0 for the others.
	QPN() uint32
	// Peer tells a softefa server where its answers go: the client's address as the server
	// sees it (through a fabric, the fabric's address for the client) and QP number. The
	// server starts serving then. Other servers ignore it.
	Peer(addr netip.AddrPort, qpn uint32) error
	// Finish says that the client is done, having sent sent messages (stream), and returns
	// what the server received; the server stops serving.
	Finish(sent int64) (served, error)
	// Close releases the server; it returns the error that ended the server early, if any.
	Close() error
}

// served is what a server reports when it finishes.
type served struct {
	Msgs int64 `json:"msgs"` // messages received (bytes, for byte streams)
	End  int64 `json:"end"`  // wall-clock time of the last arrival, Unix ns: comparable across processes
	// The server device's RetransPkts, SpuriousRetrans and RetransTimeoutEvents (softefa).
	Retrans  uint64 `json:"retrans,omitempty"`
	Spurious uint64 `json:"spurious,omitempty"`
	Timeouts uint64 `json:"timeouts,omitempty"`
}

// msg is one line of the protocol between the bench and a child: the child's hello, a request
// (Op) or its reply.
type msg struct {
	Op     string         `json:"op,omitempty"`   // opPeer, opFinish, opStats
	Addr   netip.AddrPort `json:"addr,omitzero"`  // hello: the server's; opPeer: the client's
	QPN    uint32         `json:"qpn,omitempty"`  // hello: the server's; opPeer: the client's
	Sent   int64          `json:"sent,omitempty"` // opFinish
	GC     bool           `json:"gc,omitempty"`   // opStats: with the heap after a GC
	Served *served        `json:"served,omitempty"`
	Stats  *rxStats       `json:"stats,omitempty"`
	Err    string         `json:"err,omitempty"`
}

const (
	opPeer   = "peer"
	opFinish = "finish"
	opStats  = "stats" // a peers receiver's heap, CPU and counters (peers.go)
)

// serveChild is the child's side (--serve): it starts the server for spec, says hello on out
// and answers the requests read from in until in closes.
func serveChild(spec string, in io.Reader, out io.Writer) error {
	enc, dec := json.NewEncoder(out), json.NewDecoder(in)
	j, err := parseJob(spec)
	var s server
	if err == nil {
		var t transport
		if t, err = transportNamed(j.transport); err == nil {
			s, err = t.serve(j)
		}
	}
	if err != nil {
		enc.Encode(msg{Err: err.Error()})
		return err
	}
	if err := enc.Encode(msg{Addr: s.Addr(), QPN: s.QPN()}); err != nil {
		s.Close()
		return err
	}
	for {
		var req, rep msg
		if err := dec.Decode(&req); err != nil {
			cerr := s.Close()
			if errors.Is(err, io.EOF) {
				return cerr
			}
			return err
		}
		switch req.Op {
		case opPeer:
			err = s.Peer(req.Addr, req.QPN)
		case opFinish:
			var r served
			r, err = s.Finish(req.Sent)
			rep.Served = &r
		case opStats:
			st, ok := s.(statser)
			if !ok {
				err = fmt.Errorf("%s has no stats", spec)
				break
			}
			var r rxStats
			r, err = st.Stats(req.GC)
			rep.Stats = &r
		default:
			err = fmt.Errorf("unknown request %q", req.Op)
		}
		if err != nil {
			rep.Err = err.Error()
		}
		if err := enc.Encode(rep); err != nil {
			s.Close()
			return err
		}
	}
}

// child is a server in a child process, driven through its stdin and stdout.
type child struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	enc  *json.Encoder
	dec  *json.Decoder
	addr netip.AddrPort
	qpn  uint32

	closeOnce sync.Once
	closeErr  error
}

// childTimeout bounds every exchange with a child: the server's own waits are bounded by
// ioTimeout, so a child that takes longer is stuck, and is killed.
const childTimeout = 3 * ioTimeout

// startChild runs the bench binary with --serve for j (with GOMAXPROCS procs, unless 0) and
// reads its hello.
func startChild(j job, procs int) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	args := []string{"--serve=" + j.String()}
	if showCounters {
		args = append(args, "--counters")
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = os.Stderr
	if procs > 0 {
		cmd.Env = append(os.Environ(), fmt.Sprintf("GOMAXPROCS=%d", procs))
	}
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, in: in, enc: json.NewEncoder(in), dec: json.NewDecoder(out)}
	var hello msg
	if err := c.read(&hello); err != nil {
		c.Close()
		return nil, fmt.Errorf("server %s: %w", j, err)
	}
	c.addr, c.qpn = hello.Addr, hello.QPN
	return c, nil
}

// read decodes the child's next line, killing the child if none comes within childTimeout.
func (c *child) read(m *msg) error {
	t := time.AfterFunc(childTimeout, func() { c.cmd.Process.Kill() })
	defer t.Stop()
	if err := c.dec.Decode(m); err != nil {
		return fmt.Errorf("child %d: %w", c.cmd.Process.Pid, err)
	}
	if m.Err != "" {
		return errors.New(m.Err)
	}
	return nil
}

func (c *child) call(req msg) (msg, error) {
	var rep msg
	if err := c.enc.Encode(req); err != nil {
		return rep, err
	}
	err := c.read(&rep)
	return rep, err
}

func (c *child) Addr() netip.AddrPort { return c.addr }
func (c *child) QPN() uint32          { return c.qpn }

func (c *child) Peer(addr netip.AddrPort, qpn uint32) error {
	_, err := c.call(msg{Op: opPeer, Addr: addr, QPN: qpn})
	return err
}

func (c *child) Finish(sent int64) (served, error) {
	rep, err := c.call(msg{Op: opFinish, Sent: sent})
	if rep.Served == nil {
		return served{}, err
	}
	return *rep.Served, err
}

func (c *child) Stats(gc bool) (rxStats, error) {
	rep, err := c.call(msg{Op: opStats, GC: gc})
	if rep.Stats == nil {
		return rxStats{}, err
	}
	return *rep.Stats, err
}

// Close closes the child's stdin, which ends it, and waits for it (killing it after
// childTimeout).
func (c *child) Close() error {
	c.closeOnce.Do(func() {
		c.in.Close()
		t := time.AfterFunc(childTimeout, func() { c.cmd.Process.Kill() })
		defer t.Stop()
		if err := c.cmd.Wait(); err != nil {
			c.closeErr = fmt.Errorf("server child %d: %w", c.cmd.Process.Pid, err)
		}
	})
	return c.closeErr
}

// closeServer closes s after a run and joins its error to the run's.
func closeServer(s server, err error) error {
	cerr := s.Close()
	switch {
	case err == nil:
		return cerr
	case cerr != nil:
		return fmt.Errorf("%w (server: %v)", err, cerr)
	}
	return err
}
