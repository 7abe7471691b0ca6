package verbs_test

import (
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/internal/testkit"
	"github.com/softefa/softefa/link/memlink"
	"github.com/softefa/softefa/verbs"
)

func newDevice(t testing.TB, mod func(*config.Device)) *verbs.Device {
	t.Helper()
	return testkit.Device(t, mod)
}

func openCtx(t testing.TB, d *verbs.Device) *verbs.Context {
	t.Helper()
	return testkit.Context(t, d)
}

func wantErrno(t testing.TB, err error, want syscall.Errno) {
	t.Helper()
	testkit.WantErrno(t, err, want)
}

func must[T any](t testing.TB) func(T, error) T { return testkit.Must[T](t) }

func TestQueryDeviceAndPort(t *testing.T) {
	dev := newDevice(t, func(c *config.Device) { c.MTU = 4000; c.MaxRDMASize = 1 << 20; c.MaxQP = 100 })
	ctx := openCtx(t, dev)
	a := ctx.QueryDevice()
	switch {
	case a.VendorID != 0x1d0f:
		t.Fatalf("vendor_id %#x", a.VendorID)
	case a.VendorPartID == 0xefa0 || a.VendorPartID>>4 != 0xefa:
		t.Fatalf("vendor_part_id %#x", a.VendorPartID)
	case a.MaxSGE < 2:
		t.Fatalf("legacy max_sge %d", a.MaxSGE)
	case a.MaxQP != 100 || a.PhysPortCnt != 1 || a.MaxPKeys != 1 || a.MaxSGERD != 1:
		t.Fatalf("device attrs %+v", a)
	}
	p := must[verbs.PortAttr](t)(ctx.QueryPort(1))
	if p.State != verbs.PortActive || p.GIDTblLen != 1 || p.PKeyTblLen != 1 || p.MaxMsgSz != 4000 ||
		p.ActiveMTU != verbs.MTU2048 {
		t.Fatalf("port %+v", p)
	}
	_, err := ctx.QueryPort(2)
	wantErrno(t, err, syscall.EINVAL)
	gid := must[verbs.GID](t)(ctx.QueryGID(1, 0))
	if gid == (verbs.GID{}) || gid != dev.GID() {
		t.Fatalf("GID %v", gid)
	}
	_, err = ctx.QueryGID(1, 1)
	wantErrno(t, err, syscall.EINVAL)
	if k := must[uint16](t)(ctx.QueryPKey(1, 0)); k != 0xffff {
		t.Fatalf("pkey %#x", k)
	}
	_, err = ctx.QueryPKey(1, 1)
	wantErrno(t, err, syscall.EINVAL)
	if a, _ := efadv.QueryDevice(ctx); a.MaxRDMASize != 1<<20 {
		t.Fatalf("max_rdma_size %d", a.MaxRDMASize)
	}
	if p, _ := openCtx(t, newDevice(t, nil)).QueryPort(1); p.MaxMsgSz != 8192 || p.ActiveMTU != verbs.MTU4096 {
		t.Fatalf("default port %+v", p)
	}
}

func TestBadConfig(t *testing.T) {
	for _, mod := range []func(*config.Device){
		func(c *config.Device) { c.VendorPartID = 0xefa0 },
		func(c *config.Device) { c.MaxCQE = 1 << 16 },
		func(c *config.Device) { c.MaxSQSGE = 3 },
		func(c *config.Device) { c.InlineBufSizeEx = 81 },
		func(c *config.Device) { c.QPNTableSize = 1 << 17 },
		func(c *config.Device) { // driven, on a link that can only be read by waiting
			c.Driven, c.Link = true, memlink.New(1).Listen(netip.MustParseAddrPort("10.9.9.9:1"), 1)
		},
	} {
		var cfg config.Device
		mod(&cfg)
		if _, err := verbs.NewDevice(cfg); !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("config %+v: err %v, want EINVAL", cfg, err)
		}
	}
}

