package efadv_test

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/internal/testkit"
	"github.com/softefa/softefa/verbs"
)

// The harness mirrors rdma-core's tests/efa_base.py SRDResources: two contexts on one device,
// each with a PD, one CQ for send and receive, an MR, and QPs brought to RTS.

const (
	srdQKey = 0x11111111
	immData = 0x12345678
)

func newDevice(t testing.TB, mod func(*config.Device)) *verbs.Device {
	t.Helper()
	return testkit.Device(t, mod)
}

type srdOpts struct {
	qpCount   int
	msgSize   int
	access    verbs.AccessFlags
	sendOps   verbs.SendOpsFlags
	qpFlags   efadv.QPFlags
	cqWCFlags efadv.WCExFlags // non-zero makes an efadv CQ
	channel   bool
}

type srdRes struct {
	t       testing.TB
	ctx     *verbs.Context
	pd      *verbs.PD
	cq      *verbs.CQ
	ch      *verbs.CompChannel
	mr      *verbs.MR
	buf     []byte
	qps     []*verbs.QP
	psn     uint32
	gid     verbs.GID
	ahs     []*verbs.AH
	remote  *srdRes
	sentImm bool
}

func newSRD(t testing.TB, dev *verbs.Device, o srdOpts) *srdRes {
	t.Helper()
	if o.qpCount == 0 {
		o.qpCount = 8
	}
	ctx, err := dev.Open()
	if err != nil {
		t.Fatal(err)
	}
	r := &srdRes{t: t, ctx: ctx, psn: rand.Uint32() & 0xffffff}
	r.gid, err = ctx.QueryGID(1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if o.channel {
		if r.ch, err = ctx.CreateCompChannel(); err != nil {
			t.Fatal(err)
		}
	}
	if o.cqWCFlags != 0 {
		r.cq, err = efadv.CreateCQ(ctx, &verbs.CQInitAttrEx{CQE: 1000, Channel: r.ch, WCFlags: verbs.WCStandardFlags},
			&efadv.CQInitAttr{WCFlags: o.cqWCFlags})
	} else {
		r.cq, err = ctx.CreateCQ(1000, nil, r.ch, 0)
	}
	if err != nil {
		t.Fatal(err)
	}
	r.buf = make([]byte, max(o.msgSize, 1))
	if r.mr, err = r.pd.RegMR(r.buf, verbs.AccessLocalWrite|o.access); err != nil {
		t.Fatal(err)
	}
	r.buf = r.buf[:o.msgSize]
	for range o.qpCount {
		attr := verbs.QPInitAttrEx{
			SendCQ: r.cq, RecvCQ: r.cq, QPType: verbs.QPTDriver, PD: r.pd,
			Cap:      verbs.QPCap{MaxSendWR: 1000, MaxRecvWR: 1000, MaxSendSGE: 1, MaxRecvSGE: 1},
			CompMask: verbs.QPInitAttrPD,
		}
		if o.sendOps != 0 {
			attr.CompMask |= verbs.QPInitAttrSendOpsFlags
			attr.SendOpsFlags = o.sendOps
		}
		qp, err := efadv.CreateQPEx(ctx, &attr, &efadv.QPInitAttr{DriverQPType: efadv.QPDriverTypeSRD, Flags: o.qpFlags})
		if err != nil {
			t.Fatal(err)
		}
		r.qps = append(r.qps, qp)
	}
	t.Cleanup(r.close)
	return r
}

func (r *srdRes) close() {
	for _, ah := range r.ahs {
		check(r.t, ah.Destroy())
	}
	for _, qp := range r.qps {
		check(r.t, qp.Destroy())
	}
	check(r.t, r.mr.Dereg())
	check(r.t, r.cq.Destroy())
	if r.ch != nil {
		check(r.t, r.ch.Destroy())
	}
	check(r.t, r.pd.Dealloc())
	check(r.t, r.ctx.Close())
}

func check(t testing.TB, err error) {
	t.Helper()
	testkit.Check(t, err)
}

// toRTS brings every QP up as efa_base.py's SRDQPEx does: INIT with STATE|PKEY_INDEX|PORT|QKEY,
// RTR with STATE, RTS with STATE|SQ_PSN.
func (r *srdRes) toRTS(rpsn uint32) {
	r.t.Helper()
	for _, qp := range r.qps {
		steps := []struct {
			attr verbs.QPAttr
			mask verbs.QPAttrMask
		}{
			{verbs.QPAttr{QPState: verbs.QPSInit, PKeyIndex: 0, PortNum: 1, QKey: srdQKey},
				verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey},
			{verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState},
			{verbs.QPAttr{QPState: verbs.QPSRTS, SQPSN: rpsn}, verbs.QPAttrState | verbs.QPAttrSQPSN},
		}
		for _, s := range steps {
			if err := qp.Modify(&s.attr, s.mask); err != nil {
				r.t.Fatalf("QP %d to %v: %v", qp.QPN(), s.attr.QPState, err)
			}
		}
	}
}

// pair makes a client and a server on one device, both at RTS, each with an AH for the other.
func pair(t testing.TB, dev *verbs.Device, o srdOpts) (client, server *srdRes) {
	t.Helper()
	client, server = newSRD(t, dev, o), newSRD(t, dev, o)
	client.remote, server.remote = server, client
	client.toRTS(server.psn)
	server.toRTS(client.psn)
	client.makeAH(server.gid)
	server.makeAH(client.gid)
	return client, server
}

func (r *srdRes) makeAH(gid verbs.GID) *verbs.AH {
	r.t.Helper()
	ah, err := r.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: gid}, PortNum: 1})
	if err != nil {
		r.t.Fatal(err)
	}
	r.ahs = append(r.ahs, ah)
	return ah
}

