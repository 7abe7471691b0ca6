package verbs_test

import (
	"cmp"
	"errors"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

const qkey = 0x11111111

// end is one side of a same-device exchange: a context (possibly shared), PD, CQ, MR and QP.
type end struct {
	t   testing.TB
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
	mr  *verbs.MR
	buf []byte
	qp  *verbs.QP
	x   *verbs.QPEx
	ah  *verbs.AH // to the peer's GID, in this end's PD

	closed bool
}

type loopOpts struct {
	sameCtx   bool
	typ       verbs.QPType // default SRD
	size      int          // MR bytes; default 4096
	access    verbs.AccessFlags
	qpFlags   efadv.QPFlags
	cap       verbs.QPCap
	cqWCFlags efadv.WCExFlags
	rnrRetry  int // -1 leaves the default (7)
	noAH      bool
	cqe       int // CQ entries; default 256
	cfg       func(*config.Device)
	iova      uint64 // the MR's address for the device, if not the buffer's own
}

// newLoop makes two ends on one device at RTS, in one context or two.
func newLoop(t testing.TB, o loopOpts) (a, b *end) {
	t.Helper()
	dev := newDevice(t, o.cfg)
	if o.size == 0 {
		o.size = 4096
	}
	if o.typ == 0 {
		o.typ = verbs.QPTDriver
	}
	if o.cap == (verbs.QPCap{}) {
		o.cap = verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 32}
	}
	ctxA := openCtx(t, dev)
	ctxB := ctxA
	if !o.sameCtx {
		ctxB = openCtx(t, dev)
	}
	a, b = newEnd(t, ctxA, o), newEnd(t, ctxB, o)
	if !o.noAH {
		a.ah = a.makeAH(dev.GID())
		b.ah = b.makeAH(dev.GID())
	}
	return a, b
}

func newEnd(t testing.TB, ctx *verbs.Context, o loopOpts) *end {
	t.Helper()
	e := &end{t: t, ctx: ctx}
	e.pd = must[*verbs.PD](t)(ctx.AllocPD())
	if o.cqWCFlags != 0 {
		e.cq = must[*verbs.CQ](t)(efadv.CreateCQ(ctx, &verbs.CQInitAttrEx{CQE: 256, WCFlags: verbs.WCStandardFlags},
			&efadv.CQInitAttr{WCFlags: o.cqWCFlags}))
	} else {
		e.cq = must[*verbs.CQ](t)(ctx.CreateCQ(cmp.Or(o.cqe, 256), nil, nil, 0))
	}
	e.buf = make([]byte, o.size)
	if o.iova != 0 {
		e.mr = must[*verbs.MR](t)(e.pd.RegMRIOVA(e.buf, o.iova, verbs.AccessLocalWrite|o.access))
	} else {
		e.mr = must[*verbs.MR](t)(e.pd.RegMR(e.buf, verbs.AccessLocalWrite|o.access))
	}
	attr := verbs.QPInitAttrEx{SendCQ: e.cq, RecvCQ: e.cq, QPType: o.typ, PD: e.pd, Cap: o.cap,
		CompMask: verbs.QPInitAttrPD | verbs.QPInitAttrSendOpsFlags, SendOpsFlags: verbs.SendOpsSend | verbs.SendOpsSendWithImm}
	if o.typ == verbs.QPTUD {
		e.qp = must[*verbs.QP](t)(ctx.CreateQPEx(&attr))
	} else {
		attr.SendOpsFlags |= verbs.SendOpsRDMARead | verbs.SendOpsRDMAWrite | verbs.SendOpsRDMAWriteWithImm
		e.qp = must[*verbs.QP](t)(efadv.CreateQPEx(ctx, &attr, &efadv.QPInitAttr{Flags: o.qpFlags,
			WRFlags: efadv.WRExWithProcessingHints}))
	}
	e.x, _ = e.qp.ToQPEx() // nil for a QP without send ops
	e.toRTS(o.rnrRetry)
	t.Cleanup(e.close)
	return e
}

func (e *end) toRTS(rnr int) {
	e.t.Helper()
	check(e.t, e.qp.Modify(&verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: qkey},
		verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrQKey))
	check(e.t, e.qp.Modify(&verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState))
	rts := verbs.QPAttr{QPState: verbs.QPSRTS, SQPSN: 1}
	mask := verbs.QPAttrState | verbs.QPAttrSQPSN
	if rnr >= 0 && e.qp.Type() == verbs.QPTDriver {
		rts.RNRRetry, mask = uint8(rnr), mask|verbs.QPAttrRNRRetry
	}
	check(e.t, e.qp.Modify(&rts, mask))
}

func (e *end) makeAH(g verbs.GID) *verbs.AH {
	return must[*verbs.AH](e.t)(e.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: g}, PortNum: 1}))
}

func (e *end) close() {
	if e.closed {
		return
	}
	e.closed = true
	if e.ah != nil {
		check(e.t, e.ah.Destroy())
	}
	if e.qp != nil {
		check(e.t, e.qp.Destroy())
	}
	check(e.t, e.mr.Dereg())
	check(e.t, e.cq.Destroy())
	check(e.t, e.pd.Dealloc())
}