func TestDeviceListAndContexts(t *testing.T) {
	dev := newDevice(t, func(c *config.Device) { c.Name = "efa_list" })
	found := false
	for _, d := range verbs.GetDeviceList() {
		found = found || d == dev
	}
	if !found || dev.Name() != "efa_list" {
		t.Fatal("device not listed")
	}
	c1, c2 := must[*verbs.Context](t)(dev.Open()), must[*verbs.Context](t)(dev.Open())
	wantErrno(t, dev.Close(), syscall.EBUSY)
	pd := must[*verbs.PD](t)(c1.AllocPD())
	wantErrno(t, c1.Close(), syscall.EBUSY)
	if err := pd.Dealloc(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*verbs.Context{c1, c2} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestMRKeysAndAccess(t *testing.T) {
	dev := newDevice(t, func(c *config.Device) { c.Caps = uint32(efadv.DeviceAttrCapsRDMARead) })
	ctx := openCtx(t, dev)
	pd := must[*verbs.PD](t)(ctx.AllocPD())
	defer pd.Dealloc()
	buf := make([]byte, 4096)
	_, err := pd.RegMR(nil, verbs.AccessLocalWrite)
	wantErrno(t, err, syscall.EINVAL)
	_, err = pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	wantErrno(t, err, syscall.EOPNOTSUPP)
	_, err = pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite) // no RDMA_WRITE cap
	wantErrno(t, err, syscall.EOPNOTSUPP)
	mr := must[*verbs.MR](t)(pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRelaxedOrdering))
	if mr.LKey()>>24 != 0 || mr.LKey() == 0 {
		t.Fatalf("lkey %#x not a non-zero 24-bit key", mr.LKey())
	}
	if mr.Len() != 4096 || mr.Addr() == 0 {
		t.Fatalf("MR %d bytes at %#x", mr.Len(), mr.Addr())
	}
	wantErrno(t, pd.Dealloc(), syscall.EBUSY)
	old := mr.LKey()
	if err := mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, mr.Dereg(), syscall.EINVAL)
	// Keys of regions registered one after another are all different, rkeys included.
	seenL, seenR := map[uint32]bool{old: true}, map[uint32]bool{}
	for range 200 {
		m := must[*verbs.MR](t)(pd.RegMR(buf, verbs.AccessLocalWrite))
		if seenL[m.LKey()] || seenR[m.RKey()] || m.LKey()>>24 != 0 {
			t.Fatalf("key reused or wide: lkey %#x rkey %#x", m.LKey(), m.RKey())
		}
		seenL[m.LKey()], seenR[m.RKey()] = true, true
		check(t, m.Dereg())
	}
	// rkeys are random: over 200 regions the top byte takes many values, unlike a counter.
	tops := map[uint32]bool{}
	for k := range seenR {
		tops[k>>24] = true
	}
	if len(tops) < 50 {
		t.Fatalf("rkeys look sequential: %d distinct top bytes in 200", len(tops))
	}
	with := must[*verbs.MR](t)(pd.RegMRIOVA(buf, 0x10000, verbs.AccessLocalWrite))
	if with.Addr() != 0x10000 {
		t.Fatalf("IOVA %#x", with.Addr())
	}
	check(t, with.Dereg())
}

func check(t testing.TB, err error) {
	t.Helper()
	testkit.Check(t, err)
}

func TestCQCreation(t *testing.T) {
	dev := newDevice(t, func(c *config.Device) { c.MaxCQE = 4096; c.MaxCQ = 2 })
	ctx := openCtx(t, dev)
	cq := must[*verbs.CQ](t)(ctx.CreateCQ(1000, nil, nil, 0))
	if cq.CQE() != 1024 {
		t.Fatalf("CQ of 1000 has %d entries, want 1024", cq.CQE())
	}
	for _, c := range []struct {
		attr verbs.CQInitAttrEx
		want syscall.Errno
	}{
		{verbs.CQInitAttrEx{CQE: 0}, syscall.EINVAL},
		{verbs.CQInitAttrEx{CQE: 4097}, syscall.EINVAL},
		{verbs.CQInitAttrEx{CQE: 8, WCFlags: verbs.WCExWithCompletionTimestamp}, syscall.EOPNOTSUPP},
		{verbs.CQInitAttrEx{CQE: 8, CompMask: 1 << 2}, syscall.EOPNOTSUPP},
		{verbs.CQInitAttrEx{CQE: 8, CompMask: verbs.CQInitAttrFlags, Flags: verbs.CreateCQIgnoreOverrun}, syscall.EOPNOTSUPP},
		{verbs.CQInitAttrEx{CQE: 8, CompMask: verbs.CQInitAttrPD}, syscall.EINVAL},
	} {
		_, err := ctx.CreateCQEx(&c.attr)
		wantErrno(t, err, c.want)
	}
	cq2 := must[*verbs.CQ](t)(ctx.CreateCQEx(&verbs.CQInitAttrEx{CQE: 1, WCFlags: verbs.WCStandardFlags,
		CompMask: verbs.CQInitAttrFlags, Flags: verbs.CreateCQSingleThreaded}))
	_, err := ctx.CreateCQ(8, nil, nil, 0)
	wantErrno(t, err, syscall.ENOMEM)                 // MaxCQ 2
	wantErrno(t, cq.ReqNotify(false), syscall.EINVAL) // no channel
	ch := must[*verbs.CompChannel](t)(ctx.CreateCompChannel())
	check(t, cq2.Destroy())
	cq3 := must[*verbs.CQ](t)(ctx.CreateCQ(8, "ctx", ch, 0))
	wantErrno(t, cq3.ReqNotify(true), syscall.EOPNOTSUPP)
	wantErrno(t, ch.Destroy(), syscall.EBUSY)
	if cq3.UserContext() != "ctx" {
		t.Fatal("cq_context lost")
	}
	check(t, cq3.Destroy())
	check(t, ch.Destroy())
	check(t, cq.Destroy())
	wantErrno(t, cq.Destroy(), syscall.EINVAL)
}

