package verbs_test

import (
	"fmt"
	"sync"
	"syscall"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/internal/testkit"
	"github.com/softefa/softefa/verbs"
)

// Regression tests for calls with bad input: destroyed objects, objects of another PD, nil
// arguments, out-of-range numbers. Each must fail with its errno, not panic, and change nothing.

// After QP.Destroy every post, QPEx session, Modify, Query, doorbell and a second Destroy is
// EINVAL (they were accepted, and the WRs never completed).
func TestDestroyedQPRefusesEverything(t *testing.T) {
	a, b := newLoop(t, loopOpts{})
	qp, x := a.qp, a.x
	sq, _, err := efadv.QueryQPWQs(qp)
	check(t, err)
	check(t, qp.Destroy())
	a.qp, a.x = nil, nil // destroyed here, not by the cleanup
	send := verbs.SendWR{WRID: 1, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, AH: a.ah,
		RemoteQPN: b.qp.QPN(), RemoteQKey: qkey, SGList: []verbs.SGE{a.mr.SGE(0, 8)}}
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"PostSend", func() error {
			n, err := qp.PostSend([]verbs.SendWR{send})
			if n != 0 {
				return fmt.Errorf("PostSend n = %d", n)
			}
			return err
		}},
		{"PostRecv", func() error {
			n, err := qp.PostRecv([]verbs.RecvWR{{WRID: 2, SGList: []verbs.SGE{a.mr.SGE(0, 8)}}})
			if n != 0 {
				return fmt.Errorf("PostRecv n = %d", n)
			}
			return err
		}},
		{"QPEx", func() error {
			x.WRStart()
			x.WRID, x.WRFlags = 3, verbs.SendSignaled
			x.WRSend()
			x.WRSetUDAddr(a.ah, b.qp.QPN(), qkey)
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 8)
			return x.WRComplete()
		}},
		{"Modify", func() error { return qp.Modify(&verbs.QPAttr{QPState: verbs.QPSErr}, verbs.QPAttrState) }},
		{"Query", func() error { _, _, err := qp.Query(verbs.QPAttrState); return err }},
		{"RingDoorbell", func() error { return efadv.RingDoorbell(qp, sq.Doorbell, 1) }},
		{"Destroy", qp.Destroy},
	} {
		t.Run(c.name, func(t *testing.T) { wantErrno(t, testkit.NoPanic(c.f), syscall.EINVAL) })
	}
	a.empty() // nothing was posted
}

// Posts racing a Destroy: each is either refused with EINVAL or leaves one entry (its flush, which
// polling drops, as it drops every entry of a destroyed QP); none is taken and lost. Run with -race, this checks that Destroy and the posts synchronise.
func TestDestroyRacesPosts(t *testing.T) {
	// The CQ holds a flush for every receive the queue can take: one of 256 overran when more
	// than 256 posts got in before the Destroy.
	a, _ := newLoop(t, loopOpts{cqe: 1024, cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 1024, MaxSendSGE: 1, MaxRecvSGE: 1}})
	qp := a.qp
	a.qp, a.x = nil, nil
	const posters, tries = 4, 2000
	accepted := make([]int, posters)
	posting := make(chan struct{}) // closed at the first accepted post: Destroy comes amid posts
	var once sync.Once
	var wg sync.WaitGroup
	for p := range posters {
		wg.Go(func() {
			for range tries {
				_, err := qp.PostRecv([]verbs.RecvWR{{WRID: uint64(p), SGList: []verbs.SGE{a.mr.SGE(0, 8)}}})
				switch {
				case err == nil:
					accepted[p]++
					once.Do(func() { close(posting) })
				case errorsIs(err, syscall.EINVAL):
					return
				case !errorsIs(err, syscall.ENOMEM): // ENOMEM: the queue is full until Destroy
					t.Error(err)
					return
				}
				runtimeGosched()
			}
		})
	}
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-posting:
	case <-ended: // every poster failed: the errors are reported
	}
	check(t, qp.Destroy())
	<-ended
	total := 0
	for _, n := range accepted {
		total += n
	}
	waitDropped(t, a.cq, total)
	a.empty()
}

