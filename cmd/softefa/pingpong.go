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
	fs.SetOutput(io.Discard)
	fs.BoolVar(&o.server, "server", false, "wait for a client (on --listen)")
	fs.BoolVar(&o.loopback, "loopback", false, "run both sides in this process over UDP on 127.0.0.1")
	fs.BoolVar(&o.ud, "ud", false, "UD QPs instead of SRD")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:18516", "server: device UDP address and exchange TCP address")
	fs.StringVar(&o.connect, "connect", "", "client: the server's address")
	fs.IntVar(&o.size, "s", 4096, "message size")
	fs.IntVar(&o.iters, "n", 1000, "iterations")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "give up when a message takes longer")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case o.size < 1 || o.size > 8192:
		return nil, fmt.Errorf("-s %d: 1 to 8192 bytes", o.size)
	case o.iters < 1:
		return nil, errors.New("-n must be positive")
	case !o.server && !o.loopback && o.connect == "":
		return nil, errors.New("give --server, --connect ADDR or --loopback")
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
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		errc := make(chan error, 1)
		go func() { errc <- pingSide(o, ln, "") }()
		cerr := pingSide(o, nil, ln.Addr().String())
		return errors.Join(cerr, <-errc)
	}
	if o.server {
		ln, err := net.Listen("tcp", o.listen)
		if err != nil {
			return err
		}
		return pingSide(o, ln, "")
	}
	return pingSide(o, nil, o.connect)
}

// pingSide runs the server (ln set) or the client (connect set).
func pingSide(o *pingOpts, ln net.Listener, connect string) error {
	var c net.Conn
	var err error
	local := "127.0.0.1:0"
	if ln != nil {
		defer ln.Close()
		local = ln.Addr().String()
		c, err = ln.Accept()
	} else {
		c, err = net.Dial("tcp", connect)
		if la, ok := c.(*net.TCPConn); ok && err == nil {
			local = net.JoinHostPort(la.LocalAddr().(*net.TCPAddr).IP.String(), "0")
		}
	}
	if err != nil {
		return err
	}
	defer c.Close()
	typ := verbs.QPTDriver
	grh := 0
	if o.ud {
		typ, grh = verbs.QPTUD, 40
	}
	e, err := newEndpoint(endpointConfig{addr: local, typ: typ, qps: 1, bufSize: 2*o.size + grh, depth: 16, paths: 4, pathMTU: 1500})
	if err != nil {
		return err
	}
	defer e.close()
	enc, dec := json.NewEncoder(c), json.NewDecoder(bufio.NewReader(c))
	if err := enc.Encode(e.hello()); err != nil {
		return err
	}
	var peer hello
	if err := dec.Decode(&peer); err != nil {
		return err
	}
	gid, err := parseGID(peer.GID)
	if err != nil {
		return err
	}
	if err := e.connect(gid); err != nil {
		return err
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
		return err
	}
	if err := dec.Decode(&peer); err != nil {
		return err
	}
	client := ln == nil
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