func TestAHNumbers(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil))
	pd := must[*verbs.PD](t)(ctx.AllocPD())
	defer pd.Dealloc()
	g1, g2 := verbs.GID{15: 1}, verbs.GID{15: 2}
	attr := func(g verbs.GID) *verbs.AHAttr {
		return &verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: g}, PortNum: 1}
	}
	a1 := must[*verbs.AH](t)(pd.CreateAH(attr(g1)))
	a1b := must[*verbs.AH](t)(pd.CreateAH(attr(g1)))
	a2 := must[*verbs.AH](t)(pd.CreateAH(attr(g2)))
	if verbs.AHN(a1) != verbs.AHN(a1b) || verbs.AHN(a1) == verbs.AHN(a2) || verbs.AHN(a1) == 0xffff {
		t.Fatalf("AH numbers %d %d %d", verbs.AHN(a1), verbs.AHN(a1b), verbs.AHN(a2))
	}
	_, err := pd.CreateAH(&verbs.AHAttr{GRH: verbs.GlobalRoute{DGID: g1}})
	wantErrno(t, err, syscall.EINVAL)
	_, err = pd.CreateAH(attr(verbs.GID{}))
	wantErrno(t, err, syscall.EINVAL)
	// A destroyed AH's number is not handed out again at once.
	old := verbs.AHN(a2)
	check(t, a2.Destroy())
	a3 := must[*verbs.AH](t)(pd.CreateAH(attr(verbs.GID{15: 3})))
	if verbs.AHN(a3) == old {
		t.Fatalf("AH number %d reused at once", old)
	}
	for _, ah := range []*verbs.AH{a1, a1b, a3} {
		check(t, ah.Destroy())
	}
}

// qpFixture is a context with a PD and a CQ for QP creation tests.
type qpFixture struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
}

func newQPFixture(t testing.TB, mod func(*config.Device)) *qpFixture {
	f := &qpFixture{ctx: openCtx(t, newDevice(t, mod))}
	f.pd = must[*verbs.PD](t)(f.ctx.AllocPD())
	f.cq = must[*verbs.CQ](t)(f.ctx.CreateCQ(64, nil, nil, 0))
	t.Cleanup(func() { check(t, f.cq.Destroy()); check(t, f.pd.Dealloc()) })
	return f
}

func (f *qpFixture) srdAttr() verbs.QPInitAttrEx {
	return verbs.QPInitAttrEx{SendCQ: f.cq, RecvCQ: f.cq, QPType: verbs.QPTDriver, PD: f.pd, CompMask: verbs.QPInitAttrPD,
		Cap: verbs.QPCap{MaxSendWR: 10, MaxRecvWR: 10, MaxSendSGE: 1, MaxRecvSGE: 1}}
}

func (f *qpFixture) srd(t testing.TB) *verbs.QP {
	a := f.srdAttr()
	qp, err := efadv.CreateQPEx(f.ctx, &a, &efadv.QPInitAttr{})
	if err != nil {
		t.Fatal(err)
	}
	return qp
}

