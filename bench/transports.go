package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/softefa/softefa/link"
	"github.com/xtaci/kcp-go/v5"
)

// A transport moves messages from a client to a server on loopback, possibly through a fabric.
type transport interface {
	name() string
	// stream sends size-byte messages for d as fast as the transport allows and reports how many
	// the server received and how long that took (first send to last arrival).
	stream(size int, d time.Duration, via router) (streamResult, error)
	// pingpong sends n size-byte messages one at a time, each echoed back, and returns the
	// round-trip times.
	pingpong(size, n int, via router) ([]time.Duration, error)
}

type streamResult struct {
	msgs    int64
	elapsed time.Duration
	lost    int64 // messages sent and not received (only unreliable transports lose any)
}

// router returns where a client should send to reach server: server itself, or a fabric's
// front address, and a function that stops the fabric. flags are extra `softefa fabric` flags
// (a direct route has no use for them).
type router func(server netip.AddrPort, flags ...string) (netip.AddrPort, func() error, error)

func direct(server netip.AddrPort, _ ...string) (netip.AddrPort, func() error, error) {
	return server, func() error { return nil }, nil
}

var loopback = netip.MustParseAddrPort("127.0.0.1:0")

const ioTimeout = 20 * time.Second

var errStalled = errors.New("no progress within 20 s")

// ---- raw UDP: the ceiling ----

// rawUDP sends with sendmmsg and receives with recvmmsg through softefa's link package, with
// GSO and GRO unless noOffload (then every message is one datagram through the kernel's
// per-packet path). It is unreliable: what the receiver counts is what arrived.
type rawUDP struct{ noOffload bool }

func (u rawUDP) name() string {
	if u.noOffload {
		return "udp-1pkt"
	}
	return "udp"
}

func (u rawUDP) listen() (*link.UDP, error) {
	if u.noOffload {
		os.Setenv("SOFTEFA_NO_OFFLOAD", "1")
		defer os.Unsetenv("SOFTEFA_NO_OFFLOAD")
	}
	return link.ListenUDP(loopback, 1)
}

func (u rawUDP) stream(size int, d time.Duration, via router) (streamResult, error) {
	var res streamResult
	srv, err := u.listen()
	if err != nil {
		return res, err
	}
	defer srv.Close()
	to, stop, err := via(srv.LocalAddr())
	if err != nil {
		return res, err
	}
	defer stop()
	cl, err := u.listen()
	if err != nil {
		return res, err
	}
	defer cl.Close()

	var got atomic.Int64
	var lastArrival atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		pkts := make([]link.Packet, 64)
		for i := range pkts {
			pkts[i].Buf = make([]byte, 65536)
		}
		for {
			n, err := srv.Receive(pkts)
			if err != nil {
				return
			}
			var k int64
			for _, p := range pkts[:n] {
				if p.N == size {
					k++
				}
			}
			got.Add(k)
			lastArrival.Store(time.Now().UnixNano())
		}
	}()
	pkts := make([]link.Packet, 64)
	payload := make([]byte, size)
	for i := range pkts {
		pkts[i] = link.Packet{Buf: payload, N: size, Addr: to}
	}
	var sent int64
	start := time.Now()
	for time.Since(start) < d {
		if err := cl.Send(pkts); err != nil {
			return res, err
		}
		sent += int64(len(pkts))
	}
	sendEnd := time.Now()
	// Whatever is still in flight arrives within a few milliseconds.
	for prev := int64(-1); got.Load() != prev && got.Load() < sent; {
		prev = got.Load()
		time.Sleep(20 * time.Millisecond)
	}
	srv.Close()
	<-done
	res.msgs = got.Load()
	res.lost = sent - res.msgs
	res.elapsed = max(sendEnd.Sub(start), time.Duration(lastArrival.Load()-start.UnixNano()))
	return res, nil
}

func (u rawUDP) pingpong(size, n int, via router) ([]time.Duration, error) {
	srv, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(loopback))
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 65536)
		for {
			k, a, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			srv.WriteToUDPAddrPort(buf[:k], a)
		}
	}()
	to, stop, err := via(srv.LocalAddr().(*net.UDPAddr).AddrPort())
	if err != nil {
		return nil, err
	}
	defer stop()
	cl, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	msg, buf := make([]byte, size), make([]byte, 65536)
	rtts := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := cl.Write(msg); err != nil {
			return nil, err
		}
		cl.SetReadDeadline(t0.Add(time.Second))
		if _, err := cl.Read(buf); err != nil {
			return nil, fmt.Errorf("udp ping-pong: %w (raw UDP does not recover losses)", err)
		}
		rtts = append(rtts, time.Since(t0))
	}
	return rtts, nil
}