// backoff paces a poll loop: it yields to the device goroutine, then naps briefly, and fails the
// test after 20 s (virtual time in a synctest bubble) rather than hang.
type backoff struct {
	t        testing.TB
	deadline time.Time
	spins    int
}

func newBackoff(t testing.TB) *backoff {
	return &backoff{t: t, deadline: time.Now().Add(20 * time.Second)}
}

func (b *backoff) wait(what string) {
	b.t.Helper()
	if time.Now().After(b.deadline) {
		b.t.Fatalf("no %s after 20 s", what)
	}
	if b.spins++; b.spins < 1000 {
		runtime.Gosched()
	} else {
		time.Sleep(10 * time.Microsecond)
	}
}

// waitWC polls cq until n completions arrived.
func waitWC(t testing.TB, cq *verbs.CQ, n int) []verbs.WC {
	t.Helper()
	out := make([]verbs.WC, 0, n)
	buf := make([]verbs.WC, n)
	b := newBackoff(t)
	for len(out) < n {
		k, err := cq.Poll(buf[:n-len(out)])
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		out = append(out, buf[:k]...)
		if k == 0 {
			b.wait(fmt.Sprintf("completion %d of %d", len(out)+1, n))
		}
	}
	return out
}

func wantSuccess(t testing.TB, wcs []verbs.WC) {
	t.Helper()
	for _, wc := range wcs {
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("completion %+v: status %v", wc, wc.Status)
		}
	}
}

func wantErrno(t testing.TB, err error, want syscall.Errno) {
	t.Helper()
	testkit.WantErrno(t, err, want)
}

// ahn returns the device's number for ah (efadv_query_ah).
func ahn(t testing.TB, ah *verbs.AH) uint16 {
	t.Helper()
	a, err := efadv.QueryAH(ah)
	if err != nil {
		t.Fatal(err)
	}
	return a.AHN
}

func fill(b []byte, c byte) { copy(b, bytes.Repeat([]byte{c}, len(b))) }

// postRecv posts one receive covering the MR on qp.
func (r *srdRes) postRecv(qp *verbs.QP) {
	r.t.Helper()
	if _, err := qp.PostRecv([]verbs.RecvWR{{WRID: 0xa, SGList: []verbs.SGE{r.mr.SGE(0, len(r.buf))}}}); err != nil {
		r.t.Fatal(err)
	}
}

