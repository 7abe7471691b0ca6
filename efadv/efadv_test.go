package efadv_test

import (
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/internal/testkit"
	"github.com/softefa/softefa/verbs"
)

// Go ports of rdma-core's tests/test_efadv.py, and checks of every efadv call's output.

func openCtx(t *testing.T, dev *verbs.Device) *verbs.Context {
	t.Helper()
	return testkit.Context(t, dev)
}

// EfaQueryDeviceTest.test_efadv_query, with the values checked.
func TestEfadvQuery(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil))
	a, err := efadv.QueryDevice(ctx)
	if err != nil {
		t.Fatal(err)
	}
	def := config.Default()
	want := efadv.DeviceAttr{
		MaxSQWR: uint32(def.MaxSQWR), MaxRQWR: uint32(def.MaxRQWR), MaxSQSGE: 2, MaxRQSGE: 2,
		InlineBufSize: 32, InlineBufSizeEx: 80, MaxRDMASize: 1 << 30,
		DeviceCaps: efadv.DeviceAttrCapsRDMARead | efadv.DeviceAttrCapsRNRRetry | efadv.DeviceAttrCapsCQWithSGID |
			efadv.DeviceAttrCapsRDMAWrite | efadv.DeviceAttrCapsUnsolicitedWriteRecv,
	}
	if a != want {
		t.Fatalf("efadv_query_device = %+v, want %+v", a, want)
	}
}

// The inlen rules of efadv_query_device: ≤22 EINVAL; 23..24 no caps; 25..28 caps without the
// RDMA bits and no max_rdma_size; more, everything.
func TestEfadvQueryInlen(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil))
	_, err := efadv.QueryDeviceLen(ctx, 22)
	wantErrno(t, err, syscall.EINVAL)
	a, _ := efadv.QueryDeviceLen(ctx, 24)
	if a.DeviceCaps != 0 || a.MaxRDMASize != 0 || a.InlineBufSizeEx != 80 {
		t.Fatalf("inlen 24: %+v", a)
	}
	a, _ = efadv.QueryDeviceLen(ctx, 28)
	if a.DeviceCaps&(efadv.DeviceAttrCapsRDMARead|efadv.DeviceAttrCapsRDMAWrite) != 0 || a.MaxRDMASize != 0 ||
		a.DeviceCaps&efadv.DeviceAttrCapsRNRRetry == 0 {
		t.Fatalf("inlen 28: %+v", a)
	}
	a, _ = efadv.QueryDeviceLen(ctx, 29)
	if a.DeviceCaps&efadv.DeviceAttrCapsRDMARead == 0 || a.MaxRDMASize == 0 {
		t.Fatalf("inlen 29: %+v", a)
	}
	if _, err := efadv.QueryAHLen(nil, 8); err == nil {
		t.Fatal("query_ah inlen 8 accepted")
	}
	if _, err := efadv.QueryMRLen(nil, 14); err == nil {
		t.Fatal("query_mr inlen 14 accepted")
	}
	if _, err := efadv.QueryCQLen(nil, 20); err == nil {
		t.Fatal("query_cq inlen 20 accepted")
	}
	if _, _, err := efadv.QueryQPWQsLen(nil, 32); err == nil {
		t.Fatal("query_qp_wqs inlen 32 accepted")
	}
}

// EfaAHTest.test_efadv_query_ah: an AH to the device's own GID on a new PD; efadv_query_ah gives
// its number.
func TestEfadvQueryAH(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil))
	port, err := ctx.QueryPort(1)
	if err != nil || port.GIDTblLen == 0 {
		t.Fatalf("port: %+v %v", port, err)
	}
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	gid, _ := ctx.QueryGID(1, 0)
	ah, err := pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: gid}, PortNum: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ah.Destroy()
	a, err := efadv.QueryAH(ah)
	if err != nil {
		t.Fatal(err)
	}
	ah2, err := pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: gid}, PortNum: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer ah2.Destroy()
	if a.AHN != ahn(t, ah2) || a.AHN == 0xffff || a.CompMask != 0 {
		t.Fatalf("efadv_query_ah = %+v; a second AH to the same GID has %d", a, ahn(t, ah2))
	}
}