// ---- byte streams: TCP, quic-go, kcp-go ----

// streamPair is a connected client and server end of some byte-stream transport.
type streamPair struct {
	client io.Writer // the sending end
	server io.Reader
	close  func() error
}

// streamOver measures a byte stream: the client writes size-byte messages of zeros through a
// 64 KiB buffer (as a careful application batches), then one 0xff byte that marks the end; the
// server reads until it sees it.
func streamOver(p *streamPair, size int, d time.Duration) (streamResult, error) {
	var res streamResult
	type rx struct {
		n   int64
		end time.Time
		err error
	}
	rxc := make(chan rx, 1)
	go func() {
		buf := make([]byte, 64<<10)
		var n int64
		for {
			k, err := p.server.Read(buf)
			if i := bytes.IndexByte(buf[:k], 0xff); i >= 0 {
				rxc <- rx{n: n + int64(i), end: time.Now()}
				return
			}
			n += int64(k)
			if err != nil {
				rxc <- rx{n: n, end: time.Now(), err: err}
				return
			}
		}
	}()
	w := bufio.NewWriterSize(p.client, 64<<10)
	msg := make([]byte, size)
	var sent int64
	start := time.Now()
	for time.Since(start) < d {
		for range 64 {
			if _, err := w.Write(msg); err != nil {
				return res, err
			}
		}
		sent += 64 * int64(size)
	}
	if err := w.WriteByte(0xff); err != nil {
		return res, err
	}
	if err := w.Flush(); err != nil {
		return res, err
	}
	var r rx
	select {
	case r = <-rxc:
	case <-time.After(ioTimeout):
		return res, errStalled
	}
	if r.err != nil {
		return res, r.err
	}
	if r.n != sent {
		return res, fmt.Errorf("%d bytes sent, %d received", sent, r.n)
	}
	res.msgs, res.elapsed = r.n/int64(size), r.end.Sub(start)
	return res, nil
}

// pingpongOver echoes size-byte messages over a byte stream.
func pingpongOver(p *streamPair, echo io.ReadWriter, size, n int) ([]time.Duration, error) {
	go func() {
		buf := make([]byte, size)
		for {
			if _, err := io.ReadFull(echo, buf); err != nil {
				return
			}
			if _, err := echo.Write(buf); err != nil {
				return
			}
		}
	}()
	msg, buf := make([]byte, size), make([]byte, size)
	rtts := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := p.client.Write(msg); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(p.client.(io.Reader), buf); err != nil {
			return nil, err
		}
		rtts = append(rtts, time.Since(t0))
	}
	return rtts, nil
}

// streamTransport is a byte-stream transport: pair connects a client to a server, through via,
// and returns the pair and the server's end.
type streamTransport struct {
	label string
	pair  func(via router) (*streamPair, io.ReadWriter, error)
}

func (s streamTransport) name() string { return s.label }

func (s streamTransport) stream(size int, d time.Duration, via router) (streamResult, error) {
	p, _, err := s.pair(via)
	if err != nil {
		return streamResult{}, err
	}
	defer p.close()
	return streamOver(p, size, d)
}

func (s streamTransport) pingpong(size, n int, via router) ([]time.Duration, error) {
	p, sv, err := s.pair(via)
	if err != nil {
		return nil, err
	}
	defer p.close()
	return pingpongOver(p, sv, size, n)
}

var (
	tcpTransport  = streamTransport{"tcp", tcpPair}
	quicTransport = streamTransport{"quic-go", quicPair}
	kcpTransport  = streamTransport{"kcp-go", kcpPair}
)

func tcpPair(via router) (*streamPair, io.ReadWriter, error) {
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(loopback))
	if err != nil {
		return nil, nil, err
	}
	defer ln.Close()
	to, stop, err := via(ln.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		return nil, nil, err
	}
	cl, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(to))
	if err != nil {
		stop()
		return nil, nil, err
	}
	sv, err := ln.Accept()
	if err != nil {
		cl.Close()
		stop()
		return nil, nil, err
	}
	return &streamPair{client: cl, server: sv, close: func() error { sv.Close(); cl.Close(); return stop() }}, sv, nil
}

