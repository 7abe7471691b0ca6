package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/softefa/softefa/verbs"
)

// softefa pingpong: rdma-core's ibv_srd_pingpong / ibv_ud_pingpong. The client sends a
// message, the server checks it and sends one back, the client checks that; -n times. Each
// message is a pattern derived from its iteration, so a byte out of place is caught.

type pingOpts struct {
	server, loopback, ud bool
	listen, connect      string
	size, iters          int
	timeout              time.Duration
	out                  io.Writer
}

func parsePingpong(args []string, out io.Writer) (*pingOpts, error) {
	o := &pingOpts{out: out}
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	fs.BoolVar(&o.server, "server", false, "wait for a client (on --listen)")
	fs.BoolVar(&o.loopback, "loopback", false, "run both sides in this process over UDP on 127.0.0.1")
	fs.BoolVar(&o.ud, "ud", false, "UD QPs instead of SRD (a server takes the client's choice)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:18516", "server: the TCP address for the exchange and the device's UDP port (an unspecified\n"+
		"host, 0.0.0.0 or ::, binds the device on the address each client reached; with port 0 the\n"+
		"kernel chooses a UDP port for the device apart from the TCP one, on IPv4: over IPv6 both\n"+
		"devices bind the listener's port, as an IPv6 GID carries none)")
	fs.StringVar(&o.connect, "connect", "", "client: the server's address")
	fs.IntVar(&o.size, "s", 4096, "message size, 1 to 8192 bytes (a server takes the client's)")
	fs.IntVar(&o.iters, "n", 1000, "iterations (a server takes the client's)")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "give up when a message, or the exchange before the first, takes longer")
	if err := parseFlags(fs, "softefa pingpong --server|--connect ADDR|--loopback [flags]", args); err != nil {
		return nil, err
	}
	if err := checkMode(setFlags(fs), o.server, o.loopback, o.connect); err != nil {
		return nil, err
	}
	switch {
	case o.size < 1 || o.size > maxSendSize:
		return nil, fmt.Errorf("-s %d: 1 to 8192 bytes", o.size)
	case o.iters < 1:
		return nil, fmt.Errorf("-n %d: iterations must be positive", o.iters)
	case o.timeout <= 0:
		return nil, fmt.Errorf("--timeout %v: must be positive", o.timeout)
	}
	if err := checkHostPort("--listen", o.listen); err != nil {
		return nil, err
	}
	if o.connect != "" {
		if err := checkHostPort("--connect", o.connect); err != nil {
			return nil, err
		}
	}
	return o, nil
}

func runPingpong(args []string) error {
	o, err := parsePingpong(args, os.Stdout)
	if err != nil {
		return err
	}
	return pingpong(o)
}

func pingpong(o *pingOpts) error {
	if o.loopback {
		ln, port, err := listenServer("127.0.0.1:0")
		if err != nil {
			return err
		}
		return serveBeside(ln, func() error { return pingServe(o, ln, port, false) }, func() error { return pingClient(o, ln.Addr().String()) })
	}
	if o.server {
		ln, port, err := listenServer(o.listen)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "softefa pingpong: server waiting for a client on %s\n", ln.Addr())
		return pingServe(o, ln, port, true)
	}
	return pingClient(o, o.connect)
}

// pingServe answers one client, its device on UDP port `port` (0: the kernel's choice;
// listenServer); with retry, a client that fails the exchange (silent past the timeout, or not a
// pingpong client) is dropped and the server waits for another.
func pingServe(o *pingOpts, ln net.Listener, port int, retry bool) error {
	defer ln.Close()
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		err = pingSide(o, c, deviceAddr(c, port, true), false)
		var cf clientFault
		if !retry || !errors.As(err, &cf) {
			return err
		}
		fmt.Fprintf(os.Stderr, "softefa pingpong: %v; waiting for another client\n", err)
	}
}

func pingClient(o *pingOpts, addr string) error {
	c, err := dialExchange(addr, o.timeout)
	if err != nil {
		return err
	}
	if err := checkEnds(c); err != nil {
		c.Close()
		return err
	}
	return pingSide(o, c, deviceAddr(c, 0, false), true)
}

