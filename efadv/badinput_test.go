package efadv_test

import (
	"syscall"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/internal/testkit"
	"github.com/softefa/softefa/verbs"
)

// Nil arguments are EINVAL, not a panic.
func TestEfadvNilArguments(t *testing.T) {
	ctx := openCtx(t, newDevice(t, nil))
	pd, _ := ctx.AllocPD()
	defer pd.Dealloc()
	cq, _ := ctx.CreateCQ(16, nil, nil, 0)
	defer cq.Destroy()
	qpAttr := func() *verbs.QPInitAttrEx {
		return &verbs.QPInitAttrEx{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTDriver, PD: pd, CompMask: verbs.QPInitAttrPD,
			Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}
	}
	var db uint32
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"CreateQPEx nil efa", func() error { _, err := efadv.CreateQPEx(ctx, qpAttr(), nil); return err }},
		{"CreateQPEx nil attr", func() error { _, err := efadv.CreateQPEx(ctx, nil, &efadv.QPInitAttr{}); return err }},
		{"CreateQPEx nil ctx", func() error { _, err := efadv.CreateQPEx(nil, qpAttr(), &efadv.QPInitAttr{}); return err }},
		{"CreateCQ nil efa", func() error { _, err := efadv.CreateCQ(ctx, &verbs.CQInitAttrEx{CQE: 8}, nil); return err }},
		{"CreateCQ nil attr", func() error { _, err := efadv.CreateCQ(ctx, nil, &efadv.CQInitAttr{}); return err }},
		{"CreateCQ nil ctx", func() error {
			_, err := efadv.CreateCQ(nil, &verbs.CQInitAttrEx{CQE: 8}, &efadv.CQInitAttr{})
			return err
		}},
		{"CreateDriverQP nil attr", func() error { _, err := efadv.CreateDriverQP(pd, nil, 0); return err }},
		{"CreateDriverQP nil PD", func() error {
			_, err := efadv.CreateDriverQP(nil, &verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTDriver}, 0)
			return err
		}},
		{"QueryAH", func() error { _, err := efadv.QueryAH(nil); return err }},
		{"QueryMR", func() error { _, err := efadv.QueryMR(nil); return err }},
		{"QueryCQ", func() error { _, err := efadv.QueryCQ(nil); return err }},
		{"QueryQPWQs", func() error { _, _, err := efadv.QueryQPWQs(nil); return err }},
		{"QueryDevice", func() error { _, err := efadv.QueryDevice(nil); return err }},
		{"RingDoorbell", func() error { return efadv.RingDoorbell(nil, &db, 1) }},
		{"GetMaxSQDepth", func() error { _, err := efadv.GetMaxSQDepth(nil, efadv.SQDepthAttr{}); return err }},
		{"GetMaxRQDepth", func() error {
			_, err := efadv.GetMaxRQDepth(nil, efadv.RQDepthAttr{MaxRecvSGE: 1})
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) { wantErrno(t, testkit.NoPanic(c.f), syscall.EINVAL) })
	}
}

// efadv_create_cq takes completion vectors [0, num_comp_vectors), as ibv_create_cq does.
func TestEfadvCreateCQVector(t *testing.T) {
	ctx := openCtx(t, newDevice(t, func(c *config.Device) { c.CompVectors = 1 }))
	for _, v := range []int{-1, 1, 1 << 20} {
		_, err := efadv.CreateCQ(ctx, &verbs.CQInitAttrEx{CQE: 8, CompVector: v}, &efadv.CQInitAttr{})
		wantErrno(t, err, syscall.EINVAL)
	}
	cq, err := efadv.CreateCQ(ctx, &verbs.CQInitAttrEx{CQE: 8}, &efadv.CQInitAttr{})
	if err != nil {
		t.Fatal(err)
	}
	check(t, cq.Destroy())
}