var (
	certOnce sync.Once
	cert     tls.Certificate
	certErr  error
)

// selfSigned is a throwaway certificate for the quic-go server.
func selfSigned() (tls.Certificate, error) {
	certOnce.Do(func() {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			certErr = err
			return
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "softefa-bench"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			certErr = err
			return
		}
		cert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	})
	return cert, certErr
}

// quicPair is one quic-go stream; its server end appears once the client has written to it.
func quicPair(via router) (_ *streamPair, _ io.ReadWriter, err error) {
	var u undo
	defer func() {
		if err != nil {
			u.run()
		}
	}()
	c, err := selfSigned()
	if err != nil {
		return nil, nil, err
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{c}, NextProtos: []string{"bench"}}, &quic.Config{})
	if err != nil {
		return nil, nil, err
	}
	u.add(func() { ln.Close() })
	to, stop, err := via(ln.Addr().(*net.UDPAddr).AddrPort())
	if err != nil {
		return nil, nil, err
	}
	u.add(func() { stop() })
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	cc, err := quic.DialAddr(ctx, to.String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"bench"}}, &quic.Config{})
	if err != nil {
		return nil, nil, err
	}
	u.add(func() { cc.CloseWithError(0, "") })
	sc, err := ln.Accept(ctx)
	if err != nil {
		return nil, nil, err
	}
	u.add(func() { sc.CloseWithError(0, "") })
	cs, err := cc.OpenStreamSync(ctx)
	if err == nil {
		_, err = cs.Write([]byte{0}) // a stream exists for the peer once it carries data
	}
	if err != nil {
		return nil, nil, err
	}
	ss, err := sc.AcceptStream(ctx)
	if err == nil {
		_, err = io.ReadFull(ss, make([]byte, 1))
	}
	if err != nil {
		return nil, nil, err
	}
	return &streamPair{client: cs, server: ss, close: u.closer()}, ss, nil
}

// tuneKCP sets kcp-go up as its README recommends for low latency: nodelay, 10 ms interval, fast
// resend after 2 duplicate ACKs, no congestion window; 4096-packet windows, MTU 1400, stream mode.
func tuneKCP(s *kcp.UDPSession) {
	s.SetNoDelay(1, 10, 2, 1)
	s.SetWindowSize(4096, 4096)
	s.SetMtu(1400)
	//lint:ignore SA1019 stream mode packs small writes into full segments; the reference figures used it.
	s.SetStreamMode(true)
}

func kcpPair(via router) (_ *streamPair, _ io.ReadWriter, err error) {
	var u undo
	defer func() {
		if err != nil {
			u.run()
		}
	}()
	ln, err := kcp.ListenWithOptions("127.0.0.1:0", nil, 0, 0)
	if err != nil {
		return nil, nil, err
	}
	u.add(func() { ln.Close() })
	to, stop, err := via(ln.Addr().(*net.UDPAddr).AddrPort())
	if err != nil {
		return nil, nil, err
	}
	u.add(func() { stop() })
	cl, err := kcp.DialWithOptions(to.String(), nil, 0, 0)
	if err != nil {
		return nil, nil, err
	}
	u.add(func() { cl.Close() })
	tuneKCP(cl)
	if _, err := cl.Write([]byte{0}); err != nil { // the listener learns of a session from its data
		return nil, nil, err
	}
	ln.SetDeadline(time.Now().Add(ioTimeout))
	sv, err := ln.AcceptKCP()
	if err != nil {
		return nil, nil, err
	}
	u.add(func() { sv.Close() })
	tuneKCP(sv)
	if _, err := io.ReadFull(sv, make([]byte, 1)); err != nil {
		return nil, nil, err
	}
	return &streamPair{client: cl, server: sv, close: u.closer()}, sv, nil
}

// undo is what a half-built pair must close, in reverse order, if a later step fails, and what
// the finished pair closes.
type undo []func()

func (u *undo) add(f func()) { *u = append(*u, f) }

func (u undo) run() {
	for i := len(u) - 1; i >= 0; i-- {
		u[i]()
	}
}

func (u undo) closer() func() error { return func() error { u.run(); return nil } }