// randomCap is pyverbs' u.random_qp_cap: WRs in [1, max_qp_wr/8], SGEs in [1, max_sge/2].
func randomCap(ctx *verbs.Context) verbs.QPCap {
	a := ctx.QueryDevice()
	wr := func() uint32 { return 1 + uint32(rand.IntN(a.MaxQPWR/8)) }
	sge := func() uint32 { return 1 + uint32(rand.IntN(a.MaxSGE/2)) }
	return verbs.QPCap{MaxSendWR: wr(), MaxRecvWR: wr(), MaxSendSGE: sge(), MaxRecvSGE: sge()}
}

// EfaQPTest.test_efadv_create_driver_qp: random caps and sq_sig_all; the device must report
// legacy max_sge ≥ 2 for the random range to exist.
func TestEfadvCreateDriverQP(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil))
	if ctx.QueryDevice().MaxSGE < 2 {
		t.Fatal("legacy max_sge below 2")
	}
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	cq, _ := ctx.CreateCQ(100, nil, nil, 0)
	defer cq.Destroy()
	for range 20 {
		c := randomCap(ctx)
		attr := verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: c, QPType: verbs.QPTDriver, SQSigAll: rand.IntN(2) == 1}
		qp, err := efadv.CreateDriverQP(pd, &attr, efadv.QPDriverTypeSRD)
		if err != nil {
			t.Fatalf("caps %+v: %v", c, err)
		}
		if attr.Cap.MaxSendWR < c.MaxSendWR || attr.Cap.MaxRecvWR < c.MaxRecvWR {
			t.Fatalf("rounded caps %+v below asked %+v", attr.Cap, c)
		}
		check(t, qp.Destroy())
	}
	// efadv_create_driver_qp requires IBV_QPT_DRIVER.
	_, err := efadv.CreateDriverQP(pd, &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTUD}, 0)
	wantErrno(t, err, syscall.EINVAL)
}

// EfaQPExTest.test_efadv_create_qp_ex: random caps and a random subset of send ops.
func TestEfadvCreateQPEx(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil))
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	cq, _ := ctx.CreateCQ(100, nil, nil, 0)
	defer cq.Destroy()
	ops := []verbs.SendOpsFlags{verbs.SendOpsSend, verbs.SendOpsSendWithImm, verbs.SendOpsRDMARead,
		verbs.SendOpsRDMAWrite, verbs.SendOpsRDMAWriteWithImm}
	for range 20 {
		var f verbs.SendOpsFlags
		for _, op := range ops {
			if rand.IntN(2) == 1 {
				f |= op
			}
		}
		attr := verbs.QPInitAttrEx{SendCQ: cq, RecvCQ: cq, Cap: randomCap(ctx), QPType: verbs.QPTDriver, PD: pd,
			CompMask: verbs.QPInitAttrPD | verbs.QPInitAttrSendOpsFlags, SendOpsFlags: f}
		qp, err := efadv.CreateQPEx(ctx, &attr, &efadv.QPInitAttr{DriverQPType: efadv.QPDriverTypeSRD})
		if err != nil {
			t.Fatalf("send ops %#x: %v", f, err)
		}
		x, err := qp.ToQPEx()
		if f != 0 && (x == nil || err != nil) || f == 0 && (x != nil || !errors.Is(err, syscall.EOPNOTSUPP)) {
			t.Fatalf("send ops %#x: ToQPEx = %v, %v", f, x, err)
		}
		check(t, qp.Destroy())
	}
}

