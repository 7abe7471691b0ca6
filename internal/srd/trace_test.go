package srd

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link"
	"github.com/softefa/softefa/link/memlink"
)

// The trace harness plays a transport's peer, and its host. One transport under test runs on a
// simulated fabric (virtual time that moves only when the test says); the test writes the peer's
// datagrams byte for byte and reads every datagram the transport sends, so that a transport rule
// of docs/wire.md or docs/congestion.md can be checked as a trace: "the peer acknowledges PSNs
// 1–4 on path 2; PSN 0 goes again on another path". The host above it is a fake that records
// outcomes and receives. No sockets, no second device, no device.

var (
	traceDev  = netip.MustParseAddrPort("10.9.0.1:4791")
	tracePeer = netip.MustParseAddrPort("10.9.0.2:4791")
)

// trace is one transport, its host, and the test as its peer.
type trace struct {
	t    testing.TB
	f    *memlink.Fabric
	tr   *Transport
	q    *Queue
	in   *Inbox
	link link.Poller // the transport's own link
	peer link.Poller // where the transport's datagrams to the peer arrive
	pkts []link.Packet

	counts Counters
	host   fakeHost
	buf    []byte

	inc     uint32     // the peer's incarnation
	epoch   wire.Epoch // the peer's stream epoch
	next    wire.PSN   // the peer's next PSN
	horizon wire.PSN   // what the peer's ACKs say as their horizon (0: none, unless horizonZero)
	// horizonZero: the peer's ACKs name horizon 0 as PSN 0 (its RESP took PSN 2^32-1)
	horizonZero bool
	devTx       wire.Epoch // the transport's stream epoch, as its latest DATA said
	cookie      uint64     // the transport's challenge, echoed in the peer's next datagram
	// quietPeer: the peer does not answer the transport's first-contact PROBE (hello) with a
	// challenge, as a peer that has no context for it does unless a test says otherwise.
	quietPeer bool
	// heldUp: the peer does not answer the retransmission timer's PINGs (a peer held up, or one
	// they do not reach). Otherwise it answers each with a PROBE_ACK and no acknowledgement, as a
	// peer that has not had the packets does (pong).
	heldUp bool
	// onPing, if set, is told the nonce of each of the timer's PINGs instead (and answers it, or
	// not, as the test's peer would).
	onPing func(nonce uint32)

	got    []traceFrame // frames the transport sent, in order, not yet taken by the test
	dgrams int          // datagrams the transport sent
	pings  int          // PINGs the transport's retransmission timer sent (pong)
	// pingPaths: the path of each of those PINGs' datagrams, in order
	pingPaths []uint8
}

// traceFrame is one frame the transport sent, with its datagram's header and number (frames of
// one datagram share it).
type traceFrame struct {
	h     wire.Header
	f     wire.Frame
	dgram int
}

// completion is an outcome the fake host was told (a request's, by its WR id) or a receive it
// completed.
type completion struct {
	ReqID    uint16
	Status   efaio.Status
	MayRetry bool
}

// fakeHost is the host a trace's transport serves: SENDs take the receives the test posted in
// order (RNR without one), writes and reads are accepted, outcomes and receives are recorded.
type fakeHost struct {
	recvs []uint16
	done  []completion
	mem   []byte
	dereg bool // mem's region is deregistered (Live)
}

// fakeIn is a SEND arriving in segments at the fake host.
type fakeIn struct {
	h    *fakeHost
	wrid uint16
	got  uint64
}

func (in *fakeIn) Abort() {
	in.h.done = append(in.h.done, completion{ReqID: in.wrid, Status: efaio.StatusRemoteAbort})
}

func (h *fakeHost) Receive(src [16]byte, f *wire.Data, prev Inbound) (Inbound, efaio.Status, bool) {
	in, _ := prev.(*fakeIn)
	if in == nil {
		in = &fakeIn{h: h, wrid: 0xffff}
		if f.Op == wire.OpSend {
			if len(h.recvs) == 0 {
				return nil, efaio.StatusRemoteRNR, true
			}
			in.wrid, h.recvs = h.recvs[0], h.recvs[1:]
		}
	}
	in.got += uint64(len(f.Payload))
	if in.got < uint64(f.Length) {
		return in, efaio.StatusOK, false
	}
	if f.Op == wire.OpSend {
		h.done = append(h.done, completion{ReqID: in.wrid, Status: efaio.StatusOK})
	}
	return nil, efaio.StatusOK, true
}

