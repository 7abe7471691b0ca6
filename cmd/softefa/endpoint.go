package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

// endpoint is one side of a perf or pingpong run: a device, a context with one CQ and one MR,
// and n QPs of one type at RTS.
type endpoint struct {
	dev     *verbs.Device
	ownsDev bool
	ctx     *verbs.Context
	pd      *verbs.PD
	cq      *verbs.CQ
	mr      *verbs.MR
	buf     []byte
	qps     []*verbs.QP
	ah      *verbs.AH // to the peer
	wc      []verbs.WC
	ch      *verbs.CompChannel // completion events, for a side that waits instead of spinning
	// sleepAfter: how long poll spins on an empty CQ before it sleeps until a completion event
	// (0: it spins until its timeout). The demo plays both sides on one goroutine: while it
	// spins, the other device's receive goroutine runs only if Go has a second processor for it
	// (with GOMAXPROCS 1 a spinning goroutine keeps the network poller from running, and each
	// transfer waited for a timer, about a millisecond).
	sleepAfter time.Duration

	pending []verbs.WC // completions polled and not yet taken (pingpong)
}

const perfQKey = 0x50e1f

type endpointConfig struct {
	addr    string
	typ     verbs.QPType
	qps     int
	bufSize int
	depth   int // send and receive queue depth per QP
	paths   int
	pathMTU int
	events  bool // give the CQ a completion channel
	// sleepAfter: poll sleeps on completion events after spinning this long (endpoint.sleepAfter);
	// needs events.
	sleepAfter time.Duration
	key        []byte // authenticated encryption

	rxSpin         time.Duration // config.Device's settings of the same names
	noSparseCopies bool
	noOffload      bool
}

func newEndpoint(c endpointConfig) (*endpoint, error) {
	cfg := config.Device{Paths: c.paths, PathMTU: c.pathMTU, Key: c.key, RxSpin: c.rxSpin,
		NoSparseCopies: c.noSparseCopies, NoOffload: c.noOffload}
	if c.addr != "" {
		ap, err := parseAddr(c.addr)
		if err != nil {
			return nil, err
		}
		cfg.Addr = ap
	}
	dev, err := verbs.NewDevice(cfg)
	if err != nil {
		return nil, err
	}
	e := &endpoint{dev: dev, ownsDev: true, wc: make([]verbs.WC, 64), sleepAfter: c.sleepAfter}
	if err := e.setup(c); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// endpointOn makes an endpoint with a context of its own on a device it does not own.
func endpointOn(dev *verbs.Device, c endpointConfig) (*endpoint, error) {
	e := &endpoint{dev: dev, wc: make([]verbs.WC, 64), sleepAfter: c.sleepAfter}
	if err := e.setup(c); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

func (e *endpoint) setup(c endpointConfig) error {
	var err error
	if e.ctx, err = e.dev.Open(); err != nil {
		return err
	}
	if e.pd, err = e.ctx.AllocPD(); err != nil {
		return err
	}
	if c.events {
		if e.ch, err = e.ctx.CreateCompChannel(); err != nil {
			return err
		}
	}
	if e.cq, err = e.ctx.CreateCQ(min(2*c.depth*c.qps+16, 32768), nil, e.ch, 0); err != nil {
		return err
	}
	e.buf = make([]byte, max(c.bufSize, 64))
	if e.mr, err = e.pd.RegMR(e.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead); err != nil {
		return err
	}
	for range c.qps {
		attr := verbs.QPInitAttrEx{
			SendCQ: e.cq, RecvCQ: e.cq, QPType: c.typ, PD: e.pd,
			Cap:      verbs.QPCap{MaxSendWR: uint32(c.depth), MaxRecvWR: uint32(c.depth), MaxSendSGE: 1, MaxRecvSGE: 1},
			CompMask: verbs.QPInitAttrPD | verbs.QPInitAttrSendOpsFlags,
		}
		var qp *verbs.QP
		if c.typ == verbs.QPTUD {
			attr.SendOpsFlags = verbs.SendOpsSend | verbs.SendOpsSendWithImm
			qp, err = e.ctx.CreateQPEx(&attr)
		} else {
			attr.SendOpsFlags = verbs.SendOpsSend | verbs.SendOpsSendWithImm | verbs.SendOpsRDMAWrite |
				verbs.SendOpsRDMAWriteWithImm | verbs.SendOpsRDMARead
			qp, err = efadv.CreateQPEx(e.ctx, &attr, &efadv.QPInitAttr{DriverQPType: efadv.QPDriverTypeSRD})
		}
		if err != nil {
			return err
		}
		e.qps = append(e.qps, qp)
		if err := toRTS(qp); err != nil {
			return err
		}
	}
	return nil
}

func toRTS(qp *verbs.QP) error {
	steps := []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{
		{verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: perfQKey},
			verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{QPState: verbs.QPSRTS, SQPSN: rand.Uint32() & 0xffffff}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	}
	for _, s := range steps {
		if err := qp.Modify(&s.a, s.m); err != nil {
			return err
		}
	}
	return nil
}

// connect makes the AH to the peer's GID.
func (e *endpoint) connect(peer verbs.GID) error {
	var err error
	e.ah, err = e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: peer}, PortNum: 1})
	return err
}

