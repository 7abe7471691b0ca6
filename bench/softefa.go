package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

// softefaTransport is SRD between two softefa devices on UDP loopback, one SRD QP each: SENDs
// of size bytes from the client's QP to the server's, the server keeping its receive queue
// full. Both sides poll their CQs, as verbs applications do. Each end has a device of its own,
// so that in mode 2proc each process has one device, as `softefa perf --server/--connect`.
type softefaTransport struct {
	paths int
}

func (softefaTransport) name() string { return "softefa" }

const (
	benchQKey = 0x11111
	sfDepth   = 256  // sends in flight
	sfList    = 64   // WRs posted at once, with one doorbell (softefa perf's -l default)
	sfRecvs   = 4096 // receives posted
	// sfSlots is how many messages' room a stream's buffers have at each end, reused in turn:
	// a working set that stays in cache, as TCP's (one message written through a 64 KiB
	// bufio.Writer, read into 64 KiB), and as perftest's and softefa perf's (one buffer).
	sfSlots = 16
)

type sfSide struct {
	dev  *verbs.Device
	ctx  *verbs.Context
	pd   *verbs.PD
	cq   *verbs.CQ
	mr   *verbs.MR
	buf  []byte
	qp   *verbs.QP
	ah   *verbs.AH
	wc   []verbs.WC
	rwr  []verbs.RecvWR
	sges []verbs.SGE
	ch   *verbs.CompChannel // waits for completion events instead of spinning
}

func newSFDevice(paths int) (*verbs.Device, error) {
	return verbs.NewDevice(config.Device{Addr: loopback, Paths: paths})
}

// newSFSide opens a context on dev with an SRD QP of sq sends and rq receives, one CQ for both
// and a registered buffer of bufSize bytes.
func newSFSide(dev *verbs.Device, bufSize, sq, rq int) (s *sfSide, err error) {
	s = &sfSide{dev: dev, wc: make([]verbs.WC, 128)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.ctx, err = dev.Open(); err != nil {
		return nil, err
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if s.ch, err = s.ctx.CreateCompChannel(); err != nil {
		return nil, err
	}
	if s.cq, err = s.ctx.CreateCQ(sq+rq+64, nil, s.ch, 0); err != nil {
		return nil, err
	}
	s.buf = make([]byte, bufSize)
	if s.mr, err = s.pd.RegMR(s.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		return nil, err
	}
	attr := verbs.QPInitAttrEx{
		SendCQ: s.cq, RecvCQ: s.cq, QPType: verbs.QPTDriver, PD: s.pd,
		Cap:      verbs.QPCap{MaxSendWR: uint32(sq), MaxRecvWR: uint32(rq), MaxSendSGE: 1, MaxRecvSGE: 1},
		CompMask: verbs.QPInitAttrPD | verbs.QPInitAttrSendOpsFlags,
		SendOpsFlags: verbs.SendOpsSend | verbs.SendOpsSendWithImm | verbs.SendOpsRDMAWrite |
			verbs.SendOpsRDMAWriteWithImm | verbs.SendOpsRDMARead,
	}
	if s.qp, err = efadv.CreateQPEx(s.ctx, &attr, &efadv.QPInitAttr{DriverQPType: efadv.QPDriverTypeSRD}); err != nil {
		return nil, err
	}
	steps := []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{
		{verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: benchQKey},
			verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{QPState: verbs.QPSRTS}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	}
	for _, st := range steps {
		if err := s.qp.Modify(&st.a, st.m); err != nil {
			return nil, err
		}
	}
	s.rwr = make([]verbs.RecvWR, 1)
	s.sges = make([]verbs.SGE, 1)
	return s, nil
}

func (s *sfSide) connect(to verbs.GID) error {
	var err error
	s.ah, err = s.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: to}, PortNum: 1})
	return err
}