func (h *fakeHost) Read(src [16]byte, f *wire.Data) (mem.Span, any, efaio.Status) {
	if int(f.Length) > len(h.mem) {
		return mem.Span{}, nil, efaio.StatusRemoteBadAddress
	}
	return mem.Own(h.mem[:f.Length]), h, efaio.StatusOK
}

func (h *fakeHost) Live(region any) bool { return region == h && !h.dereg }

func (h *fakeHost) UD(src [16]byte, f *wire.Data) {}

func (h *fakeHost) Done(now time.Duration, owner any, st efaio.Status, mayRetry bool) {
	h.done = append(h.done, completion{ReqID: owner.(uint16), Status: st, MayRetry: mayRetry})
}

func (h *fakeHost) Gather(b []byte, src []mem.Span, off uint64, n int) ([]byte, bool) {
	return mem.Append(b, src, off, n)
}

func (h *fakeHost) Copy(dst mem.Span, off int, src []byte) bool { return dst.WriteAt(src, off) }

const traceQKey = 0x1234

// newTrace makes the transport (paths paths; mod may change its configuration) and its host.
func newTrace(t testing.TB, paths int, mod func(*config.Device)) *trace {
	t.Helper()
	f := memlink.NewSim(1)
	node := memlink.Polled{Node: f.Listen(traceDev, paths)}
	cfg := config.Device{Link: node, Paths: paths, Driven: true, Clock: f.Now, TransportTimeout: time.Second}
	if mod != nil {
		mod(&cfg)
	}
	if err := cfg.Fill(); err != nil {
		t.Fatal(err)
	}
	r := &trace{t: t, f: f, link: node, peer: memlink.Polled{Node: f.Listen(tracePeer, 1)}, inc: 0x0e0e0e0e,
		buf: make([]byte, 64<<10), pkts: make([]link.Packet, 64)}
	r.host.mem = make([]byte, 64<<10)
	rng := rand.NewChaCha8([32]byte{1})
	tr, err := New(cfg, node, NewIncarnation(rng), rng, &r.host, &r.counts)
	if err != nil {
		t.Fatal(err)
	}
	r.tr, r.q, r.in = tr, tr.NewQueue(), tr.NewInbox()
	for i := range r.pkts {
		r.pkts[i].Buf = make([]byte, 16<<10)
	}
	return r
}

// post starts one request as the host would and lets the transport run: op SEND (n bytes from
// the buffer's start) or RDMA WRITE/READ (n bytes to or from the peer's address 0x2000 with rkey
// 77). Its outcome is recorded under wrid.
func (r *trace) post(wrid uint16, op efaio.OpType, n int) {
	req := Request{Op: wire.OpSend, DstQPN: 9, QKey: 0x77, Length: uint64(n)}
	switch op {
	case efaio.OpRDMAWrite:
		req.Op = wire.OpWrite
	case efaio.OpRDMARead:
		req.Op = wire.OpReadReq
	}
	if op == efaio.OpRDMARead {
		req.Sink = mem.Own(r.buf[:n])
	} else {
		req.Src[0], req.NSrc = mem.Own(r.buf[:n]), 1
	}
	if op != efaio.OpSend {
		req.RKey, req.RAddr = 77, 0x2000
	}
	r.batch(r.q, func(now time.Duration) {
		if _, st := r.tr.Request(now, config.GIDFromAddr(tracePeer), &req, wrid); st != efaio.StatusOK {
			r.t.Fatalf("request: status %d", st)
		}
	})
	r.drive()
	r.answerHello()
}