// Every creation check of libefa's create_qp (efa_check_qp_attr, efa_check_qp_limits), one
// violation at a time, with its errno; where two are violated, the earlier check wins.
func TestCreateQPChecks(t *testing.T) {
	f := newQPFixture(t, nil)
	other := newQPFixture(t, nil)
	cases := []struct {
		name string
		mod  func(*verbs.QPInitAttrEx, *efadv.QPInitAttr)
		want syscall.Errno
	}{
		{"1 driver type", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { e.DriverQPType = 7 }, syscall.EOPNOTSUPP},
		{"2 unknown flag", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { e.Flags = 1 << 5 }, syscall.EOPNOTSUPP},
		{"3 comp_mask", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.CompMask |= verbs.QPInitAttrXRCD }, syscall.EOPNOTSUPP},
		{"4 no PD", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.CompMask = 0 }, syscall.EINVAL},
		{"5 send ops", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) {
			a.CompMask |= verbs.QPInitAttrSendOpsFlags
			a.SendOpsFlags = verbs.SendOpsAtomicCmpSwp
		}, syscall.EOPNOTSUPP},
		{"6 wr_flags", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { e.WRFlags = 1 << 1 }, syscall.EOPNOTSUPP},
		{"7 no send CQ", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.SendCQ = nil }, syscall.EINVAL},
		{"7 no recv CQ", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.RecvCQ = nil }, syscall.EINVAL},
		{"9 send SGE", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.Cap.MaxSendSGE = 3 }, syscall.EINVAL},
		{"10 recv SGE", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.Cap.MaxRecvSGE = 3 }, syscall.EINVAL},
		{"11 send WR", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.Cap.MaxSendWR = 4097 }, syscall.EINVAL},
		{"11 send WR, 128-byte WQEs", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) {
			a.Cap.MaxSendWR, a.Cap.MaxInlineData = 2049, 64
		}, syscall.EINVAL},
		{"12 recv WR", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.Cap.MaxRecvWR, a.Cap.MaxRecvSGE = 4097, 2 }, syscall.EINVAL},
		{"13 inline", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.Cap.MaxInlineData = 81 }, syscall.EINVAL},
		{"2 before 4", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { e.Flags = 1 << 5; a.CompMask = 0 }, syscall.EOPNOTSUPP},
		{"4 before 7", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.CompMask = 0; a.SendCQ = nil }, syscall.EINVAL},
		{"5 before 9", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) {
			a.CompMask |= verbs.QPInitAttrSendOpsFlags
			a.SendOpsFlags = verbs.SendOpsTSO
			a.Cap.MaxSendSGE = 9
		}, syscall.EOPNOTSUPP},
		{"CQ of another context", func(a *verbs.QPInitAttrEx, e *efadv.QPInitAttr) { a.SendCQ = other.cq }, syscall.EINVAL},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, e := f.srdAttr(), efadv.QPInitAttr{}
			c.mod(&a, &e)
			qp, err := efadv.CreateQPEx(f.ctx, &a, &e)
			if err == nil {
				check(t, qp.Destroy())
			}
			wantErrno(t, err, c.want)
		})
	}
}

// Send ops allowed per QP type and device caps: UD takes SEND and SEND_WITH_IMM only; SRD takes
// RDMA read and write only with the caps.
func TestSendOpsPerTypeAndCaps(t *testing.T) {
	noRDMA := newQPFixture(t, func(c *config.Device) { c.Caps = uint32(efadv.DeviceAttrCapsRNRRetry) })
	full := newQPFixture(t, nil)
	for _, c := range []struct {
		f    *qpFixture
		typ  verbs.QPType
		ops  verbs.SendOpsFlags
		want error
	}{
		{full, verbs.QPTUD, verbs.SendOpsSend | verbs.SendOpsSendWithImm, nil},
		{full, verbs.QPTUD, verbs.SendOpsRDMARead, syscall.EOPNOTSUPP},
		{full, verbs.QPTDriver, verbs.SendOpsRDMARead | verbs.SendOpsRDMAWrite | verbs.SendOpsRDMAWriteWithImm, nil},
		{noRDMA, verbs.QPTDriver, verbs.SendOpsRDMARead, syscall.EOPNOTSUPP},
		{noRDMA, verbs.QPTDriver, verbs.SendOpsRDMAWriteWithImm, syscall.EOPNOTSUPP},
		{noRDMA, verbs.QPTDriver, verbs.SendOpsSend, nil},
	} {
		a := c.f.srdAttr()
		a.QPType, a.CompMask, a.SendOpsFlags = c.typ, verbs.QPInitAttrPD|verbs.QPInitAttrSendOpsFlags, c.ops
		var qp *verbs.QP
		var err error
		if c.typ == verbs.QPTUD {
			qp, err = c.f.ctx.CreateQPEx(&a)
		} else {
			qp, err = efadv.CreateQPEx(c.f.ctx, &a, &efadv.QPInitAttr{})
		}
		if c.want == nil {
			if err != nil {
				t.Fatalf("type %d ops %#x: %v", c.typ, c.ops, err)
			}
			check(t, qp.Destroy())
			continue
		}
		wantErrno(t, err, c.want.(syscall.Errno))
	}
	// Flags that need caps.
	a := noRDMA.srdAttr()
	_, err := efadv.CreateQPEx(noRDMA.ctx, &a, &efadv.QPInitAttr{Flags: efadv.QPFlagsInlineWrite})
	wantErrno(t, err, syscall.EOPNOTSUPP)
	_, err = efadv.CreateQPEx(noRDMA.ctx, &a, &efadv.QPInitAttr{Flags: efadv.QPFlagsUnsolicitedWriteRecv})
	wantErrno(t, err, syscall.EOPNOTSUPP)
	// Without efadv only UD QPs exist.
	a = full.srdAttr()
	_, err = full.ctx.CreateQPEx(&a)
	wantErrno(t, err, syscall.EOPNOTSUPP)
}

