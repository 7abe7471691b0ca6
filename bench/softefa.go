package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

// softefaTransport is SRD between two softefa devices on UDP loopback (or, with sameDevice, two
// contexts of one device): SENDs of size bytes from one SRD QP to another, the server keeping
// its receive queue full. Both sides poll their CQs, as verbs applications do.
type softefaTransport struct {
	paths int
}

func (softefaTransport) name() string { return "softefa" }

const (
	benchQKey = 0x11111
	sfDepth   = 256  // sends in flight
	sfRecvs   = 1024 // receives posted
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
	ch   *verbs.CompChannel // the server side waits for completion events instead of spinning
}

func newSFDevice(paths int) (*verbs.Device, error) {
	return verbs.NewDevice(config.Device{Addr: loopback, Paths: paths})
}

func newSFSide(dev *verbs.Device, bufSize int, events bool) (*sfSide, error) {
	s := &sfSide{dev: dev, wc: make([]verbs.WC, 128)}
	var err error
	if s.ctx, err = dev.Open(); err != nil {
		return nil, err
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if events {
		if s.ch, err = s.ctx.CreateCompChannel(); err != nil {
			return nil, err
		}
	}
	if s.cq, err = s.ctx.CreateCQ(sfDepth+sfRecvs+64, nil, s.ch, 0); err != nil {
		return nil, err
	}
	s.buf = make([]byte, bufSize)
	if s.mr, err = s.pd.RegMR(s.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		return nil, err
	}
	attr := verbs.QPInitAttrEx{
		SendCQ: s.cq, RecvCQ: s.cq, QPType: verbs.QPTDriver, PD: s.pd,
		Cap:      verbs.QPCap{MaxSendWR: sfDepth, MaxRecvWR: sfRecvs, MaxSendSGE: 1, MaxRecvSGE: 1},
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

func (s *sfSide) close() {
	if s.ah != nil {
		s.ah.Destroy()
	}
	s.qp.Destroy()
	s.mr.Dereg()
	s.cq.Destroy()
	if s.ch != nil {
		s.ch.Destroy()
	}
	s.pd.Dealloc()
	s.ctx.Close()
}

// recv posts one receive of size bytes at slot i of the buffer.
func (s *sfSide) recv(i, size int) error {
	s.sges[0] = s.mr.SGE(i*size%(len(s.buf)-size+1), size)
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

// sfPair is a client and a server side, on two devices (or one) with the client's AH pointing at
// the server through via.
type sfPair struct {
	cl, sv  *sfSide
	devs    []*verbs.Device
	stopVia func() error
}

func (t softefaTransport) pair(bufSize int, via router, sameDevice bool) (*sfPair, error) {
	p := &sfPair{stopVia: func() error { return nil }}
	var err error
	if sameDevice {
		dev, err := verbs.NewDevice(config.Device{Name: "efa_bench"})
		if err != nil {
			return nil, err
		}
		p.devs = []*verbs.Device{dev, dev}
	} else {
		for range 2 {
			dev, err := newSFDevice(t.paths)
			if err != nil {
				p.close()
				return nil, err
			}
			p.devs = append(p.devs, dev)
		}
	}
	if p.sv, err = newSFSide(p.devs[1], bufSize, true); err == nil {
		p.cl, err = newSFSide(p.devs[0], bufSize, true)
	}
	if err != nil {
		p.close()
		return nil, err
	}
	to, back := p.devs[1].GID(), p.devs[0].GID()
	if !sameDevice {
		// Through a fabric, the server sees the client at the fabric's address for it, and
		// answers there, so that both directions cross the fabric (as a UDP server's replies do).
		nat, err := freeUDPAddr()
		if err != nil {
			p.close()
			return nil, err
		}
		ap, stop, err := via(p.devs[1].Addr(), "--client-addr", nat.String())
		if err != nil {
			p.close()
			return nil, err
		}
		to, p.stopVia = verbs.GID(config.GIDFromAddr(ap)), stop
		if ap != p.devs[1].Addr() {
			back = verbs.GID(config.GIDFromAddr(nat))
		}
	}
	if err := p.cl.connect(to); err != nil {
		p.close()
		return nil, err
	}
	if err := p.sv.connect(back); err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *sfPair) close() {
	for _, s := range []*sfSide{p.cl, p.sv} {
		if s != nil {
			s.close()
		}
	}
	p.stopVia()
	if len(p.devs) > 0 {
		p.devs[0].Close()
		if p.devs[len(p.devs)-1] != p.devs[0] {
			p.devs[len(p.devs)-1].Close()
		}
	}
}

// post sends up to k WRs in one QPEx session; build makes the i-th.
func (s *sfSide) post(k int, qpn uint32, first uint64, build func(x *verbs.QPEx, i int)) error {
	x, err := s.qp.ToQPEx()
	if err != nil {
		return err
	}
	x.WRStart()
	for i := range k {
		x.WRID, x.WRFlags = first+uint64(i), verbs.SendSignaled
		build(x, i)
		x.WRSetUDAddr(s.ah, qpn, benchQKey)
	}
	return x.WRComplete()
}

func (t softefaTransport) stream(size int, d time.Duration, via router) (streamResult, error) {
	return t.run(size, d, via, false, false)
}

// run streams SENDs (or, with write, RDMA writes into the server's buffer) for d.
func (t softefaTransport) run(size int, d time.Duration, via router, write, sameDevice bool) (streamResult, error) {
	var res streamResult
	// SENDs land in the receive buffers posted (one slot each); WRITEs, as perftest's do, go to
	// a small region that stays in cache, so that they measure the device, not DRAM.
	slots := sfRecvs
	if write {
		slots = 16
	}
	p, err := t.pair(max(size*slots, 1<<20), via, sameDevice)
	if err != nil {
		return res, err
	}
	defer p.close()
	cl, sv := p.cl, p.sv
	if !write {
		for i := range sfRecvs {
			if err := sv.recv(i, size); err != nil {
				return res, err
			}
		}
	}
	// The server counts arrivals and reposts receives. When the client has finished it sends
	// the total and cancels ctx, which wakes the server if it sleeps.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var progress atomic.Int64
	go watchdog(ctx, cancel, &progress)
	target := make(chan int64, 1)
	type rx struct {
		n   int64
		end time.Time
		err error
	}
	rxc := make(chan rx, 1)
	if !write {
		go func() {
			var n, want int64 = 0, -1
			var last time.Time
			wctx := ctx
			for want < 0 || n < want {
				wcs, err := sv.wait(wctx)
				if err != nil && wctx == ctx && ctx.Err() != nil {
					select {
					case want = <-target:
					default: // the client gave up
						rxc <- rx{n: n, err: err}
						return
					}
					var stop context.CancelFunc
					wctx, stop = context.WithTimeout(context.Background(), ioTimeout)
					defer stop()
					continue
				}
				if err != nil {
					rxc <- rx{n: n, err: err}
					return
				}
				last = time.Now()
				for _, wc := range wcs {
					if wc.ByteLen != uint32(size) {
						rxc <- rx{n: n, err: fmt.Errorf("softefa: received %d bytes, sent %d", wc.ByteLen, size)}
						return
					}
					n++
					if err := sv.recv(int(wc.WRID), size); err != nil {
						rxc <- rx{n: n, err: err}
						return
					}
				}
			}
			rxc <- rx{n: n, end: last}
		}()
	}
	qpn := sv.qp.QPN()
	out, next := 0, uint64(0)
	start := time.Now()
	var end time.Time
	for sending := true; ; {
		if sending && time.Since(start) >= d {
			sending = false
		}
		if !sending && out == 0 {
			break
		}
		if !sending && time.Since(start) > d+ioTimeout {
			return res, fmt.Errorf("softefa: %d sends still outstanding %v after the last was posted", out, ioTimeout)
		}
		if sending && out < sfDepth {
			k := min(sfDepth-out, 32)
			err := cl.post(k, qpn, next, func(x *verbs.QPEx, i int) {
				off := int(next+uint64(i)) % slots * size
				if write {
					x.WRRDMAWrite(sv.mr.RKey(), sv.mr.Addr()+uint64(off))
				} else {
					x.WRSend()
				}
				x.WRSetSGE(cl.mr.LKey(), cl.mr.Addr()+uint64(off), uint32(size))
			})
			if err != nil {
				return res, err
			}
			out += k
			next += uint64(k)
		}
		wcs, err := cl.wait(ctx)
		if err != nil {
			if ctx.Err() != nil {
				err = errStalled // the watchdog's doing
			}
			cancel()
			select {
			case r := <-rxc: // the server's failure is the cause, unless it only saw the cancel
				if r.err != nil && !errors.Is(r.err, context.Canceled) {
					err = r.err
				}
			case <-time.After(100 * time.Millisecond):
			}
			return res, err
		}
		out -= len(wcs)
		progress.Add(int64(len(wcs)))
		res.msgs += int64(len(wcs))
		end = time.Now()
	}
	if showCounters {
		fmt.Fprintf(os.Stderr, "\nclient %+v\nserver %+v\npaths %+v\n", cl.ctx.Counters(), sv.ctx.Counters(), cl.ctx.PathStats())
	}
	if write { // a WRITE completes once the data is placed at the responder
		res.elapsed = end.Sub(start)
		return res, nil
	}
	target <- res.msgs
	cancel()
	var r rx
	select {
	case r = <-rxc:
	case <-time.After(2 * ioTimeout):
		return res, errStalled
	}
	if r.err != nil {
		return res, r.err
	}
	if r.n != res.msgs {
		return res, fmt.Errorf("softefa: %d sends completed, %d received", res.msgs, r.n)
	}
	res.elapsed = r.end.Sub(start)
	return res, nil
}

func (t softefaTransport) pingpong(size, n int, via router) ([]time.Duration, error) {
	p, err := t.pair(1<<20, via, false)
	if err != nil {
		return nil, err
	}
	defer p.close()
	cl, sv := p.cl, p.sv
	for i := range 8 {
		if err := sv.recv(i, size); err != nil {
			return nil, err
		}
		if err := cl.recv(i, size); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var progress atomic.Int64
	go watchdog(ctx, cancel, &progress)
	echoErr := make(chan error, 1)
	go func() { // the server answers every message it receives
		clQPN := cl.qp.QPN()
		for {
			wcs, err := sv.wait(ctx)
			if err != nil {
				if ctx.Err() != nil {
					err = nil
				}
				echoErr <- err
				return
			}
			for _, wc := range wcs {
				if wc.Opcode != verbs.WCRecv {
					continue
				}
				if err := sv.recv(int(wc.WRID), size); err != nil {
					echoErr <- err
					return
				}
				if err := sv.post(1, clQPN, 0, func(x *verbs.QPEx, _ int) {
					x.WRSend()
					x.WRSetSGE(sv.mr.LKey(), sv.mr.Addr(), uint32(size))
				}); err != nil {
					echoErr <- err
					return
				}
			}
		}
	}()
	defer func() { cancel(); <-echoErr }()
	svQPN := sv.qp.QPN()
	rtts := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		if err := cl.post(1, svQPN, 0, func(x *verbs.QPEx, _ int) {
			x.WRSend()
			x.WRSetSGE(cl.mr.LKey(), cl.mr.Addr(), uint32(size))
		}); err != nil {
			return nil, err
		}
		for need := 2; need > 0; { // our send's completion and the answer
			wcs, err := cl.wait(ctx)
			if err != nil {
				if ctx.Err() != nil {
					err = errStalled // the watchdog's doing
				}
				select {
				case e := <-echoErr:
					if e != nil {
						err = e
					}
				default:
				}
				return nil, err
			}
			for _, wc := range wcs {
				if wc.Opcode == verbs.WCRecv {
					if err := cl.recv(int(wc.WRID), size); err != nil {
						return nil, err
					}
				}
				need--
			}
		}
		rtts = append(rtts, time.Since(t0))
		progress.Add(1)
	}
	return rtts, nil
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

// showCounters prints both devices' counters and the client's path statistics after each
// softefa stream run (--counters).
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