// EfaCqTest.test_dv_cq_ex_with_sgid: the server never made an AH for the client, so its receive
// completion has AH 0xffff and efadv_wc_read_sgid returns the client's GID.
func TestDVCQExWithSGID(t *testing.T) {
	dev := newDevice(t, nil)
	o := srdOpts{qpCount: 1, msgSize: 1024, sendOps: verbs.SendOpsSend, cqWCFlags: efadv.WCExWithSGID}
	client, server := newSRD(t, dev, o), newSRD(t, dev, o)
	client.remote, server.remote = server, client
	client.toRTS(server.psn)
	server.toRTS(client.psn)
	client.makeAH(server.gid)
	server.postRecv(server.qps[0])
	client.sendEx(0, verbs.WRSend)
	if err := pollStart(t, client.cq); err != nil {
		t.Fatal(err)
	}
	_, err := efadv.WCReadSGID(efadv.CQFromIBVCQEx(client.cq)) // a send completion has a known AH field of 0
	client.cq.EndPoll()
	if err == nil {
		t.Log("read_sgid on a send completion returned a GID") // libefa checks only ah == 0xffff
	}
	if err := pollStart(t, server.cq); err != nil {
		t.Fatal(err)
	}
	defer server.cq.EndPoll()
	if server.cq.ReadOpcode() != verbs.WCRecv || server.cq.Status() != verbs.WCSuccess {
		t.Fatalf("server completion %v %v", server.cq.ReadOpcode(), server.cq.Status())
	}
	if server.cq.ReadSLID() != 0xffff {
		t.Fatalf("AH %#x for an unknown sender, want 0xffff", server.cq.ReadSLID())
	}
	gid, err := efadv.WCReadSGID(efadv.CQFromIBVCQEx(server.cq))
	if err != nil {
		t.Fatal(err)
	}
	if gid != client.gid {
		t.Fatalf("read_sgid %v, want the client's %v", gid, client.gid)
	}
}

// With an AH for the sender in its PD, the receiver gets that AH's number and read_sgid fails
// with ENOENT; a CQ without the SGID field fails read_sgid with EOPNOTSUPP.
func TestDVCQKnownAH(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{qpCount: 1, msgSize: 64, sendOps: verbs.SendOpsSend,
		cqWCFlags: efadv.WCExWithSGID})
	server.postRecv(server.qps[0])
	client.sendEx(0, verbs.WRSend)
	wantSuccess(t, waitWC(t, client.cq, 1))
	if err := pollStart(t, server.cq); err != nil {
		t.Fatal(err)
	}
	defer server.cq.EndPoll()
	if got := server.cq.ReadSLID(); got != ahn(t, server.ahs[0]) {
		t.Fatalf("AH %d, want the server's AH %d for the client", got, ahn(t, server.ahs[0]))
	}
	_, err := efadv.WCReadSGID(efadv.CQFromIBVCQEx(server.cq))
	wantErrno(t, err, syscall.ENOENT)

	plain := newSRD(t, dev, srdOpts{qpCount: 1})
	_, err = efadv.WCReadSGID(efadv.CQFromIBVCQEx(plain.cq))
	wantErrno(t, err, syscall.EOPNOTSUPP)
}

// EfaMRTest.test_efadv_query_mr: succeeds, with no validity bits outside the three defined.
func TestEfadvQueryMR(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil))
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	mr, err := pd.RegMR(make([]byte, 16), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer mr.Dereg()
	a, err := efadv.QueryMR(mr)
	if err != nil {
		t.Fatal(err)
	}
	const valid = efadv.MRAttrValidityRecvICID | efadv.MRAttrValidityRDMAReadICID | efadv.MRAttrValidityRDMARecvICID
	if a.ICIDValidity&^valid != 0 {
		t.Fatalf("ic_id_validity %#x", a.ICIDValidity)
	}
}

