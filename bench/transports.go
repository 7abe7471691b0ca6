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
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/softefa/softefa/link"
	"github.com/xtaci/kcp-go/v5"
)

// A transport moves messages from a client to a server on loopback, possibly through a fabric.
// Its server end (serve) and its client end (stream, pingpong) meet only through a server, so
// that the server end can run in another process (server.go).
type transport interface {
	name() string
	// serve starts a server end for j in this process.
	serve(j job) (server, error)
	// stream sends size-byte messages to srv (a kindStream server) for d as fast as the
	// transport allows and reports how many the server received and how long that took (first
	// send to last arrival).
	stream(srv server, size int, d time.Duration, via router) (streamResult, error)
	// pingpong sends n size-byte messages to srv (a kindPingpong server) one at a time, each
	// echoed back, and returns the round-trip times.
	pingpong(srv server, size, n int, via router) (pingResult, error)
}

// transportNamed is the transport of a name, as a child process rebuilds it from its job.
func transportNamed(name string) (transport, error) {
	for _, t := range allTransports {
		if t.name() == name {
			return t, nil
		}
	}
	return nil, fmt.Errorf("no transport %q", name)
}

var allTransports = []transport{rawUDP{}, rawUDP{noOffload: true}, tcpTransport, quicTransport, kcpTransport, softefaTransport{paths: 4}}

type streamResult struct {
	msgs    int64
	elapsed time.Duration
	lost    int64 // messages sent and not received (only unreliable transports lose any)
	sfCounts
}

type pingResult struct {
	rtts []time.Duration
	sfCounts
}

// sfCounts are softefa's retransmission counters for a run, both devices together: packets
// retransmitted (RetransPkts), of those the ones found to have arrived after all
// (SpuriousRetrans), and the retransmission timeouts (RetransTimeoutEvents). Other transports
// leave them zero.
type sfCounts struct {
	retrans, spurious, timeouts uint64
	sent                        uint64 // packets the client's device sent
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

// closers is what an end must close, in reverse order: a half-built end if a later step fails,
// a finished one when it is done. A closer added after close runs at once (an accept that
// finished while the server was being closed). Safe from several goroutines.
type closers struct {
	mu     sync.Mutex
	fs     []func()
	closed bool
}

func (c *closers) add(f func()) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		f()
		return
	}
	c.fs = append(c.fs, f)
	c.mu.Unlock()
}

func (c *closers) close() {
	c.mu.Lock()
	fs := c.fs
	c.fs, c.closed = nil, true
	c.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

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
	return link.ListenUDPOptions(loopback, 1, link.UDPOptions{NoOffload: u.noOffload})
}

func (u rawUDP) serve(j job) (server, error) {
	if j.kind == kindPingpong {
		return newUDPEcho()
	}
	l, err := u.listen()
	if err != nil {
		return nil, err
	}
	s := &udpSink{l: l, size: j.size, done: make(chan struct{})}
	go s.run()
	return s, nil
}

// udpSink counts the size-byte datagrams that arrive.
type udpSink struct {
	l         *link.UDP
	size      int
	got, last atomic.Int64 // datagrams counted; the time of the last arrival, Unix ns
	done      chan struct{}
	once      sync.Once
}

func (s *udpSink) run() {
	defer close(s.done)
	pkts := make([]link.Packet, 64)
	for i := range pkts {
		pkts[i].Buf = make([]byte, 65536)
	}
	for {
		n, err := s.l.Receive(pkts)
		if err != nil {
			return
		}
		var k int64
		for _, p := range pkts[:n] {
			if p.N == s.size {
				k++
			}
		}
		s.got.Add(k)
		s.last.Store(time.Now().UnixNano())
	}
}

func (s *udpSink) Addr() netip.AddrPort              { return s.l.LocalAddr() }
func (s *udpSink) QPN() uint32                       { return 0 }
func (s *udpSink) Peer(netip.AddrPort, uint32) error { return nil }