// An AH of another PD is refused: the device would look its number up in the QP's PD and send
// to whatever AH has that number there.
func TestAHOfAnotherPD(t *testing.T) {
	a, b := newLoop(t, loopOpts{})
	pd2 := must[*verbs.PD](t)(a.ctx.AllocPD())
	ah2 := must[*verbs.AH](t)(pd2.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: verbs.GID{15: 9}}, PortNum: 1}))
	t.Cleanup(func() { check(t, ah2.Destroy()); check(t, pd2.Dealloc()) })
	if verbs.AHN(ah2) != verbs.AHN(a.ah) {
		t.Fatalf("AH numbers %d and %d: the test needs them equal", verbs.AHN(ah2), verbs.AHN(a.ah))
	}
	b.recv(7, 0, 64)
	wr := func(id uint64, ah *verbs.AH) verbs.SendWR {
		return verbs.SendWR{WRID: id, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled, AH: ah,
			RemoteQPN: b.qp.QPN(), RemoteQKey: qkey, SGList: []verbs.SGE{a.mr.SGE(0, 8)}}
	}
	t.Run("PostSend", func(t *testing.T) {
		n, err := a.qp.PostSend([]verbs.SendWR{wr(1, a.ah), wr(2, ah2), wr(3, a.ah)})
		wantErrno(t, err, syscall.EINVAL)
		if n != 1 {
			t.Fatalf("bad WR index %d, want 1", n)
		}
		wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 7, verbs.WCSuccess, verbs.WCRecv)
		a.empty()
	})
	t.Run("QPEx", func(t *testing.T) {
		a.x.WRStart()
		a.x.WRID, a.x.WRFlags = 4, verbs.SendSignaled
		a.x.WRSend()
		a.x.WRSetUDAddr(ah2, b.qp.QPN(), qkey)
		a.x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 8)
		wantErrno(t, a.x.WRComplete(), syscall.EINVAL)
		a.empty()
	})
}

// A second Destroy (Dealloc, Dereg) is EINVAL and changes nothing: it does not drop another
// handle's share of an AH, nor count the context's objects down twice.
func TestDestroyTwice(t *testing.T) {
	dev := newDevice(t, nil)
	ctx := must[*verbs.Context](t)(dev.Open()) // closed here: Close must see the right object count
	pd := must[*verbs.PD](t)(ctx.AllocPD())
	attr := &verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: verbs.GID{15: 1}}, PortNum: 1}
	ah1 := must[*verbs.AH](t)(pd.CreateAH(attr))
	ah2 := must[*verbs.AH](t)(pd.CreateAH(attr)) // shares ah1's device AH
	cq := must[*verbs.CQ](t)(ctx.CreateCQ(8, nil, nil, 0))
	mr := must[*verbs.MR](t)(pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite))
	pd2 := must[*verbs.PD](t)(ctx.AllocPD())
	ch := must[*verbs.CompChannel](t)(ctx.CreateCompChannel())
	qp := must[*verbs.QP](t)(pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTUD,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}))
	for _, c := range []struct {
		name    string
		destroy func() error
	}{
		{"AH", ah1.Destroy},
		{"CompChannel", ch.Destroy},
		{"QP", qp.Destroy},
		{"MR", mr.Dereg},
		{"CQ", cq.Destroy},
		{"PD", pd2.Dealloc},
	} {
		t.Run(c.name, func(t *testing.T) {
			check(t, c.destroy())
			wantErrno(t, testkit.NoPanic(c.destroy), syscall.EINVAL)
		})
	}
	// ah2 still holds the device AH: a new AH for the GID gets its number.
	ah3 := must[*verbs.AH](t)(pd.CreateAH(attr))
	if verbs.AHN(ah3) != verbs.AHN(ah2) {
		t.Fatalf("AH for the same GID numbered %d, the live one %d", verbs.AHN(ah3), verbs.AHN(ah2))
	}
	check(t, ah3.Destroy())
	check(t, ah2.Destroy())
	wantErrno(t, ctx.Close(), syscall.EBUSY) // pd remains
	check(t, pd.Dealloc())
	check(t, ctx.Close())
}