// efadv_create_qp_ex's own checks: comp_mask, reserved byte, QP type, inlen.
func TestEfadvCreateQPExChecks(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil))
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	cq, _ := ctx.CreateCQ(16, nil, nil, 0)
	defer cq.Destroy()
	base := func() verbs.QPInitAttrEx {
		return verbs.QPInitAttrEx{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTDriver, PD: pd, CompMask: verbs.QPInitAttrPD,
			Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}
	}
	cases := []struct {
		name  string
		mod   func(*verbs.QPInitAttrEx, *efadv.QPInitAttr)
		inlen int
		want  syscall.Errno
	}{
		{"inlen 8", nil, 8, syscall.EINVAL},
		{"UD type", func(a *verbs.QPInitAttrEx, _ *efadv.QPInitAttr) { a.QPType = verbs.QPTUD }, 24, syscall.EINVAL},
		{"comp_mask", func(_ *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { e.CompMask = 1 }, 24, syscall.EINVAL},
		{"reserved", func(_ *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { e.Reserved = 1 }, 24, syscall.EINVAL},
		{"driver type", func(_ *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { e.DriverQPType = 1 }, 24, syscall.EOPNOTSUPP},
		{"unknown flag", func(_ *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { e.Flags = 4 }, 24, syscall.EOPNOTSUPP},
		{"unknown wr_flag", func(_ *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { e.WRFlags = 2 }, 24, syscall.EOPNOTSUPP},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, e := base(), efadv.QPInitAttr{}
			if c.mod != nil {
				c.mod(&a, &e)
			}
			_, err := efadv.CreateQPExLen(ctx, &a, &e, c.inlen)
			wantErrno(t, err, c.want)
		})
	}
	// Flags beyond inlen are not read: an unknown flag is ignored with inlen 12.
	a, e := base(), efadv.QPInitAttr{Flags: 4}
	qp, err := efadv.CreateQPExLen(ctx, &a, &e, 12)
	if err != nil {
		t.Fatalf("flags beyond inlen 12 were read: %v", err)
	}
	check(t, qp.Destroy())
}

// efadv_create_cq: SGID and IS_UNSOLICITED need their caps; other wc_flags are EOPNOTSUPP;
// comp_mask is EINVAL.
func TestEfadvCreateCQChecks(t *testing.T) {
	noCaps := newDevice(t, func(c *config.Device) { c.Caps = uint32(efadv.DeviceAttrCapsRDMARead) })
	full := newDevice(t, nil)
	for _, c := range []struct {
		dev     *verbs.Device
		wcFlags efadv.WCExFlags
		comp    uint64
		want    error
	}{
		{full, efadv.WCExWithSGID | efadv.WCExWithIsUnsolicited, 0, nil},
		{full, 1 << 5, 0, syscall.EOPNOTSUPP},
		{full, 0, 1, syscall.EINVAL},
		{noCaps, efadv.WCExWithSGID, 0, syscall.EOPNOTSUPP},
		{noCaps, efadv.WCExWithIsUnsolicited, 0, syscall.EOPNOTSUPP},
	} {
		ctx := openCtx(t, c.dev)
		cq, err := efadv.CreateCQ(ctx, &verbs.CQInitAttrEx{CQE: 8}, &efadv.CQInitAttr{WCFlags: c.wcFlags, CompMask: c.comp})
		if c.want == nil {
			if err != nil {
				t.Fatalf("wc_flags %#x: %v", c.wcFlags, err)
			}
			check(t, cq.Destroy())
			continue
		}
		wantErrno(t, err, c.want.(syscall.Errno))
	}
}

// efadv_get_max_sq_depth and efadv_get_max_rq_depth.
func TestEfadvMaxDepth(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil)) // LLQ 256 KiB, 8192 RX descriptors
	for _, c := range []struct {
		attr efadv.SQDepthAttr
		want int
		err  error
	}{
		{efadv.SQDepthAttr{MaxSendSGE: 2, MaxRDMASGE: 1, MaxInlineData: 32}, 4096, nil},
		{efadv.SQDepthAttr{MaxInlineData: 33}, 2048, nil},
		{efadv.SQDepthAttr{Flags: efadv.SQDepthAttrInlineWrite}, 2048, nil},
		{efadv.SQDepthAttr{MaxSendSGE: 3}, 0, syscall.EINVAL},
		{efadv.SQDepthAttr{MaxRDMASGE: 2}, 0, syscall.EINVAL},
		{efadv.SQDepthAttr{MaxInlineData: 81}, 0, syscall.EINVAL},
		{efadv.SQDepthAttr{CompMask: 1}, 0, syscall.EINVAL},
	} {
		got, err := efadv.GetMaxSQDepth(ctx, c.attr)
		if c.err != nil {
			wantErrno(t, err, c.err.(syscall.Errno))
			continue
		}
		if err != nil || got != c.want {
			t.Fatalf("max SQ depth %+v = %d, %v; want %d", c.attr, got, err, c.want)
		}
	}
	if n, err := efadv.GetMaxRQDepth(ctx, efadv.RQDepthAttr{MaxRecvSGE: 2}); n != 4096 || err != nil {
		t.Fatalf("max RQ depth for 2 SGEs = %d, %v", n, err)
	}
	for _, sge := range []uint32{0, 3} {
		_, err := efadv.GetMaxRQDepth(ctx, efadv.RQDepthAttr{MaxRecvSGE: sge})
		wantErrno(t, err, syscall.EINVAL)
	}
	_, err := efadv.GetMaxRQDepth(ctx, efadv.RQDepthAttr{CompMask: 1, MaxRecvSGE: 1})
	wantErrno(t, err, syscall.EINVAL)
}