// answerHello answers the transport's first-contact PROBE, if it sent one, as a peer with no
// context for it does: with a CHALLENGE to its endpoint's port, unless quietPeer. The PROBE is
// taken; the transport's stream then goes, with the cookie.
func (r *trace) answerHello() {
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if r.quietPeer || p == nil || p.heard || !p.paths[0].probeSent {
		return
	}
	hello := slices.IndexFunc(r.got, func(g traceFrame) bool {
		return g.f.Type == wire.TypeProbe && g.h.Path == 0 && g.f.Nonce == p.paths[0].nonce
	})
	if hello < 0 {
		return
	}
	r.got = slices.Delete(r.got, hello, hello+1)
	r.send(0, func(b []byte) []byte { return wire.AppendChallenge(b, 0x1234567, traceDev.Port()) })
}

// sends posts n SENDs of 100 bytes (WR ids 0 to n-1), 100 µs apart, and returns their DATA
// frames: packets sent one after another, as the loss rules need them.
func (r *trace) sends(n int) []traceFrame {
	for i := range n {
		r.post(uint16(i), efaio.OpSend, 100)
		r.advance(100 * time.Microsecond)
	}
	return r.data()
}

// queueSends queues n SENDs of size bytes to the peer (WR ids 0 to n-1) at now, as one doorbell's
// list does: Request only queues them, and the caller's batch (Hold) frames them.
func (r *trace) queueSends(now time.Duration, n, size int) {
	r.t.Helper()
	for i := range n {
		req := Request{Op: wire.OpSend, DstQPN: 9, QKey: 0x77, Length: uint64(size)}
		req.Src[0], req.NSrc = mem.Own(r.buf[:size]), 1
		if _, st := r.tr.Request(now, config.GIDFromAddr(tracePeer), &req, uint16(i)); st != efaio.StatusOK {
			r.t.Fatalf("request %d: status %d", i, st)
		}
	}
}

// sendPair posts two SENDs of 100 bytes (WR ids first and first+1) gap apart, lets 100 µs pass
// (the acknowledgements' RTT) and returns the path both went on: packets one after the other on
// one path, as the reordering rules need them.
func (r *trace) sendPair(first wire.PSN, gap time.Duration) uint8 {
	r.t.Helper()
	r.post(uint16(first), efaio.OpSend, 100)
	r.advance(gap)
	r.post(uint16(first+1), efaio.OpSend, 100)
	r.advance(100 * time.Microsecond)
	d := r.data()
	if len(d) != 2 || d[0].h.Path != d[1].h.Path || d[0].f.Data.PSN != first {
		r.t.Fatalf("PSNs %v went on paths %v: want %d and %d on one path", psns(d), paths(d), first, first+1)
	}
	return d[0].h.Path
}

// recv posts one receive WR at the host: the next SEND from the peer completes it.
func (r *trace) recv(wrid uint16) { r.host.recvs = append(r.host.recvs, wrid) }

// drive lets the transport do all it has to do now, as the transport's engine does at each tick:
// take every datagram waiting, run the timers, send the ACKs owed; then it collects what the
// transport sent the peer.
func (r *trace) drive() {
	r.batch(r.q, func(now time.Duration) {
		for {
			n, _ := r.link.TryReceive(r.in.Pkts)
			if n == 0 {
				break
			}
			r.tr.Input(now, r.in, n, false)
		}
		r.tr.Tick(now)
		if r.tr.AcksOwed() {
			r.tr.FlushAcks(now, 0)
		}
	})
	r.collect()
	r.pong()
}

// pong answers the retransmission timer's PINGs the transport sent (PROBEs with an even nonce)
// with a PROBE_ACK that acknowledges nothing, unless heldUp; the transport takes it at its next
// work. The PINGs are taken.
func (r *trace) pong() {
	keep := r.got[:0]
	var nonces []uint32
	for _, g := range r.got {
		if g.f.Type == wire.TypeProbe && isPing(g.f.Nonce) {
			nonces = append(nonces, g.f.Nonce)
			r.pings++
			r.pingPaths = append(r.pingPaths, g.h.Path)
		} else {
			keep = append(keep, g)
		}
	}
	r.got = keep
	if r.onPing != nil {
		for _, n := range nonces {
			r.onPing(n)
		}
		return
	}
	if r.heldUp {
		return
	}
	for _, n := range nonces {
		r.inject(0, func(b []byte) []byte { return wire.AppendProbe(b, n, true) })
	}
}