// A QP created without send-ops flags has no QPEx: ToQPEx says so with EOPNOTSUPP (libibverbs'
// NULL) rather than handing out a nil to panic on. One created with them has one.
func TestToQPEx(t *testing.T) {
	f := newQPFixture(t, nil)
	ud := must[*verbs.QP](t)(f.pd.CreateQP(&verbs.QPInitAttr{SendCQ: f.cq, RecvCQ: f.cq, QPType: verbs.QPTUD,
		Cap: verbs.QPCap{MaxSendWR: 10, MaxRecvWR: 10, MaxSendSGE: 1, MaxRecvSGE: 1}}))
	defer ud.Destroy()
	x, err := ud.ToQPEx()
	if x != nil {
		t.Fatalf("ToQPEx of a QP without send ops = %v", x)
	}
	wantErrno(t, err, syscall.EOPNOTSUPP)

	a := f.srdAttr()
	a.CompMask, a.SendOpsFlags = verbs.QPInitAttrPD|verbs.QPInitAttrSendOpsFlags, verbs.SendOpsSend
	srd := must[*verbs.QP](t)(efadv.CreateQPEx(f.ctx, &a, &efadv.QPInitAttr{}))
	defer srd.Destroy()
	if x, err = srd.ToQPEx(); err != nil || x.QP() != srd {
		t.Fatalf("ToQPEx of a QP with send ops = %v, %v", x, err)
	}
}

// Caps are rounded as libefa rounds them, written back, and reported by query_qp.
func TestQPCapsRounding(t *testing.T) {
	f := newQPFixture(t, nil)
	for _, c := range []struct {
		in         verbs.QPCap
		flags      efadv.QPFlags
		send, recv uint32
		wqe        uint32
	}{
		{verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxRecvSGE: 1}, 0, 16, 1, 64}, // min_sq_wr 16
		{verbs.QPCap{MaxSendWR: 100, MaxRecvWR: 100, MaxRecvSGE: 2}, 0, 128, 128, 64},
		{verbs.QPCap{MaxSendWR: 17, MaxRecvWR: 3, MaxRecvSGE: 2, MaxInlineData: 33}, 0, 32, 4, 128},
		{verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 5, MaxRecvSGE: 1}, efadv.QPFlagsInlineWrite, 64, 8, 128},
	} {
		a := f.srdAttr()
		a.Cap = c.in
		qp, err := efadv.CreateQPEx(f.ctx, &a, &efadv.QPInitAttr{Flags: c.flags})
		if err != nil {
			t.Fatal(err)
		}
		if a.Cap.MaxSendWR != c.send || a.Cap.MaxRecvWR != c.recv {
			t.Fatalf("caps %+v rounded to %+v, want send %d recv %d", c.in, a.Cap, c.send, c.recv)
		}
		_, init, err := qp.Query(verbs.QPAttrCap)
		if err != nil || init.Cap != a.Cap {
			t.Fatalf("query_qp caps %+v, created %+v (%v)", init.Cap, a.Cap, err)
		}
		sq, _, _ := efadv.QueryQPWQs(qp)
		if sq.EntrySize != c.wqe {
			t.Fatalf("WQE size %d, want %d", sq.EntrySize, c.wqe)
		}
		check(t, qp.Destroy())
	}
	qp := f.srd(t)
	_, _, err := qp.Query(verbs.QPAttrAV)
	wantErrno(t, err, syscall.EOPNOTSUPP)
	check(t, qp.Destroy())
}