func (e *endpoint) close() {
	if e.ctx != nil {
		for _, f := range []func() error{
			func() error { return destroyIf(e.ah != nil, e.ah.Destroy) },
			func() error {
				for _, qp := range e.qps {
					if err := qp.Destroy(); err != nil {
						return err
					}
				}
				return nil
			},
			func() error { return destroyIf(e.mr != nil, e.mr.Dereg) },
			func() error { return destroyIf(e.cq != nil, e.cq.Destroy) },
			func() error { return destroyIf(e.ch != nil, e.ch.Destroy) },
			func() error { return destroyIf(e.pd != nil, e.pd.Dealloc) },
			e.ctx.Close,
		} {
			_ = f()
		}
	}
	if e.ownsDev {
		_ = e.dev.Close()
	}
}

func destroyIf(ok bool, f func() error) error {
	if !ok {
		return nil
	}
	return f()
}

// post runs one QPEx session with one WR to the peer's QP qpn.
func (e *endpoint) post(qp *verbs.QP, wrid uint64, qpn uint32, build func(x *verbs.QPEx)) error {
	return e.postN(qp, 1, wrid, qpn, build)
}

// postN posts n WRs, each with WR id wrid and built by build, in one session (one doorbell).
func (e *endpoint) postN(qp *verbs.QP, n int, wrid uint64, qpn uint32, build func(x *verbs.QPEx)) error {
	x, err := qp.ToQPEx()
	if err != nil {
		return err
	}
	x.WRStart()
	for range n {
		x.WRID, x.WRFlags = wrid, verbs.SendSignaled
		build(x)
		x.WRSetUDAddr(e.ah, qpn, perfQKey)
	}
	return x.WRComplete()
}

func (e *endpoint) recv(qp *verbs.QP, wrid uint64, off, n int) error {
	_, err := qp.PostRecv([]verbs.RecvWR{{WRID: wrid, SGList: []verbs.SGE{e.mr.SGE(off, n)}}})
	return err
}

var errTimeout = errors.New("no completion within the timeout")

// poll returns the completions available now, waiting (spinning, then yielding) up to timeout
// for at least one; a completion with an error status is returned as an error after the others.
func (e *endpoint) poll(timeout time.Duration) ([]verbs.WC, error) {
	var start, deadline time.Time
	for spins := 0; ; spins++ {
		n, err := e.cq.Poll(e.wc)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			for _, wc := range e.wc[:n] {
				if wc.Status != verbs.WCSuccess {
					return e.wc[:n], fmt.Errorf("wr_id %d: %v (EFA status %d)", wc.WRID, wc.Status, wc.VendorErr)
				}
			}
			return e.wc[:n], nil
		}
		if spins&7 == 0 { // (an empty poll reads the socket: 8 are some 15 µs)
			now := time.Now()
			switch {
			case deadline.IsZero():
				start, deadline = now, now.Add(timeout)
			case now.After(deadline):
				return nil, errTimeout
			case e.sleepAfter > 0 && now.Sub(start) > e.sleepAfter:
				if err := e.sleep(deadline); err != nil {
					return nil, err
				}
				continue
			}
		}
		if spins&63 == 63 {
			runtime.Gosched() // (with one Go processor, nothing else of the process runs otherwise)
		}
	}
}

// sleep waits, until deadline at the latest, for the CQ's next completion event (an arm with
// completions not yet polled raises one at once: nothing that came before it is waited for).
func (e *endpoint) sleep(deadline time.Time) error {
	if err := e.cq.ReqNotify(false); err != nil {
		return err
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cq, err := e.ch.GetCQEvent(ctx)
	if err == context.DeadlineExceeded {
		return nil // poll reports the timeout
	}
	if err != nil {
		return err
	}
	cq.AckEvents(1)
	return nil
}

// waitEvent blocks until the CQ's next completion event (or ctx's end), re-arming it: the
// passive side of a test waits this way when no completion has come for a while (passiveSpin),
// so that an idle server leaves the CPU alone.
func (e *endpoint) waitEvent(ctx context.Context) error {
	cq, err := e.ch.GetCQEvent(ctx)
	if err != nil {
		return err
	}
	cq.AckEvents(1)
	return cq.ReqNotify(false)
}