// Finish waits for what is still in flight and stops: until sent datagrams have come, or none
// for 200 ms (on a loaded machine the receiving process may wait that long for a core).
func (s *udpSink) Finish(sent int64) (served, error) {
	for prev, still := int64(-1), 0; still < 10 && s.got.Load() < sent; {
		if g := s.got.Load(); g != prev {
			prev, still = g, 0
		}
		still++
		time.Sleep(20 * time.Millisecond)
	}
	s.Close()
	return served{Msgs: s.got.Load(), End: s.last.Load()}, nil
}

func (s *udpSink) Close() error {
	s.once.Do(func() { s.l.Close(); <-s.done })
	return nil
}

// udpEcho sends every datagram back to where it came from.
type udpEcho struct {
	c    *net.UDPConn
	done chan struct{}
	once sync.Once
}

func newUDPEcho() (*udpEcho, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(loopback))
	if err != nil {
		return nil, err
	}
	s := &udpEcho{c: c, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		buf := make([]byte, 65536)
		for {
			k, a, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			c.WriteToUDPAddrPort(buf[:k], a)
		}
	}()
	return s, nil
}

func (s *udpEcho) Addr() netip.AddrPort              { return s.c.LocalAddr().(*net.UDPAddr).AddrPort() }
func (s *udpEcho) QPN() uint32                       { return 0 }
func (s *udpEcho) Peer(netip.AddrPort, uint32) error { return nil }
func (s *udpEcho) Finish(int64) (served, error)      { return served{}, s.Close() }
func (s *udpEcho) Close() error {
	s.once.Do(func() { s.c.Close(); <-s.done })
	return nil
}

func (u rawUDP) stream(srv server, size int, d time.Duration, via router) (streamResult, error) {
	var res streamResult
	to, stop, err := via(srv.Addr())
	if err != nil {
		return res, err
	}
	defer stop()
	cl, err := u.listen()
	if err != nil {
		return res, err
	}
	defer cl.Close()
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
	r, err := srv.Finish(sent)
	if err != nil {
		return res, err
	}
	res.msgs = r.Msgs
	res.lost = sent - res.msgs
	res.elapsed = max(sendEnd.Sub(start), time.Unix(0, r.End).Sub(start))
	return res, nil
}

func (u rawUDP) pingpong(srv server, size, n int, via router) (pingResult, error) {
	var res pingResult
	to, stop, err := via(srv.Addr())
	if err != nil {
		return res, err
	}
	defer stop()
	cl, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		return res, err
	}
	defer cl.Close()
	msg, buf := make([]byte, size), make([]byte, 65536)
	res.rtts = make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := cl.Write(msg); err != nil {
			return res, err
		}
		cl.SetReadDeadline(t0.Add(time.Second))
		if _, err := cl.Read(buf); err != nil {
			return res, fmt.Errorf("udp ping-pong: %w (raw UDP does not recover losses)", err)
		}
		res.rtts = append(res.rtts, time.Since(t0))
	}
	_, err = srv.Finish(0)
	return res, err
}

// ---- byte streams: TCP, quic-go, kcp-go ----

// streamTransport is a byte-stream transport. listen opens a server end whose accept returns
// the first connection; dial connects a client. Both register what they open on c.
//
// A stream run: the client writes size-byte messages of zeros through a 64 KiB buffer (as a
// careful application batches), then one 0xff byte that marks the end; the server reads until
// it sees it. A ping-pong: the server reads size bytes and writes them back.
type streamTransport struct {
	label  string
	listen func(c *closers) (netip.AddrPort, func(c *closers) (io.ReadWriter, error), error)
	dial   func(to netip.AddrPort, c *closers) (io.ReadWriter, error)
}

func (s streamTransport) name() string { return s.label }

var (
	tcpTransport  = streamTransport{"tcp", tcpListen, tcpDial}
	quicTransport = streamTransport{"quic-go", quicListen, quicDial}
	kcpTransport  = streamTransport{"kcp-go", kcpListen, kcpDial}
)

