package engine

import (
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link"
	"github.com/softefa/softefa/link/memlink"
)

// The trace harness plays a device's peer. One device under test runs driven on a simulated
// fabric (virtual time that moves only when the test says); the test writes the peer's datagrams
// byte for byte and reads every datagram the device sends, so that a transport rule of
// docs/wire.md or docs/congestion.md can be checked as a trace: "the peer acknowledges PSNs 1–4
// on path 2; PSN 0 goes again on another path". No sockets, no second device.

var (
	traceDev  = netip.MustParseAddrPort("10.9.0.1:4791")
	tracePeer = netip.MustParseAddrPort("10.9.0.2:4791")
)

// trace is one device and the test as its peer.
type trace struct {
	t    *testing.T
	f    *memlink.Fabric
	d    *Device
	peer link.Poller // where the device's datagrams to the peer arrive
	pkts []link.Packet

	pd  *PD
	cq  *CQ
	qp  *QP
	mr  *MR
	ah  *AH
	buf []byte
	pc  uint16 // WQEs posted to the SQ
	rpc uint16 // descriptors posted to the RQ
	cc  uint16 // CQEs read

	inc     uint32 // the peer's incarnation
	epoch   uint16 // the peer's stream epoch
	next    uint32 // the peer's next PSN
	horizon uint32 // what the peer's ACKs say as their horizon
	devTx   uint16 // the device's stream epoch, as its latest DATA said
	cookie  uint64 // the device's challenge, echoed in the peer's next datagram

	got    []traceFrame // frames the device sent, in order, not yet taken by the test
	dgrams int          // datagrams the device sent
}

// traceFrame is one frame the device sent, with its datagram's header and number (frames of one
// datagram share it).
type traceFrame struct {
	h     wire.Header
	f     wire.Frame
	dgram int
}

const traceQKey = 0x1234