// busyPoll does what an application's empty poll does (the transport's PollNetwork): it takes the
// datagrams waiting, leaving their acknowledgements owed for a while, and sends what they
// produced; then it collects what the transport sent.
func (r *trace) busyPoll() {
	r.batch(r.in.Out, func(now time.Duration) {
		if n, _ := r.link.TryReceive(r.in.Pkts); n > 0 {
			r.tr.Input(now, r.in, n, true)
		}
	})
	r.collect()
}

// batch is one batch of the device's work, as a holder of the device's lock does it: work's
// calls get the clock read once, at the batch's start, and their frames go into q, whose
// datagrams are sent when work returns.
func (r *trace) batch(q *Queue, work func(now time.Duration)) {
	r.tr.Use(q)
	work(r.f.Now())
	r.tr.Hold(q)
	r.tr.Flush(q)
}

// collect parses what the transport has sent the peer.
func (r *trace) collect() {
	for {
		n, _ := r.peer.TryReceive(r.pkts)
		if n == 0 {
			return
		}
		for _, pk := range r.pkts[:n] {
			h, frames, err := wire.ParseHeader(pk.Buf[:pk.N])
			if err != nil {
				r.t.Fatalf("the transport sent a malformed datagram: %v", err)
			}
			r.dgrams++
			r.cookie = 0
			for len(frames) > 0 {
				var f wire.Frame
				if frames, err = wire.NextFrame(frames, &f); err != nil {
					r.t.Fatalf("the transport sent a malformed frame: %v", err)
				}
				if f.Type == wire.TypeData {
					f.Data.Payload = append([]byte(nil), f.Data.Payload...)
					r.devTx = h.TxEpoch
				}
				if f.Type == wire.TypeChallenge {
					r.cookie = f.Cookie
				}
				r.got = append(r.got, traceFrame{h, f, r.dgrams})
			}
		}
	}
}

// advance moves virtual time on by dt in steps of 100 µs, the transport doing its work at each.
func (r *trace) advance(dt time.Duration) {
	for end := r.f.Now() + dt; r.f.Now() < end; {
		r.f.Advance(min(100*time.Microsecond, end-r.f.Now()))
		r.drive()
	}
}

// take returns the frames of type typ the transport has sent since the last take of that type, in
// order, and forgets them; other frames stay.
func (r *trace) take(typ wire.FrameType) []traceFrame {
	var out []traceFrame
	keep := r.got[:0]
	for _, g := range r.got {
		if g.f.Type == typ {
			out = append(out, g)
		} else {
			keep = append(keep, g)
		}
	}
	r.got = keep
	return out
}

// awaitData moves virtual time on in steps of 100 µs until the transport sends DATA (a timer's
// probe), for up to a second, and takes it.
func (r *trace) awaitData() []traceFrame {
	r.t.Helper()
	for end := r.f.Now() + time.Second; ; {
		if r.f.Now() >= end {
			r.t.Fatalf("no DATA in a second")
		}
		r.advance(100 * time.Microsecond)
		if d := r.data(); len(d) > 0 {
			return d
		}
	}
}

// awaitPing moves virtual time on in steps of 100 µs until the transport's timer sends its next
// PING (pong), for up to 100 ms; DATA sent meanwhile fails the test.
func (r *trace) awaitPing() {
	r.t.Helper()
	for n, end := r.pings, r.f.Now()+100*time.Millisecond; r.pings == n; {
		if r.f.Now() >= end {
			r.t.Fatalf("no PING in 100 ms")
		}
		r.advance(100 * time.Microsecond)
		if d := r.data(); len(d) > 0 {
			r.t.Fatalf("the timer sent PSNs %v, not a PING", psns(d))
		}
	}
}

// data takes the DATA frames the transport has sent.
func (r *trace) data() []traceFrame { return r.take(wire.TypeData) }

// send delivers a datagram from the peer with the given frames (appended by add), on peer path
// path, and lets the transport handle it; a COOKIE answering the transport's last challenge goes first.
func (r *trace) send(path uint8, add func(b []byte) []byte) {
	r.inject(path, add)
	r.drive()
}