// streamServer is a byte stream's server end: one connection, read to the end marker or echoed.
type streamServer struct {
	addr netip.AddrPort
	kind string
	c    closers
	out  served // the stream's byte count, once the marker came; read after done
	err  error  // what ended the server early; read after done
	done chan struct{}
	got  atomic.Int64 // bytes read so far: Finish waits while they grow
}

func (s streamTransport) serve(j job) (server, error) {
	ss := &streamServer{kind: j.kind, done: make(chan struct{})}
	addr, accept, err := s.listen(&ss.c)
	if err != nil {
		ss.c.close()
		return nil, err
	}
	ss.addr = addr
	go func() {
		defer close(ss.done)
		conn, err := accept(&ss.c)
		if err != nil {
			ss.err = err
			return
		}
		if j.kind == kindPingpong {
			buf := make([]byte, j.size)
			for {
				if _, err := io.ReadFull(conn, buf); err != nil {
					return
				}
				if _, err := conn.Write(buf); err != nil {
					return
				}
			}
		}
		buf := make([]byte, 64<<10)
		var n int64
		for {
			k, err := conn.Read(buf)
			if i := bytes.IndexByte(buf[:k], 0xff); i >= 0 {
				ss.out = served{Msgs: n + int64(i), End: time.Now().UnixNano()}
				return
			}
			n += int64(k)
			ss.got.Store(n)
			if err != nil {
				ss.err = err
				return
			}
		}
	}()
	return ss, nil
}

func (ss *streamServer) Addr() netip.AddrPort              { return ss.addr }
func (ss *streamServer) QPN() uint32                       { return 0 }
func (ss *streamServer) Peer(netip.AddrPort, uint32) error { return nil }

// Finish waits for the end marker, for as long as bytes keep coming, and returns the stream's
// byte count (a ping-pong's server has nothing to report). A transport that queues more than it
// can send (kcp-go takes a window of 4096 packets) may take a while to drain on a loaded machine.
func (ss *streamServer) Finish(int64) (served, error) {
	if ss.kind == kindPingpong {
		return served{}, nil
	}
	t := time.NewTicker(ioTimeout / 20)
	defer t.Stop()
	last, since := ss.got.Load(), time.Now()
	for {
		select {
		case <-ss.done:
			return ss.out, ss.err
		case now := <-t.C:
			if g := ss.got.Load(); g != last {
				last, since = g, now
			} else if now.Sub(since) >= ioTimeout {
				return served{}, errStalled
			}
		}
	}
}

func (ss *streamServer) Close() error {
	ss.c.close()
	select {
	case <-ss.done:
		return ss.err
	case <-time.After(ioTimeout):
		return errors.New("server did not stop")
	}
}

// connect reaches srv through via; what it opens closes with c.
func (s streamTransport) connect(srv server, via router, c *closers) (io.ReadWriter, error) {
	to, stop, err := via(srv.Addr())
	if err != nil {
		return nil, err
	}
	c.add(func() { stop() })
	return s.dial(to, c)
}

func (s streamTransport) stream(srv server, size int, d time.Duration, via router) (streamResult, error) {
	var res streamResult
	var c closers
	defer c.close()
	conn, err := s.connect(srv, via, &c)
	if err != nil {
		return res, err
	}
	w := bufio.NewWriterSize(conn, 64<<10)
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
	r, err := srv.Finish(sent)
	if err != nil {
		return res, err
	}
	if r.Msgs != sent {
		return res, fmt.Errorf("%d bytes sent, %d received", sent, r.Msgs)
	}
	res.msgs, res.elapsed = r.Msgs/int64(size), time.Unix(0, r.End).Sub(start)
	return res, nil
}