// pingSide runs the client or the server over the exchange connection c, with the device on
// local; it closes c.
func pingSide(o *pingOpts, c net.Conn, local string, client bool) error {
	defer c.Close()
	peerName := "server " + c.RemoteAddr().String()
	if !client {
		peerName = "client " + c.RemoteAddr().String()
	}
	fault := func(what string, err error) error {
		err = exchangeErr(what+" "+peerName, o.timeout, err)
		if client {
			return err
		}
		return clientFault{err}
	}
	_ = c.SetDeadline(time.Now().Add(o.timeout)) // the exchange; each message then has the timeout
	enc, dec := json.NewEncoder(c), json.NewDecoder(bufio.NewReader(c))
	var peer hello
	if !client { // the server takes the client's size, count and QP type
		if err := dec.Decode(&peer); err != nil {
			return fault("reading the hello of", err)
		}
		so := *o
		o = &so
		o.size, o.iters, o.ud = peer.Size, peer.Iters, peer.Test == "ud"
		if peer.Test != "srd" && peer.Test != "ud" || o.size < 1 || o.size > maxSendSize || o.iters < 1 || len(peer.QPNs) != 1 {
			err := fmt.Errorf("not a pingpong client's hello (%q, %d bytes, %d iterations, %d QPs)",
				peer.Test, peer.Size, peer.Iters, len(peer.QPNs))
			_ = enc.Encode(hello{Err: err.Error()})
			return fault("the hello of", err)
		}
		if err := checkEnds(c); err != nil {
			_ = enc.Encode(hello{Err: err.Error()})
			return fault("the hello of", err)
		}
	}
	typ := verbs.QPTDriver
	grh := 0
	if o.ud {
		typ, grh = verbs.QPTUD, 40
	}
	e, err := newEndpoint(endpointConfig{addr: local, typ: typ, qps: 1, bufSize: 2*o.size + grh, depth: 16, paths: 4, pathMTU: 1500})
	if err != nil {
		if !client {
			_ = enc.Encode(hello{Err: err.Error()})
		}
		return err
	}
	defer e.close()
	h := e.hello()
	if client {
		h.Test, h.Size, h.Iters = "srd", o.size, o.iters
		if o.ud {
			h.Test = "ud"
		}
	}
	if err := enc.Encode(h); err != nil {
		return fault("sending the hello to", err)
	}
	if client {
		if err := dec.Decode(&peer); err != nil {
			return fault("reading the hello of", err)
		}
		if peer.Err != "" {
			return fmt.Errorf("server: %s", peer.Err)
		}
		if len(peer.QPNs) != 1 {
			return fault("the hello of", fmt.Errorf("%d QP numbers, not 1", len(peer.QPNs)))
		}
	}
	gid, err := parseGID(peer.GID)
	if err == nil && client {
		err = checkPeerGID(e.dev.GID(), gid)
	}
	if err == nil {
		err = e.connect(gid)
	}
	if err != nil {
		return fault("the GID of", err)
	}
	qp, qpn := e.qps[0], peer.QPNs[0]
	// The receive buffer is the upper half (with room for a UD GRH in front); sends come from the
	// lower half.
	rxOff := o.size
	if err := e.recv(qp, 1, rxOff, o.size+grh); err != nil {
		return err
	}
	// Both sides have their receive posted before either sends.
	if err := enc.Encode(hello{Done: true}); err != nil {
		return fault("sending ready to", err)
	}
	if err := dec.Decode(&peer); err != nil {
		return fault("waiting for ready from", err)
	}
	_ = c.SetDeadline(time.Time{})
	start := time.Now()
	for i := range o.iters {
		if client {
			if err := e.ping(qp, qpn, i, o); err != nil {
				return fmt.Errorf("iteration %d: %w", i, err)
			}
		}
		if err := e.pong(qp, i, rxOff, grh, o); err != nil {
			return fmt.Errorf("iteration %d: %w", i, err)
		}
		if !client {
			if err := e.ping(qp, qpn, i, o); err != nil {
				return fmt.Errorf("iteration %d: %w", i, err)
			}
		}
	}
	el := time.Since(start)
	if client {
		bytes := 2 * int64(o.size) * int64(o.iters)
		fmt.Fprintf(o.out, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, el.Seconds(), float64(bytes)*8/el.Seconds()/1e6)
		fmt.Fprintf(o.out, "%d iters in %.2f seconds = %.2f usec/iter\n", o.iters, el.Seconds(),
			float64(el.Microseconds())/float64(o.iters))
		fmt.Fprintf(o.out, "%d messages checked, 0 errors\n", 2*o.iters)
	}
	return nil
}

// ping sends message i and waits for its completion.
func (e *endpoint) ping(qp *verbs.QP, qpn uint32, i int, o *pingOpts) error {
	fillPing(e.buf[:o.size], i)
	if err := e.post(qp, 2, qpn, func(x *verbs.QPEx) {
		x.WRSendImm(uint32(i))
		x.WRSetSGE(e.mr.LKey(), e.mr.Addr(), uint32(o.size))
	}); err != nil {
		return err
	}
	return e.await(verbs.WCSend, o.timeout, nil)
}

// pong waits for message i, checks it and posts the next receive.
func (e *endpoint) pong(qp *verbs.QP, i, rxOff, grh int, o *pingOpts) error {
	return e.await(verbs.WCRecv, o.timeout, func(wc verbs.WC) error {
		got := e.buf[rxOff+grh : rxOff+grh+o.size]
		if int(wc.ByteLen) != o.size+grh || wc.ImmData != uint32(i) || !checkPing(got, i) {
			return fmt.Errorf("message %d: %d bytes, immediate %d, data ok %v", i, wc.ByteLen, wc.ImmData, checkPing(got, i))
		}
		return e.recv(qp, 1, rxOff, o.size+grh)
	})
}

// await waits for one completion of opcode op (others of the other kind may come first and are
// kept for the next call).
func (e *endpoint) await(op verbs.WCOpcode, timeout time.Duration, check func(verbs.WC) error) error {
	for {
		if i := indexOp(e.pending, op); i >= 0 {
			wc := e.pending[i]
			e.pending = append(e.pending[:i], e.pending[i+1:]...)
			if check != nil {
				return check(wc)
			}
			return nil
		}
		wcs, err := e.poll(timeout)
		if err != nil {
			return err
		}
		e.pending = append(e.pending, wcs...)
	}
}

func indexOp(wcs []verbs.WC, op verbs.WCOpcode) int {
	for i, wc := range wcs {
		if wc.Opcode == op {
			return i
		}
	}
	return -1
}

func fillPing(b []byte, i int) {
	for j := range b {
		b[j] = byte(i*31 + j*7)
	}
}

func checkPing(b []byte, i int) bool {
	for j := range b {
		if b[j] != byte(i*31+j*7) {
			return false
		}
	}
	return true
}