func TestQPNumbers(t *testing.T) {
	f := newQPFixture(t, func(c *config.Device) {
		c.QPNTableSize, c.QPNReservedStart, c.QPNReservedEnd, c.MaxQP = 64, 10, 29, 64
	})
	var qps []*verbs.QP
	seen := map[uint32]bool{}
	for {
		a := f.srdAttr()
		qp, err := efadv.CreateQPEx(f.ctx, &a, &efadv.QPInitAttr{})
		if err != nil {
			wantErrno(t, err, syscall.ENOMEM)
			break
		}
		n := qp.QPN()
		if n < 2 || n >= 64 || n >= 10 && n <= 29 || seen[n] {
			t.Fatalf("QPN %d", n)
		}
		seen[n] = true
		qps = append(qps, qp)
	}
	if len(qps) != 64-2-20 {
		t.Fatalf("%d QPs, want %d", len(qps), 64-2-20)
	}
	// Free one; the next QP gets it back (nothing else is free) with a new generation.
	old := qps[3]
	n, gen := old.QPN(), verbs.QPGen(old)
	check(t, old.Destroy())
	a := f.srdAttr()
	qp := must[*verbs.QP](t)(efadv.CreateQPEx(f.ctx, &a, &efadv.QPInitAttr{}))
	if qp.QPN() != n || verbs.QPGen(qp) == gen {
		t.Fatalf("reused QPN %d gen %d, old %d gen %d", qp.QPN(), verbs.QPGen(qp), n, gen)
	}
	qps[3] = qp
	for _, q := range qps {
		check(t, q.Destroy())
	}
}

// A freed number is not handed out at once while others are free.
func TestQPNNotReusedAtOnce(t *testing.T) {
	f := newQPFixture(t, nil)
	a := f.srd(t)
	n := a.QPN()
	check(t, a.Destroy())
	b := f.srd(t)
	defer b.Destroy()
	if b.QPN() == n {
		t.Fatalf("QPN %d reused at once", n)
	}
	if b.QPN() >= 1<<16 {
		t.Fatalf("QPN %d over 16 bits", b.QPN())
	}
}

// stateTable is the QP state table of EFA's kernel driver for SRD (srd_qp_state_table in
// drivers/infiniband/hw/efa/efa_verbs.c), transcribed independently of the engine: for each
// allowed move, its required and optional attributes. UD is the same without RNR_RETRY.
func stateTable(srd bool) map[[2]verbs.QPState][2]verbs.QPAttrMask {
	const (
		R, I, RTR, RTS, SQD, SQE, E = verbs.QPSReset, verbs.QPSInit, verbs.QPSRTR, verbs.QPSRTS, verbs.QPSSQD,
			verbs.QPSSQE, verbs.QPSErr
		pkey, port, qkey, cur = verbs.QPAttrPKeyIndex, verbs.QPAttrPort, verbs.QPAttrQKey, verbs.QPAttrCurState
	)
	m := map[[2]verbs.QPState][2]verbs.QPAttrMask{
		{R, R}: {}, {R, I}: {pkey | port | qkey, 0},
		{I, R}: {}, {I, E}: {}, {I, I}: {0, pkey | port | qkey}, {I, RTR}: {0, pkey | qkey},
		{RTR, R}: {}, {RTR, E}: {}, {RTR, RTS}: {verbs.QPAttrSQPSN, cur | qkey},
		{RTS, R}: {}, {RTS, E}: {}, {RTS, RTS}: {0, cur | qkey}, {RTS, SQD}: {0, verbs.QPAttrEnSQDAsyncNotify},
		{SQD, R}: {}, {SQD, E}: {}, {SQD, RTS}: {0, cur | qkey}, {SQD, SQD}: {0, pkey | qkey},
		{SQE, R}: {}, {SQE, E}: {}, {SQE, RTS}: {0, cur | qkey},
		{E, R}: {}, {E, E}: {},
	}
	if srd {
		v := m[[2]verbs.QPState{RTR, RTS}]
		v[1] |= verbs.QPAttrRNRRetry
		m[[2]verbs.QPState{RTR, RTS}] = v
	}
	return m
}