func (s streamTransport) pingpong(srv server, size, n int, via router) (pingResult, error) {
	var res pingResult
	var c closers
	defer c.close()
	conn, err := s.connect(srv, via, &c)
	if err != nil {
		return res, err
	}
	// A lost server would leave the reads below waiting for ever: the watchdog closes the
	// connection when no round trip has ended for ioTimeout.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var progress atomic.Int64
	go watchdog(ctx, func() { cancel(); c.close() }, &progress)
	msg, buf := make([]byte, size), make([]byte, size)
	res.rtts = make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if _, err := conn.Write(msg); err != nil {
			return res, err
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			if ctx.Err() != nil {
				err = errStalled
			}
			return res, err
		}
		res.rtts = append(res.rtts, time.Since(t0))
		progress.Add(1)
	}
	_, err = srv.Finish(0)
	return res, err
}

func tcpListen(c *closers) (netip.AddrPort, func(*closers) (io.ReadWriter, error), error) {
	ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(loopback))
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	c.add(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).AddrPort(), func(c *closers) (io.ReadWriter, error) {
		sv, err := ln.Accept()
		if err != nil {
			return nil, err
		}
		c.add(func() { sv.Close() })
		return sv, nil
	}, nil
}

func tcpDial(to netip.AddrPort, c *closers) (io.ReadWriter, error) {
	cl, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(to))
	if err != nil {
		return nil, err
	}
	c.add(func() { cl.Close() })
	return cl, nil
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

// quicListen serves one quic-go stream; it appears once the client has written to it.
func quicListen(c *closers) (netip.AddrPort, func(*closers) (io.ReadWriter, error), error) {
	crt, err := selfSigned()
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	ln, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{crt}, NextProtos: []string{"bench"}}, &quic.Config{})
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	c.add(func() { ln.Close() })
	return ln.Addr().(*net.UDPAddr).AddrPort(), func(c *closers) (io.ReadWriter, error) {
		ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
		defer cancel()
		sc, err := ln.Accept(ctx)
		if err != nil {
			return nil, err
		}
		c.add(func() { sc.CloseWithError(0, "") })
		ss, err := sc.AcceptStream(ctx)
		if err == nil {
			_, err = io.ReadFull(ss, make([]byte, 1))
		}
		if err != nil {
			return nil, err
		}
		return ss, nil
	}, nil
}

func quicDial(to netip.AddrPort, c *closers) (io.ReadWriter, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()
	cc, err := quic.DialAddr(ctx, to.String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"bench"}}, &quic.Config{})
	if err != nil {
		return nil, err
	}
	c.add(func() { cc.CloseWithError(0, "") })
	cs, err := cc.OpenStreamSync(ctx)
	if err == nil {
		_, err = cs.Write([]byte{0}) // a stream exists for the peer once it carries data
	}
	if err != nil {
		return nil, err
	}
	return cs, nil
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

func kcpListen(c *closers) (netip.AddrPort, func(*closers) (io.ReadWriter, error), error) {
	ln, err := kcp.ListenWithOptions("127.0.0.1:0", nil, 0, 0)
	if err != nil {
		return netip.AddrPort{}, nil, err
	}
	c.add(func() { ln.Close() })
	return ln.Addr().(*net.UDPAddr).AddrPort(), func(c *closers) (io.ReadWriter, error) {
		ln.SetDeadline(time.Now().Add(ioTimeout))
		sv, err := ln.AcceptKCP()
		if err != nil {
			return nil, err
		}
		c.add(func() { sv.Close() })
		tuneKCP(sv)
		if _, err := io.ReadFull(sv, make([]byte, 1)); err != nil {
			return nil, err
		}
		return sv, nil
	}, nil
}

func kcpDial(to netip.AddrPort, c *closers) (io.ReadWriter, error) {
	cl, err := kcp.DialWithOptions(to.String(), nil, 0, 0)
	if err != nil {
		return nil, err
	}
	c.add(func() { cl.Close() })
	tuneKCP(cl)
	if _, err := cl.Write([]byte{0}); err != nil { // the listener learns of a session from its data
		return nil, err
	}
	return cl, nil
}