// close destroys what newSFSide made (what of it was made).
func (s *sfSide) close() {
	if s.ah != nil {
		s.ah.Destroy()
	}
	if s.qp != nil {
		s.qp.Destroy()
	}
	if s.mr != nil {
		s.mr.Dereg()
	}
	if s.cq != nil {
		s.cq.Destroy()
	}
	if s.ch != nil {
		s.ch.Destroy()
	}
	if s.pd != nil {
		s.pd.Dealloc()
	}
	if s.ctx != nil {
		s.ctx.Close()
	}
}

// recv posts one receive of size bytes at slot i of the buffer, counted modulo the slots of
// size bytes it holds.
func (s *sfSide) recv(i, size int) error {
	s.sges[0] = s.mr.SGE(i%(len(s.buf)/size)*size, size)
	s.rwr[0] = verbs.RecvWR{WRID: uint64(i), SGList: s.sges}
	_, err := s.qp.PostRecv(s.rwr)
	return err
}

// check turns the first error status among the n completions polled into an error.
func (s *sfSide) check(n int) error {
	for _, wc := range s.wc[:n] {
		if wc.Status != verbs.WCSuccess {
			return fmt.Errorf("softefa: wr_id %d: %v (EFA status %d)", wc.WRID, wc.Status, wc.VendorErr)
		}
	}
	return nil
}

// wait returns the completions available, spinning for a moment and then sleeping on the
// completion channel until there are some; it returns ctx's error once ctx is done.
func (s *sfSide) wait(ctx context.Context) ([]verbs.WC, error) {
	for spins := 0; ; spins++ {
		n, err := s.cq.Poll(s.wc)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			return s.wc[:n], s.check(n)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if spins < 64 {
			runtime.Gosched()
			continue
		}
		// Arm, look once more (a completion may have come before the arming), then sleep.
		if err := s.cq.ReqNotify(false); err != nil {
			return nil, err
		}
		if n, err := s.cq.Poll(s.wc); err != nil || n > 0 {
			if err == nil {
				err = s.check(n)
			}
			return s.wc[:n], err
		}
		cq, err := s.ch.GetCQEvent(ctx)
		if err != nil {
			return nil, err
		}
		cq.AckEvents(1)
		spins = 0
	}
}

// post sends k WRs through the side's AH in one QPEx session; build makes the i-th.
func (s *sfSide) post(k int, qpn uint32, first uint64, build func(x *verbs.QPEx, i int)) error {
	return s.postTo(s.ah, k, qpn, first, build)
}

// postTo sends k WRs through ah in one QPEx session; build makes the i-th.
func (s *sfSide) postTo(ah *verbs.AH, k int, qpn uint32, first uint64, build func(x *verbs.QPEx, i int)) error {
	x, err := s.qp.ToQPEx()
	if err != nil {
		return err
	}
	x.WRStart()
	for i := range k {
		x.WRID, x.WRFlags = first+uint64(i), verbs.SendSignaled
		build(x, i)
		x.WRSetUDAddr(ah, qpn, benchQKey)
	}
	return x.WRComplete()
}

func (s *sfSide) counts() sfCounts {
	c := s.ctx.Counters()
	return sfCounts{retrans: c.RetransPkts, spurious: c.SpuriousRetrans, timeouts: c.RetransTimeoutEvents, sent: c.TxPkts}
}

// ---- the server end ----

// sfServer is a device of its own with one QP that counts the SENDs it receives (kindStream)
// or answers each with a SEND of the same size (kindPingpong). Its serving goroutine starts
// with Peer and owns side's CQ and QP until it ends; Finish and Close stop it by cancelling
// ctx, which wakes it if it sleeps.
type sfServer struct {
	j      job
	dev    *verbs.Device
	side   *sfSide
	ctx    context.Context
	cancel context.CancelFunc
	target chan int64 // the number of SENDs the client completed, from Finish
	res    chan sfRx  // the serving goroutine's end; nil before Peer
	once   sync.Once
	err    error // what ended the serving goroutine early
}

type sfRx struct {
	n   int64
	end time.Time // the last arrival
	err error
}