// sendEx posts a new-API send of the MR to the peer's QP i, as utils.post_send_ex does.
func (r *srdRes) sendEx(i int, op verbs.WROpcode) {
	r.t.Helper()
	x, err := r.qps[i].ToQPEx()
	check(r.t, err)
	x.WRStart()
	x.WRID, x.WRFlags = 0x123, verbs.SendSignaled
	switch op {
	case verbs.WRSend:
		x.WRSend()
	case verbs.WRSendWithImm:
		x.WRSendImm(immData)
	case verbs.WRRDMAWriteWithImm:
		x.WRRDMAWriteImm(r.remote.mr.RKey(), r.remote.mr.Addr(), immData)
	}
	x.WRSetUDAddr(r.ahs[0], r.remote.qps[i].QPN(), srdQKey)
	x.WRSetSGE(r.mr.LKey(), r.mr.Addr(), uint32(len(r.buf)))
	if err := x.WRComplete(); err != nil {
		r.t.Fatal(err)
	}
}

// sendOld posts an ibv_post_send SEND (or SEND_WITH_IMM) of the MR to the peer's QP i.
func (r *srdRes) sendOld(i int, op verbs.WROpcode) {
	r.t.Helper()
	wr := verbs.SendWR{
		WRID: 0x123, SGList: []verbs.SGE{r.mr.SGE(0, len(r.buf))}, Opcode: op, SendFlags: verbs.SendSignaled,
		AH: r.ahs[0], RemoteQPN: r.remote.qps[i].QPN(), RemoteQKey: srdQKey, ImmData: immData,
	}
	if _, err := r.qps[i].PostSend([]verbs.SendWR{wr}); err != nil {
		r.t.Fatal(err)
	}
}

// traffic is efa_base.py's traffic(): for each iteration and QP, the client sends 'c's, both CQs
// are polled, the server reposts its receive and checks its buffer, then the server sends 's's
// back and the client checks.
func traffic(t testing.TB, client, server *srdRes, iters int, send func(r *srdRes, i int)) {
	t.Helper()
	for i := range client.qps {
		client.postRecv(client.qps[i])
		server.postRecv(server.qps[i])
	}
	for range iters {
		for i := range client.qps {
			fill(client.buf, 'c')
			send(client, i)
			pollBoth(t, client, server)
			server.postRecv(server.qps[i])
			wantBuf(t, server.buf, 'c')
			fill(server.buf, 's')
			send(server, i)
			pollBoth(t, server, client)
			client.postRecv(client.qps[i])
			wantBuf(t, client.buf, 's')
		}
	}
}

// pollBoth waits for the sender's send completion and the receiver's receive completion and
// checks them as the harness does: success, and the immediate with WITH_IMM when one was sent.
func pollBoth(t testing.TB, sender, receiver *srdRes) {
	t.Helper()
	s := waitCQ(t, sender, 1)
	wantSuccess(t, s)
	r := waitCQ(t, receiver, 1)
	wantSuccess(t, r)
	if sender.sentImm {
		if r[0].WCFlags&verbs.WCWithImm == 0 || r[0].ImmData != immData {
			t.Fatalf("receive %+v: want immediate %#x", r[0], immData)
		}
	}
}

// waitCQ waits for n completions on r's CQ, through its completion channel when it has one.
func waitCQ(t testing.TB, r *srdRes, n int) []verbs.WC {
	t.Helper()
	if r.ch == nil {
		return waitWC(t, r.cq, n)
	}
	var out []verbs.WC
	buf := make([]verbs.WC, n)
	for len(out) < n {
		cq, err := r.ch.GetCQEvent(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		cq.AckEvents(1)
		if err := cq.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		k, err := cq.Poll(buf[:n-len(out)])
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, buf[:k]...)
	}
	return out
}

func wantBuf(t testing.TB, b []byte, c byte) {
	t.Helper()
	for i, x := range b {
		if x != c {
			t.Fatalf("byte %d is %q, want %q", i, x, c)
		}
	}
}
