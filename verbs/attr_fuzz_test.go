package verbs_test

import (
	"encoding/binary"
	"errors"
	"syscall"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

// FuzzQPAttrs drives QP creation and ibv_modify_qp with arbitrary attributes and masks. Whatever
// the input: no panic; every refusal is an errno (EINVAL, EOPNOTSUPP, ENOMEM); a refused modify
// changes neither the provider's nor the device's state; an accepted one leaves both where the
// kernel driver and libefa would; the QP can always be destroyed.
func FuzzQPAttrs(f *testing.F) {
	f.Add([]byte{0, 1, 16, 0, 16, 0, 1, 1, 1, 0, 0, 0, 0x7f, 0x01, 0, 0, 0, 0, 1, 0, 0, 0, 0x01, 0, 0, 0})
	f.Add([]byte{1, 0, 0, 1, 0, 4, 2, 2, 0, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	dev, err := verbs.NewDevice(config.Device{Name: "efa_fuzz"})
	if err != nil {
		f.Fatal(err)
	}
	defer dev.Close()
	ctx, err := dev.Open()
	if err != nil {
		f.Fatal(err)
	}
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		f.Fatal(err)
	}
	cq, err := ctx.CreateCQ(64, nil, nil, 0)
	if err != nil {
		f.Fatal(err)
	}
	errnos := []error{syscall.EINVAL, syscall.EOPNOTSUPP, syscall.ENOMEM}
	isErrno := func(err error) bool {
		for _, e := range errnos {
			if errors.Is(err, e) {
				return true
			}
		}
		return false
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r := reader{b: b}
		attr := verbs.QPInitAttrEx{
			SendCQ: cq, RecvCQ: cq, PD: pd, CompMask: verbs.QPInitAttrPD | verbs.QPInitAttrSendOpsFlags,
			Cap: verbs.QPCap{MaxSendWR: uint32(r.u16()), MaxRecvWR: uint32(r.u16()), MaxSendSGE: uint32(r.u8() % 4),
				MaxRecvSGE: uint32(r.u8() % 4), MaxInlineData: uint32(r.u16())},
			SendOpsFlags: verbs.SendOpsFlags(r.u16()),
		}
		var qp *verbs.QP
		var err error
		if r.u8()&1 == 0 {
			attr.QPType = verbs.QPTDriver
			qp, err = efadv.CreateQPEx(ctx, &attr, &efadv.QPInitAttr{DriverQPType: efadv.DriverQPType(r.u8() % 2), Flags: efadv.QPFlags(r.u8() % 8)})
		} else {
			attr.QPType = verbs.QPTUD
			qp, err = ctx.CreateQPEx(&attr)
		}
		if err != nil {
			if !isErrno(err) {
				t.Fatalf("create: %v is not an errno", err)
			}
			return
		}
		defer func() {
			if err := qp.Destroy(); err != nil {
				t.Fatalf("destroy: %v", err)
			}
		}()
		for range 8 {
			if r.done() {
				return
			}
			a := verbs.QPAttr{
				QPState: verbs.QPState(r.u8() % 8), CurQPState: verbs.QPState(r.u8() % 8), QKey: r.u32(),
				SQPSN: r.u32(), PKeyIndex: uint16(r.u8() % 3), PortNum: r.u8() % 3, RNRRetry: r.u8() % 10,
				EnSQDAsyncNotify: r.u8()&1 == 1,
			}
			mask := verbs.QPAttrMask(r.u32())
			before, devBefore := qp.State(), deviceState(t, qp)
			err := qp.Modify(&a, mask)
			// The device's state after an accepted modify: the one asked for; without one, the
			// current state the caller vouched for (IBV_QP_CUR_STATE: the kernel driver takes
			// its word, as EFA's does); else unchanged. The provider's copy changes only with
			// IBV_QP_STATE, as libefa's.
			want := devBefore
			if mask&verbs.QPAttrCurState != 0 {
				want = a.CurQPState
			}
			if mask&verbs.QPAttrState != 0 {
				want = a.QPState
			}
			switch dev := deviceState(t, qp); {
			case err != nil && !isErrno(err):
				t.Fatalf("modify %+v mask %#x: %v is not an errno", a, mask, err)
			case err != nil && (qp.State() != before || dev != devBefore):
				t.Fatalf("refused modify moved the QP from %v/%v to %v/%v", before, devBefore, qp.State(), dev)
			case err == nil && mask&verbs.QPAttrState != 0 && qp.State() != a.QPState:
				t.Fatalf("accepted modify to %v left the provider's QP in %v", a.QPState, qp.State())
			case err == nil && dev != want:
				t.Fatalf("accepted modify (state %v, current %v, mask %#x) left the device's QP in %v, want %v",
					a.QPState, a.CurQPState, mask, dev, want)
			}
		}
	})
}

// deviceState is the QP's state as the device reports it (ibv_query_qp).
func deviceState(t *testing.T, qp *verbs.QP) verbs.QPState {
	a, _, err := qp.Query(verbs.QPAttrState)
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	return a.QPState
}

// reader hands out the fuzzer's bytes as integers, zeros once they run out.
type reader struct{ b []byte }

func (r *reader) done() bool { return len(r.b) == 0 }

func (r *reader) take(n int) []byte {
	var out [4]byte
	k := copy(out[:n], r.b)
	r.b = r.b[k:]
	return out[:n]
}

func (r *reader) u8() uint8   { return r.take(1)[0] }
func (r *reader) u16() uint16 { return binary.LittleEndian.Uint16(r.take(2)) }
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.take(4)) }