// bringTo moves a fresh QP to state s by the usual path; SQE, which only the device enters, is
// reached by naming it as the current state (CUR_STATE) in the move under test instead.
func bringTo(t *testing.T, qp *verbs.QP, s verbs.QPState) {
	t.Helper()
	path := map[verbs.QPState][]verbs.QPState{
		verbs.QPSReset: nil,
		verbs.QPSInit:  {verbs.QPSInit},
		verbs.QPSRTR:   {verbs.QPSInit, verbs.QPSRTR},
		verbs.QPSRTS:   {verbs.QPSInit, verbs.QPSRTR, verbs.QPSRTS},
		verbs.QPSSQD:   {verbs.QPSInit, verbs.QPSRTR, verbs.QPSRTS, verbs.QPSSQD},
		verbs.QPSSQE:   {verbs.QPSInit, verbs.QPSRTR, verbs.QPSRTS},
		verbs.QPSErr:   {verbs.QPSInit, verbs.QPSErr},
	}[s]
	for _, st := range path {
		a := verbs.QPAttr{QPState: st, PortNum: 1, QKey: 1}
		mask := verbs.QPAttrState
		switch st {
		case verbs.QPSInit:
			mask |= verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey
		case verbs.QPSRTS:
			mask |= verbs.QPAttrSQPSN
		}
		if err := qp.Modify(&a, mask); err != nil {
			t.Fatalf("to %v: %v", st, err)
		}
	}
}

// Every pair of states, for SRD and UD: an allowed move with its required attributes succeeds,
// and with each optional one too; missing a required attribute or adding one the move does not
// take is EINVAL; a move not in the table is EINVAL; an attribute EFA lacks is EOPNOTSUPP.
func TestQPStateMachine(t *testing.T) {
	states := []verbs.QPState{verbs.QPSReset, verbs.QPSInit, verbs.QPSRTR, verbs.QPSRTS, verbs.QPSSQD, verbs.QPSSQE, verbs.QPSErr}
	attrs := []verbs.QPAttrMask{verbs.QPAttrPKeyIndex, verbs.QPAttrPort, verbs.QPAttrQKey, verbs.QPAttrSQPSN,
		verbs.QPAttrRNRRetry, verbs.QPAttrEnSQDAsyncNotify, verbs.QPAttrCurState}
	f := newQPFixture(t, nil)
	for _, srd := range []bool{true, false} {
		table := stateTable(srd)
		newQP := func() *verbs.QP {
			if srd {
				return f.srd(t)
			}
			a := f.srdAttr()
			a.QPType = verbs.QPTUD
			return must[*verbs.QP](t)(f.ctx.CreateQPEx(&a))
		}
		for _, from := range states {
			for _, to := range states {
				name := fmt.Sprintf("srd=%v/%v-%v", srd, from, to)
				ro, allowed := table[[2]verbs.QPState{from, to}]
				try := func(mask verbs.QPAttrMask) error {
					qp := newQP()
					defer qp.Destroy()
					bringTo(t, qp, from)
					a := verbs.QPAttr{QPState: to, PortNum: 1, QKey: 7, SQPSN: 5, RNRRetry: 3}
					mask |= verbs.QPAttrState
					if mask&verbs.QPAttrCurState != 0 {
						a.CurQPState = from
					}
					if from == verbs.QPSSQE {
						a.CurQPState, mask = verbs.QPSSQE, mask|verbs.QPAttrCurState
					}
					err := qp.Modify(&a, mask)
					if err == nil && qp.State() != to {
						t.Fatalf("%s: state %v after success", name, qp.State())
					}
					return err
				}
				base := ro[0]
				if from == verbs.QPSSQE && ro[1]&verbs.QPAttrCurState == 0 {
					// Naming CUR_STATE is the only way to test moves out of SQE; a move out of SQE
					// that does not take it is refused for that reason alone.
					if err := try(base); !errors.Is(err, syscall.EINVAL) {
						t.Fatalf("%s with CUR_STATE: %v", name, err)
					}
					continue
				}
				if !allowed {
					if err := try(0); !errors.Is(err, syscall.EINVAL) {
						t.Fatalf("%s: refused move gave %v, want EINVAL", name, err)
					}
					continue
				}
				if err := try(base); err != nil {
					t.Fatalf("%s with required %#x: %v", name, base, err)
				}
				for _, x := range attrs {
					if base&x != 0 {
						if err := try(base &^ x); !errors.Is(err, syscall.EINVAL) {
							t.Fatalf("%s without required %#x: %v", name, x, err)
						}
						continue
					}
					err := try(base | x)
					ok := ro[1]&x != 0
					if x == verbs.QPAttrCurState && !(from == verbs.QPSRTR || from == verbs.QPSRTS || from == verbs.QPSSQD || from == verbs.QPSSQE) {
						ok = false
					}
					if ok && err != nil {
						t.Fatalf("%s with optional %#x: %v", name, x, err)
					}
					if !ok && !errors.Is(err, syscall.EINVAL) {
						t.Fatalf("%s with %#x it does not take: %v, want EINVAL", name, x, err)
					}
				}
				for _, x := range []verbs.QPAttrMask{verbs.QPAttrAV, verbs.QPAttrTimeout, verbs.QPAttrRetryCnt,
					verbs.QPAttrDestQPN, verbs.QPAttrAccessFlags, verbs.QPAttrPathMTU, verbs.QPAttrCap} {
					if err := try(base | x); !errors.Is(err, syscall.EOPNOTSUPP) {
						t.Fatalf("%s with unsupported %#x: %v, want EOPNOTSUPP", name, x, err)
					}
				}
			}
		}
	}
}