// efadv_query_qp_wqs and efadv_query_cq report the real rings: sizes, doorbells, max batch and
// the 64-bit request-id cap.
func TestEfadvQueryRings(t *testing.T) {
	for _, id64 := range []bool{false, true} {
		dev := newDevice(t, func(c *config.Device) { c.RequestID64 = id64 })
		r := newSRD(t, dev, srdOpts{qpCount: 1, msgSize: 64})
		sq, rq, err := efadv.QueryQPWQs(r.qps[0])
		if err != nil {
			t.Fatal(err)
		}
		if sq.EntrySize != 64 || sq.NumEntries != 1024 || len(sq.Buffer) != 64*1024 || sq.Doorbell == nil ||
			sq.MaxBatch != 16 {
			t.Fatalf("SQ %+v", sq)
		}
		if (sq.Caps&efadv.WQCaps64BitReqID != 0) != id64 {
			t.Fatalf("SQ caps %#x with 64-bit ids %v", sq.Caps, id64)
		}
		if rq.EntrySize != 16 || rq.NumEntries != 1024 || len(rq.Buffer) != 16*1024 || rq.MaxBatch != 1024 ||
			rq.Caps != 0 {
			t.Fatalf("RQ %+v", rq)
		}
		ca, err := efadv.QueryCQ(r.cq)
		if err != nil {
			t.Fatal(err)
		}
		if ca.EntrySize != 32 || ca.NumEntries != 1024 || len(ca.Buffer) != 32*1024 || ca.Doorbell == nil {
			t.Fatalf("CQ %+v", ca)
		}
		if ca, _ := efadv.QueryCQLen(r.cq, 24); ca.Doorbell != nil {
			t.Fatal("query_cq inlen 24 reported a doorbell")
		}
	}
}

// A device configured with None limits and CapsNone reports zeros where a zero field would have
// taken the defaults, and acts on them: no inline data, no minimum SQ size, no TX batch limit, no
// caps.
func TestNoneLimits(t *testing.T) {
	ctx := openCtx(t, newDevice(t, func(c *config.Device) {
		c.InlineBufSize, c.InlineBufSizeEx, c.MaxTxBatch, c.MinSQWR = config.None, config.None, config.None, config.None
		c.Caps = config.CapsNone
	}))
	a, err := efadv.QueryDevice(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if a.InlineBufSize != 0 || a.InlineBufSizeEx != 0 || a.DeviceCaps != 0 {
		t.Fatalf("efadv_query_device = %+v, want no inline data and no caps", a)
	}
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	cq, _ := ctx.CreateCQ(16, nil, nil, 0)
	defer cq.Destroy()
	attr := verbs.QPInitAttrEx{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTDriver, PD: pd, CompMask: verbs.QPInitAttrPD,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 1}}
	_, err = efadv.CreateQPEx(ctx, &attr, &efadv.QPInitAttr{})
	wantErrno(t, err, syscall.EINVAL)
	attr.Cap.MaxInlineData = 0
	qp, err := efadv.CreateQPEx(ctx, &attr, &efadv.QPInitAttr{})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Destroy()
	sq, _, err := efadv.QueryQPWQs(qp)
	if err != nil {
		t.Fatal(err)
	}
	if attr.Cap.MaxSendWR != 1 || sq.NumEntries != 1 || sq.MaxBatch != 65535 {
		t.Fatalf("SQ of %d WRs, %d entries, max batch %d; want 1, 1 and no limit", attr.Cap.MaxSendWR, sq.NumEntries, sq.MaxBatch)
	}
	_, err = pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	wantErrno(t, err, syscall.EOPNOTSUPP)
	_, err = efadv.CreateCQ(ctx, &verbs.CQInitAttrEx{CQE: 8}, &efadv.CQInitAttr{WCFlags: efadv.WCExWithSGID})
	wantErrno(t, err, syscall.EOPNOTSUPP)
}