// inject is send without letting the transport run: the datagram waits for it.
func (r *trace) inject(path uint8, add func(b []byte) []byte) {
	h := wire.Header{Path: path, SrcPort: tracePeer.Port(), SrcInc: r.inc, DstInc: r.tr.inc, TxEpoch: r.epoch, RxEpoch: r.devTx}
	b := wire.AppendHeader(nil, &h)
	if r.cookie != 0 {
		b = wire.AppendCookie(b, r.cookie, []uint16{tracePeer.Port()})
		r.cookie = 0
	}
	b = add(b)
	wire.PutChecksum(b)
	r.f.Inject(tracePeer, traceDev, b)
}

// meet gets the peer validated by the transport, as a peer that sends first must: its first
// datagram is challenged, and the next carries the cookie.
func (r *trace) meet() {
	r.send(0, func(b []byte) []byte { return wire.AppendAck(b, &wire.Ack{}) }) // large enough to be answered
	if r.cookie == 0 {
		r.t.Fatal("the transport did not challenge a peer it never met")
	}
	r.take(wire.TypeChallenge)
}

// hear has the peer met (meet) and heard from by the transport: a datagram of the peer, with the
// cookie, is taken. The transport then sends the peer a window of packets, not one.
func (r *trace) hear() {
	r.meet()
	r.send(0, func(b []byte) []byte { return wire.AppendAck(b, &wire.Ack{}) })
	if p := r.tr.peers[config.GIDFromAddr(tracePeer)]; p == nil || !p.heard {
		r.t.Fatal("the transport did not take the peer's datagram with its cookie")
	}
}

// ack acknowledges the transport's stream: every PSN below cum, and the PSNs in sack beyond it, as
// the peer's DATA on path path would be answered.
func (r *trace) ack(cum wire.PSN, sack []wire.PSN, path uint8) {
	a := wire.Ack{Cum: cum, Highest: cum - 1, Path: path, Horizon: r.horizon, HasHorizon: r.horizon != 0 || r.horizonZero}
	for _, p := range sack {
		i := p - cum - 1
		a.Sack[i/64] |= 1 << (i % 64)
		a.Highest = max(a.Highest, p)
	}
	r.send(path, func(b []byte) []byte { return wire.AppendAck(b, &a) })
}

// peerData sends one DATA frame of the peer's stream (the next PSN) and returns its PSN.
func (r *trace) peerData(d wire.Data) wire.PSN {
	d.PSN = r.next
	r.next++
	r.send(0, func(b []byte) []byte { return wire.AppendData(b, &d) })
	return d.PSN
}

// completions returns what the host was told since the last call.
func (r *trace) completions() []completion {
	out := r.host.done
	r.host.done = nil
	return out
}

// rttSample has WR 0, a SEND, go and be acknowledged 1 ms later on its path: the stream's first
// RTT sample, 1 ms (the retransmission timer at its least, 2 ms). It returns the peer's context.
func (r *trace) rttSample() *peer {
	r.t.Helper()
	r.post(0, efaio.OpSend, 100)
	first := r.data()
	r.advance(time.Millisecond)
	r.ack(1, nil, first[0].h.Path)
	r.wantCompletion(0, efaio.StatusOK)
	return r.tr.peers[config.GIDFromAddr(tracePeer)]
}

// wantCompletion checks that exactly one completion came, for wrid, with status st.
func (r *trace) wantCompletion(wrid uint16, st efaio.Status) {
	r.t.Helper()
	cs := r.completions()
	if len(cs) != 1 || cs[0].ReqID != wrid || cs[0].Status != st {
		r.t.Fatalf("completions %+v, want one for WR %d with status %d", cs, wrid, st)
	}
}

// noCompletion checks that nothing completed.
func (r *trace) noCompletion() {
	r.t.Helper()
	if cs := r.completions(); len(cs) != 0 {
		r.t.Fatalf("completions %+v, want none yet", cs)
	}
}

// psns lists the PSNs of DATA frames.
func psns(fs []traceFrame) []wire.PSN {
	var out []wire.PSN
	for _, f := range fs {
		out = append(out, f.f.Data.PSN)
	}
	return out
}