// Port and pkey index must be 1 and 0 (EOPNOTSUPP); rnr_retry is 0..7; query_qp reports what was
// set; destroy works in every state.
func TestModifyValuesAndQuery(t *testing.T) {
	f := newQPFixture(t, nil)
	qp := f.srd(t)
	init := verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey
	wantErrno(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 2}, init), syscall.EOPNOTSUPP)
	wantErrno(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, PKeyIndex: 1}, init), syscall.EOPNOTSUPP)
	check(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: 0x1234}, init))
	check(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState))
	wantErrno(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSRTS, RNRRetry: 8}, verbs.QPAttrState|verbs.QPAttrSQPSN|verbs.QPAttrRNRRetry), syscall.EINVAL)
	check(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSRTS, SQPSN: 0x1abcdef, RNRRetry: 3}, verbs.QPAttrState|verbs.QPAttrSQPSN|verbs.QPAttrRNRRetry))
	a, _, err := qp.Query(verbs.QPAttrState | verbs.QPAttrQKey | verbs.QPAttrSQPSN | verbs.QPAttrRNRRetry | verbs.QPAttrPort | verbs.QPAttrPKeyIndex)
	if err != nil {
		t.Fatal(err)
	}
	if a.QPState != verbs.QPSRTS || a.QKey != 0x1234 || a.SQPSN != 0xabcdef || a.RNRRetry != 3 || a.PortNum != 1 {
		t.Fatalf("query %+v", a)
	}
	// A new QP's rnr_retry is 7: retry forever, the SRD default.
	q2 := f.srd(t)
	if a, _, _ := q2.Query(verbs.QPAttrRNRRetry); a.RNRRetry != 7 {
		t.Fatalf("default rnr_retry %d", a.RNRRetry)
	}
	check(t, q2.Destroy())
	check(t, qp.Destroy())
	wantErrno(t, qp.Destroy(), syscall.EINVAL)
}

// Modify and Destroy of a QP whose QPEx session is open fail with EBUSY and change nothing; they
// used to wait for the session's lock, for ever when the caller had opened the session itself.
// After WRAbort the QP is as it was, a new session completes, and Destroy works.
func TestQPWithSessionOpen(t *testing.T) {
	f := newQPFixture(t, nil)
	a := f.srdAttr()
	a.CompMask, a.SendOpsFlags = verbs.QPInitAttrPD|verbs.QPInitAttrSendOpsFlags, verbs.SendOpsSend
	qp := must[*verbs.QP](t)(efadv.CreateQPEx(f.ctx, &a, &efadv.QPInitAttr{}))
	x := must[*verbs.QPEx](t)(qp.ToQPEx())

	x.WRStart()
	wantErrno(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSInit, QKey: 1}, verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrQKey), syscall.EBUSY)
	wantErrno(t, qp.Destroy(), syscall.EBUSY)
	x.WRAbort()

	if attr, _, err := qp.Query(verbs.QPAttrState); err != nil || attr.QPState != verbs.QPSReset {
		t.Fatalf("after the refused Modify and Destroy: state %v, %v; want RESET", attr.QPState, err)
	}
	x.WRStart()
	if err := x.WRComplete(); err != nil { // an empty session
		t.Fatalf("empty session after the refusals: %v", err)
	}
	if err := qp.Destroy(); err != nil {
		t.Fatalf("Destroy after the session ended: %v", err)
	}
}