// EndPoll without an open session (StartPoll found the CQ empty, or was not called, or EndPoll
// already ended it) does nothing; it used to unlock an unlocked mutex, a fatal error.
func TestEndPollWithoutSession(t *testing.T) {
	for _, single := range []bool{false, true} {
		t.Run(fmt.Sprintf("single=%v", single), func(t *testing.T) {
			a, b := newLoop(t, loopOpts{})
			cq := a.cq
			if single {
				cq = must[*verbs.CQ](t)(a.ctx.CreateCQEx(&verbs.CQInitAttrEx{CQE: 8, CompMask: verbs.CQInitAttrFlags,
					Flags: verbs.CreateCQSingleThreaded}))
				t.Cleanup(func() { check(t, cq.Destroy()) })
			}
			cq.EndPoll() // no StartPoll at all
			wantErrno(t, cq.StartPoll(verbs.PollCQAttr{}), syscall.ENOENT)
			cq.EndPoll()
			cq.EndPoll()
			if single {
				return
			}
			// A real session still works, and a second EndPoll after it does nothing.
			b.recv(1, 0, 8)
			a.send(2, b, 0, 8)
			waitStart(t, cq)
			if cq.WRID() != 2 {
				t.Fatalf("wr_id %d", cq.WRID())
			}
			cq.EndPoll()
			cq.EndPoll()
			a.empty() // Poll takes the lock: it was released once, not twice
			b.one()
		})
	}
}

func waitStart(t *testing.T, cq *verbs.CQ) {
	t.Helper()
	for {
		err := cq.StartPoll(verbs.PollCQAttr{})
		if err == nil {
			return
		}
		if !errorsIs(err, syscall.ENOENT) {
			t.Fatal(err)
		}
		runtimeGosched()
	}
}

// Nil arguments and a nil QP are EINVAL, not a panic.
func TestNilArguments(t *testing.T) {
	f := newQPFixture(t, nil)
	qp := f.srd(t)
	t.Cleanup(func() { check(t, qp.Destroy()) })
	var nilQP *verbs.QP
	var nilPD *verbs.PD
	udAttr := func() *verbs.QPInitAttr {
		return &verbs.QPInitAttr{SendCQ: f.cq, RecvCQ: f.cq, QPType: verbs.QPTUD, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}
	}
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"Modify", func() error { return qp.Modify(nil, verbs.QPAttrState) }},
		{"CreateQP", func() error { _, err := f.pd.CreateQP(nil); return err }},
		{"CreateQP nil PD", func() error { _, err := nilPD.CreateQP(udAttr()); return err }},
		{"CreateQPEx", func() error { _, err := f.ctx.CreateQPEx(nil); return err }},
		{"CreateAH", func() error { _, err := f.pd.CreateAH(nil); return err }},
		{"CreateCQEx", func() error { _, err := f.ctx.CreateCQEx(nil); return err }},
		{"PostSend nil QP", func() error { _, err := nilQP.PostSend([]verbs.SendWR{{}}); return err }},
		{"PostRecv nil QP", func() error { _, err := nilQP.PostRecv([]verbs.RecvWR{{}}); return err }},
	} {
		t.Run(c.name, func(t *testing.T) { wantErrno(t, testkit.NoPanic(c.f), syscall.EINVAL) })
	}
}

// CreateCQ takes completion vectors [0, num_comp_vectors), as the kernel does; CreateAH takes
// port 1 only.
func TestCQVectorAndAHPort(t *testing.T) {
	ctx := openCtx(t, newDevice(t, func(c *config.Device) { c.CompVectors = 2 }))
	for _, v := range []int{-1, 2, 1 << 20} {
		_, err := ctx.CreateCQ(8, nil, nil, v)
		wantErrno(t, err, syscall.EINVAL)
		_, err = ctx.CreateCQEx(&verbs.CQInitAttrEx{CQE: 8, CompVector: v})
		wantErrno(t, err, syscall.EINVAL)
	}
	for _, v := range []int{0, 1} {
		check(t, must[*verbs.CQ](t)(ctx.CreateCQ(8, nil, nil, v)).Destroy())
	}
	pd := must[*verbs.PD](t)(ctx.AllocPD())
	defer pd.Dealloc()
	for _, port := range []uint8{0, 2, 255} {
		_, err := pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: verbs.GID{15: 1}}, PortNum: port})
		wantErrno(t, err, syscall.EINVAL)
	}
	check(t, must[*verbs.AH](t)(pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: verbs.GID{15: 1}},
		PortNum: 1})).Destroy())
}

// Acknowledging more completion events than were got, or a negative number, acknowledges at
// most those got: the CQ can still be destroyed (it stayed EBUSY for ever).
func TestAckEventsBounded(t *testing.T) {
	a, _ := newLoop(t, loopOpts{})
	cq, err := a.ctx.CreateCQ(16, nil, nil, 0)
	check(t, err)
	cq.AckEvents(-3)
	cq.AckEvents(10)
	if err := cq.Destroy(); err != nil {
		t.Fatalf("destroy after acknowledging events never got: %v", err)
	}
}