// recv posts a receive of buf[off:off+n] with the given wr_id.
func (e *end) recv(wrid uint64, off, n int) {
	e.t.Helper()
	if _, err := e.qp.PostRecv([]verbs.RecvWR{{WRID: wrid, SGList: []verbs.SGE{e.mr.SGE(off, n)}}}); err != nil {
		e.t.Fatal(err)
	}
}

// post runs one QPEx session with one WR built by build, to peer's QP.
func (e *end) post(wrid uint64, peer *end, build func(x *verbs.QPEx)) error {
	e.x.WRStart()
	e.x.WRID, e.x.WRFlags = wrid, verbs.SendSignaled
	build(e.x)
	e.x.WRSetUDAddr(e.ah, peer.qp.QPN(), qkey)
	return e.x.WRComplete()
}

// sendAH posts a signaled SEND of n bytes from the buffer's start to QP qpn behind ah.
func (e *end) sendAH(wrid uint64, ah *verbs.AH, qpn uint32, n int) {
	e.t.Helper()
	e.x.WRStart()
	e.x.WRID, e.x.WRFlags = wrid, verbs.SendSignaled
	e.x.WRSend()
	e.x.WRSetUDAddr(ah, qpn, qkey)
	e.x.WRSetSGE(e.mr.LKey(), e.mr.Addr(), uint32(n))
	check(e.t, e.x.WRComplete())
}

func (e *end) send(wrid uint64, peer *end, off, n int) {
	e.t.Helper()
	check(e.t, e.post(wrid, peer, func(x *verbs.QPEx) {
		x.WRSend()
		x.WRSetSGE(e.mr.LKey(), e.mr.Addr()+uint64(off), uint32(n))
	}))
}

// one waits for exactly one completion on e's CQ.
func (e *end) one() verbs.WC {
	e.t.Helper()
	return waitWC(e.t, e.cq, 1)[0]
}

// empty checks that e's CQ has nothing to poll.
func (e *end) empty() {
	e.t.Helper()
	var wc [1]verbs.WC
	if n, err := e.cq.Poll(wc[:]); n != 0 || err != nil {
		e.t.Fatalf("unexpected completion %+v (%v)", wc[0], err)
	}
}

func waitWC(t testing.TB, cq *verbs.CQ, n int) []verbs.WC {
	t.Helper()
	out := make([]verbs.WC, 0, n)
	buf := make([]verbs.WC, n)
	deadline := time.Now().Add(20 * time.Second)
	for spins := 0; len(out) < n; spins++ {
		k, err := cq.Poll(buf[:n-len(out)])
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		out = append(out, buf[:k]...)
		if k > 0 {
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d completions after 20 s", len(out), n)
		}
		if waitHook != nil {
			waitHook()
			continue
		}
		if spins < 1000 {
			runtime.Gosched()
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
	return out
}

// waitDropped polls cq until it has dropped n more entries (EINVAL: entries a destroyed QP left)
// and returns the last error; a completion delivered instead fails the test.
func waitDropped(t testing.TB, cq *verbs.CQ, n int) error {
	t.Helper()
	want := cq.BadCompletions() + uint64(n)
	var wc [1]verbs.WC
	var last error
	deadline := time.Now().Add(20 * time.Second)
	for spins := 0; cq.BadCompletions() < want; spins++ {
		k, err := cq.Poll(wc[:])
		if k > 0 {
			t.Fatalf("completion %+v, want only entries dropped", wc[0])
		}
		if err != nil {
			if !errors.Is(err, syscall.EINVAL) {
				t.Fatalf("poll: %v", err)
			}
			last = err
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d entries dropped after 20 s", n-int(want-cq.BadCompletions()), n)
		}
		if waitHook != nil {
			waitHook()
			continue
		}
		if spins < 1000 {
			runtime.Gosched()
		} else {
			time.Sleep(10 * time.Microsecond)
		}
	}
	return last
}

// spinOne polls cq into wc until it holds one successful completion. It allocates nothing, for
// the tests that count allocations; wc must outlive the calls (a caller's array).
func spinOne(t testing.TB, cq *verbs.CQ, wc []verbs.WC) {
	for {
		if n, _ := cq.Poll(wc[:1]); n == 1 {
			if wc[0].Status != verbs.WCSuccess {
				t.Fatalf("completion %+v", wc[0])
			}
			return
		}
		runtime.Gosched()
	}
}

func wantWC(t testing.TB, wc verbs.WC, wrid uint64, st verbs.WCStatus, op verbs.WCOpcode) {
	t.Helper()
	if wc.WRID != wrid || wc.Status != st || wc.Opcode != op {
		t.Fatalf("completion %+v: want wr_id %#x status %v (%d) opcode %v", wc, wrid, st, st, op)
	}
}

func errorsIs(err error, target error) bool { return errors.Is(err, target) }

func runtimeGosched() { runtime.Gosched() }

// waitHook, when set, is what waitWC does while it waits instead of yielding: a simulation
// drives its devices and moves its clock there (simExchange).
var waitHook func()