func (t softefaTransport) serve(j job) (server, error) {
	if j.kind == kindPeers {
		return servePeers(j)
	}
	dev, err := newSFDevice(t.paths)
	if err != nil {
		return nil, err
	}
	side, err := newSFSide(dev, j.size*sfSlots, sfDepth, sfRecvs)
	if err != nil {
		dev.Close()
		return nil, err
	}
	s := &sfServer{j: j, dev: dev, side: side, target: make(chan int64, 1)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	posted := 8 // a ping-pong has one message in flight each way
	if j.kind == kindStream {
		posted = sfRecvs
	}
	for i := range posted {
		if err := side.recv(i, j.size); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *sfServer) Addr() netip.AddrPort { return s.dev.Addr() }
func (s *sfServer) QPN() uint32          { return s.side.qp.QPN() }

// Peer points the server's AH at the client and starts serving.
func (s *sfServer) Peer(addr netip.AddrPort, qpn uint32) error {
	if s.res != nil {
		return errors.New("softefa server: a second peer")
	}
	if err := s.side.connect(verbs.GID(config.GIDFromAddr(addr))); err != nil {
		return err
	}
	s.res = make(chan sfRx, 1)
	if s.j.kind == kindPingpong {
		go func() { s.res <- s.echo(qpn) }()
	} else {
		go func() { s.res <- s.count() }()
	}
	return nil
}

// count counts arrivals and reposts receives until Finish has said how many were sent and
// that many have come.
func (s *sfServer) count() sfRx {
	sv, size := s.side, s.j.size
	var r sfRx
	want := int64(-1)
	wctx := s.ctx
	for want < 0 || r.n < want {
		wcs, err := sv.wait(wctx)
		if err != nil && wctx == s.ctx && s.ctx.Err() != nil {
			select {
			case want = <-s.target:
			default: // closed without Finish: the client gave up
				r.err = err
				return r
			}
			var stop context.CancelFunc
			wctx, stop = context.WithTimeout(context.Background(), ioTimeout)
			defer stop()
			continue
		}
		if err != nil {
			r.err = err
			return r
		}
		r.end = time.Now()
		for _, wc := range wcs {
			if wc.ByteLen != uint32(size) {
				r.err = fmt.Errorf("softefa: received %d bytes, sent %d", wc.ByteLen, size)
				return r
			}
			r.n++
			if err := sv.recv(int(wc.WRID), size); err != nil {
				r.err = err
				return r
			}
		}
	}
	return r
}

// echo answers every message it receives until Finish or Close.
func (s *sfServer) echo(qpn uint32) sfRx {
	sv, size := s.side, s.j.size
	for {
		wcs, err := sv.wait(s.ctx)
		if err != nil {
			if s.ctx.Err() != nil {
				err = nil
			}
			return sfRx{err: err}
		}
		for _, wc := range wcs {
			if wc.Opcode != verbs.WCRecv {
				continue
			}
			if err := sv.recv(int(wc.WRID), size); err != nil {
				return sfRx{err: err}
			}
			if err := sv.post(1, qpn, 0, func(x *verbs.QPEx, _ int) {
				x.WRSend()
				x.WRSetSGE(sv.mr.LKey(), sv.mr.Addr(), uint32(size))
			}); err != nil {
				return sfRx{err: err}
			}
		}
	}
}

// stop ends the serving goroutine, if any, and keeps what it returned.
func (s *sfServer) stop() sfRx {
	var r sfRx
	s.once.Do(func() {
		s.cancel()
		if s.res == nil {
			return
		}
		select {
		case r = <-s.res:
		case <-time.After(2 * ioTimeout):
			r.err = errStalled
		}
		if r.err != nil && !errors.Is(r.err, context.Canceled) {
			s.err = r.err
		}
	})
	return r
}

func (s *sfServer) Finish(sent int64) (served, error) {
	if s.res == nil {
		return served{}, errors.New("softefa server: Finish before Peer")
	}
	select {
	case s.target <- sent:
	default: // a second Finish
	}
	r := s.stop()
	c := s.side.counts()
	return served{Msgs: r.n, End: r.end.UnixNano(), Retrans: c.retrans, Spurious: c.spurious, Timeouts: c.timeouts}, s.err
}

func (s *sfServer) Close() error {
	s.stop()
	if showCounters && s.j.kind == kindStream {
		fmt.Fprintf(os.Stderr, "\nserver %+v\n", s.side.ctx.Counters())
	}
	s.side.close()
	s.dev.Close()
	return s.err
}

// ---- the client end ----

// sfClient is the client's device and QP, its AH pointing at the server through via.
type sfClient struct {
	*sfSide
	dev     *verbs.Device
	stopVia func() error
}

func (t softefaTransport) dial(srv server, via router, bufSize int) (*sfClient, error) {
	dev, err := newSFDevice(t.paths)
	if err != nil {
		return nil, err
	}
	side, err := newSFSide(dev, bufSize, sfDepth, sfRecvs)
	if err != nil {
		dev.Close()
		return nil, err
	}
	c := &sfClient{sfSide: side, dev: dev, stopVia: func() error { return nil }}
	// Through a fabric, the server sees the client at the fabric's address for it, and answers
	// there, so that both directions cross the fabric (as a UDP server's replies do).
	nat, err := freeUDPAddr()
	if err != nil {
		c.close()
		return nil, err
	}
	to, stop, err := via(srv.Addr(), "--client-addr", nat.String())
	if err != nil {
		c.close()
		return nil, err
	}
	c.stopVia = stop
	back := dev.Addr()
	if to != srv.Addr() {
		back = nat
	}
	if err := c.connect(verbs.GID(config.GIDFromAddr(to))); err != nil {
		c.close()
		return nil, err
	}
	if err := srv.Peer(back, c.qp.QPN()); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *sfClient) close() {
	c.sfSide.close()
	c.stopVia()
	c.dev.Close()
}

func (t softefaTransport) stream(srv server, size int, d time.Duration, via router) (streamResult, error) {
	var res streamResult
	cl, err := t.dial(srv, via, size*sfSlots)
	if err != nil {
		return res, err
	}
	defer cl.close()
	start, msgs, err := cl.pump(srv.QPN(), size, sfSlots, d, func(x *verbs.QPEx, _ int) { x.WRSend() })
	if err != nil {
		return res, err
	}
	if showCounters {
		fmt.Fprintf(os.Stderr, "\nclient %+v\npaths %+v\n", cl.ctx.Counters(), cl.ctx.PathStats())
	}
	r, err := srv.Finish(msgs)
	if err != nil {
		return res, err
	}
	if r.Msgs != msgs {
		return res, fmt.Errorf("softefa: %d sends completed, %d received", msgs, r.Msgs)
	}
	c := cl.counts()
	res.msgs, res.elapsed = msgs, time.Unix(0, r.End).Sub(start)
	res.sfCounts = sfCounts{retrans: c.retrans + r.Retrans, spurious: c.spurious + r.Spurious, timeouts: c.timeouts + r.Timeouts, sent: c.sent}
	return res, nil
}

// pump posts size-byte WRs to QP qpn for d, at most sfDepth outstanding, the i-th from offset
// i%slots*size of the buffer; op makes the WR's operation for that offset. It returns when
// every WR posted has completed, with the time of the first post and the number of WRs.
func (s *sfSide) pump(qpn uint32, size, slots int, d time.Duration, op func(x *verbs.QPEx, off int)) (time.Time, int64, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var progress atomic.Int64
	go watchdog(ctx, cancel, &progress)
	var msgs int64
	out, next := 0, uint64(0)
	start := time.Now()
	for sending := true; ; {
		if sending && time.Since(start) >= d {
			sending = false
		}
		if !sending && out == 0 {
			return start, msgs, nil
		}
		if !sending && time.Since(start) > d+ioTimeout {
			return start, msgs, fmt.Errorf("softefa: %d sends still outstanding %v after the last was posted", out, ioTimeout)
		}
		if sending && out < sfDepth {
			k := min(sfDepth-out, sfList)
			err := s.post(k, qpn, next, func(x *verbs.QPEx, i int) {
				off := int(next+uint64(i)) % slots * size
				op(x, off)
				x.WRSetSGE(s.mr.LKey(), s.mr.Addr()+uint64(off), uint32(size))
			})
			if err != nil {
				return start, msgs, err
			}
			out += k
			next += uint64(k)
		}
		wcs, err := s.wait(ctx)
		if err != nil {
			if ctx.Err() != nil {
				err = errStalled // the watchdog's doing
			}
			return start, msgs, err
		}
		out -= len(wcs)
		progress.Add(int64(len(wcs)))
		msgs += int64(len(wcs))
	}
}

func (t softefaTransport) pingpong(srv server, size, n int, via router) (pingResult, error) {
	var res pingResult
	cl, err := t.dial(srv, via, 1<<20)
	if err != nil {
		return res, err
	}
	defer cl.close()
	for i := range 8 {
		if err := cl.recv(i, size); err != nil {
			return res, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var progress atomic.Int64
	go watchdog(ctx, cancel, &progress)
	svQPN := srv.QPN()
	res.rtts = make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := cl.post(1, svQPN, 0, func(x *verbs.QPEx, _ int) {
			x.WRSend()
			x.WRSetSGE(cl.mr.LKey(), cl.mr.Addr(), uint32(size))
		}); err != nil {
			return res, err
		}
		for need := 2; need > 0; { // our send's completion and the answer
			wcs, err := cl.wait(ctx)
			if err != nil {
				if ctx.Err() != nil {
					err = errStalled // the watchdog's doing
				}
				return res, err
			}
			for _, wc := range wcs {
				if wc.Opcode == verbs.WCRecv {
					if err := cl.recv(int(wc.WRID), size); err != nil {
						return res, err
					}
				}
				need--
			}
		}
		res.rtts = append(res.rtts, time.Since(t0))
		progress.Add(1)
	}
	r, err := srv.Finish(0)
	c := cl.counts()
	res.sfCounts = sfCounts{retrans: c.retrans + r.Retrans, spurious: c.spurious + r.Spurious, timeouts: c.timeouts + r.Timeouts}
	return res, err
}

// sameDeviceWrite streams RDMA WRITEs of size bytes for d between two contexts of one device
// (which carries them out itself, with no network). As perftest's do, they go to a 16-slot
// region that stays in cache, so that they measure the device, not DRAM.
func sameDeviceWrite(size int, d time.Duration) (streamResult, error) {
	var res streamResult
	const slots = sfSlots
	dev, err := verbs.NewDevice(config.Device{Name: "efa_bench"})
	if err != nil {
		return res, err
	}
	defer dev.Close()
	sv, err := newSFSide(dev, max(size*slots, 1<<20), sfDepth, sfRecvs)
	if err != nil {
		return res, err
	}
	defer sv.close()
	cl, err := newSFSide(dev, max(size*slots, 1<<20), sfDepth, sfRecvs)
	if err != nil {
		return res, err
	}
	defer cl.close()
	if err := cl.connect(dev.GID()); err != nil {
		return res, err
	}
	start, msgs, err := cl.pump(sv.qp.QPN(), size, slots, d, func(x *verbs.QPEx, off int) {
		x.WRRDMAWrite(sv.mr.RKey(), sv.mr.Addr()+uint64(off))
	})
	if err != nil {
		return res, err
	}
	// A WRITE completes once the data is placed at the responder.
	res.msgs, res.elapsed = msgs, time.Since(start)
	return res, nil
}

// watchdog cancels ctx when progress has not moved for ioTimeout: a stalled run then fails
// instead of waiting for ever.
func watchdog(ctx context.Context, cancel func(), progress *atomic.Int64) {
	t := time.NewTicker(ioTimeout / 4)
	defer t.Stop()
	last, since := progress.Load(), time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if p := progress.Load(); p != last {
				last, since = p, now
			} else if now.Sub(since) >= ioTimeout {
				cancel()
				return
			}
		}
	}
}

// showCounters prints each softefa device's counters, and the client's path statistics, after
// each of its stream runs (--counters); a server in a child process prints its own on stderr.
var showCounters bool

// freeUDPAddr returns a loopback UDP address that was free a moment ago.
func freeUDPAddr() (netip.AddrPort, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(loopback))
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort(), nil
}