// newTrace makes the device (paths paths; mod may change its configuration), a QP at RTS with a
// registered buffer and an AH for the peer.
func newTrace(t *testing.T, paths int, mod func(*config.Device)) *trace {
	t.Helper()
	f := memlink.NewSim(1)
	cfg := config.Device{Link: memlink.Polled{Node: f.Listen(traceDev, paths)}, Paths: paths, Driven: true,
		Clock: f.Now, Rand: rand.NewChaCha8([32]byte{1}), TransportTimeout: time.Second}
	if mod != nil {
		mod(&cfg)
	}
	d, err := NewDevice(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	r := &trace{t: t, f: f, d: d, peer: memlink.Polled{Node: f.Listen(tracePeer, 1)}, inc: 0x0e0e0e0e,
		buf: make([]byte, 64<<10), pkts: make([]link.Packet, 64)}
	for i := range r.pkts {
		r.pkts[i].Buf = make([]byte, 16<<10)
	}
	r.pd = must(d.AllocPD())(t)
	r.mr = must(d.RegMR(r.pd, r.buf, 0x100000, uapi.AccessLocalWrite|uapi.AccessRemoteWrite|uapi.AccessRemoteRead))(t)
	r.cq = must(d.CreateCQ(CQInit{Entries: 256}))(t)
	r.qp = must(d.CreateQP(QPInit{Type: uapi.QPTypeDriver, DriverType: uapi.DriverQPTypeSRD, PD: r.pd, SendCQ: r.cq,
		RecvCQ: r.cq, SQEntries: 64, SQEntrySize: efaio.TxWQESize, RQEntries: 64,
		Caps: QPCaps{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}}))(t)
	r.toRTS(uapi.RNRRetryInfinite)
	r.ah = must(d.CreateAH(r.pd, GIDFromAddr(tracePeer)))(t)
	return r
}

// toRTS takes the QP from RESET to RTS with the given rnr_retry.
func (r *trace) toRTS(rnrRetry uint8) {
	for _, st := range []struct {
		a    QPAttr
		mask int
	}{
		{QPAttr{State: uapi.QPSInit, Port: 1, QKey: traceQKey}, uapi.QPAttrState | uapi.QPAttrPKeyIndex | uapi.QPAttrPort | uapi.QPAttrQKey},
		{QPAttr{State: uapi.QPSRTR}, uapi.QPAttrState},
		{QPAttr{State: uapi.QPSRTS, RNRRetry: rnrRetry}, uapi.QPAttrState | uapi.QPAttrSQPSN | uapi.QPAttrRNRRetry},
	} {
		if err := r.d.ModifyQP(r.qp, &st.a, st.mask); err != nil {
			r.t.Fatal(err)
		}
	}
}

func must[T any](v T, err error) func(*testing.T) T {
	return func(t *testing.T) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// post puts one send WR in the SQ and rings: op SEND (n bytes from the buffer's start) or RDMA
// WRITE/READ (n bytes to or from the peer's address 0x2000 with rkey 77).
func (r *trace) post(wrid uint16, op efaio.OpType, n int) {
	q := r.qp
	w := efaio.TxDesc{ReqID: wrid, Op: op, CompReq: true, DestQPN: 9, AHN: r.ah.AHN(), QKey: 0x77,
		Phase: uint8(uint32(r.pc)/q.sq.cnt) & 1, Length: 1}
	w.SGL[0] = efaio.BufDesc{Length: uint32(n), LKey: r.mr.LKey(), Addr: r.mr.IOVA()}
	if op != efaio.OpSend {
		w.Remote = efaio.RemoteMem{Length: uint32(n), RKey: 77, Addr: 0x2000}
	}
	q.sq.slot(r.pc).Encode(&w)
	r.pc++
	atomic.StoreUint32(q.sq.db, uint32(r.pc))
	r.d.Ring(q)
	r.drive()
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

// recv posts one receive WR of n bytes at the buffer's offset off.
func (r *trace) recv(wrid uint16, off, n int) {
	q := r.qp
	slot := int(uint32(r.rpc)&(q.rq.cnt-1)) * efaio.RxDescSize
	efaio.RxDesc(q.rq.ring[slot : slot+efaio.RxDescSize]).Encode(&efaio.RxDescFields{
		Addr: r.mr.IOVA() + uint64(off), Length: uint16(n), LKey: r.mr.LKey(), ReqID: wrid, First: true, Last: true})
	r.rpc++
	atomic.StoreUint32(q.rq.db, uint32(r.rpc))
	r.d.Ring(q)
	r.drive()
}

// drive lets the device do all it has to do now, and collects what it sent the peer.
func (r *trace) drive() {
	for r.d.Drive() {
	}
	r.collect()
}

// busyPoll does what an application's empty poll does (Device.PollNetwork): it takes the
// datagrams waiting for the device, leaving their acknowledgements owed for a while, and sends
// what they produced; then it collects what the device sent.
func (r *trace) busyPoll() {
	d, dr := r.d, r.d.drv
	d.mu.Lock()
	d.useTx(dr.q)
	if n, _ := dr.poller.TryReceive(dr.rx.pkts); n > 0 {
		d.inputBatch(dr.rx, n, true)
	}
	d.mu.Unlock()
	d.sendTx(dr.q)
	r.collect()
}

// collect parses what the device has sent the peer.
func (r *trace) collect() {
	for {
		n, _ := r.peer.TryReceive(r.pkts)
		if n == 0 {
			return
		}
		for _, pk := range r.pkts[:n] {
			h, frames, err := wire.ParseHeader(pk.Buf[:pk.N])
			if err != nil {
				r.t.Fatalf("the device sent a malformed datagram: %v", err)
			}
			r.dgrams++
			r.cookie = 0
			for len(frames) > 0 {
				var f wire.Frame
				if frames, err = wire.NextFrame(frames, &f); err != nil {
					r.t.Fatalf("the device sent a malformed frame: %v", err)
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

// advance moves virtual time on by dt in steps of 100 µs, the device doing its work at each.
func (r *trace) advance(dt time.Duration) {
	for end := r.f.Now() + dt; r.f.Now() < end; {
		r.f.Advance(min(100*time.Microsecond, end-r.f.Now()))
		r.drive()
	}
}

// take returns the frames of type typ the device has sent since the last take of that type, in
// order, and forgets them; other frames stay.
func (r *trace) take(typ uint8) []traceFrame {
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

// data takes the DATA frames the device has sent.
func (r *trace) data() []traceFrame { return r.take(wire.TypeData) }

// send delivers a datagram from the peer with the given frames (appended by add), on peer path
// path, and lets the device handle it; a COOKIE answering the device's last challenge goes first.
func (r *trace) send(path uint8, add func(b []byte) []byte) {
	r.inject(path, add)
	r.drive()
}

// inject is send without letting the device run: the datagram waits for it.
func (r *trace) inject(path uint8, add func(b []byte) []byte) {
	h := wire.Header{Path: path, SrcPort: tracePeer.Port(), SrcInc: r.inc, DstInc: r.d.inc, TxEpoch: r.epoch, RxEpoch: r.devTx}
	b := wire.AppendHeader(nil, &h)
	if r.cookie != 0 {
		b = wire.AppendCookie(b, r.cookie, []uint16{tracePeer.Port()})
		r.cookie = 0
	}
	b = add(b)
	wire.PutChecksum(b)
	r.f.Inject(tracePeer, traceDev, b)
}

// meet gets the peer validated by the device, as a peer that sends first must: its first
// datagram is challenged, and the next carries the cookie.
func (r *trace) meet() {
	r.send(0, func(b []byte) []byte { return wire.AppendAck(b, &wire.Ack{}) }) // large enough to be answered
	if r.cookie == 0 {
		r.t.Fatal("the device did not challenge a peer it never met")
	}
	r.take(wire.TypeChallenge)
}

// ack acknowledges the device's stream: every PSN below cum, and the PSNs in sack beyond it, as
// the peer's DATA on path path would be answered.
func (r *trace) ack(cum uint32, sack []uint32, path uint8) {
	a := wire.Ack{Cum: cum, Highest: cum - 1, Path: path, Horizon: r.horizon}
	for _, p := range sack {
		i := p - cum - 1
		a.Sack[i/64] |= 1 << (i % 64)
		a.Highest = max(a.Highest, p)
	}
	r.send(path, func(b []byte) []byte { return wire.AppendAck(b, &a) })
}

// peerData sends one DATA frame of the peer's stream (the next PSN) and returns its PSN.
func (r *trace) peerData(d wire.Data) uint32 {
	d.PSN = r.next
	r.next++
	r.send(0, func(b []byte) []byte { return wire.AppendData(b, &d) })
	return d.PSN
}

// completions reads the CQEs the device has written since the last call.
func (r *trace) completions() []efaio.Completion {
	var out []efaio.Completion
	cq := r.cq
	for {
		slot := cq.ring[int(uint32(r.cc)&(cq.depth-1))*cq.esz:][:cq.esz]
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&slot[0])))
		if efaio.PhaseOf(hdr) != uint8(uint32(r.cc)/cq.depth)&1^1 {
			return out
		}
		var c efaio.Completion
		if err := efaio.CQE(slot).Decode(hdr, &c); err != nil {
			r.t.Fatal(err)
		}
		out = append(out, c)
		r.cc++
		atomic.StoreUint32(cq.db, uint32(r.cc))
	}
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
func psns(fs []traceFrame) []uint32 {
	var out []uint32
	for _, f := range fs {
		out = append(out, f.f.Data.PSN)
	}
	return out
}
