package verbs_test

import (
	"context"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/link/memlink"
	"github.com/softefa/softefa/verbs"
)

// The transport timeout counts from when a request is posted, however long the device has been
// up: the first WR to a peer after a quiet spell, or to a new peer, gets the whole timeout.
func TestTimeoutCountsFromPost(t *testing.T) {
	inWorlds(t, 3, func(t *testing.T, w *world) {
		a, b := w.pair(2, loopOpts{})
		exchange(t, a, b, 2, 100, 100, 1)
		w.sleep(3 * time.Second) // quiet, and three transport timeouts older

		// A peer that pauses for 200 ms: the WR waits for it and succeeds.
		down := memlink.Impairment{Down: true}
		w.f.SetPath(0, down)
		w.f.SetPath(1, down)
		w.afterFunc(200*time.Millisecond, func() {
			w.f.SetPath(0, memlink.Impairment{})
			w.f.SetPath(1, memlink.Impairment{})
		})
		b.recv(1, 0, 100)
		a.send(2, b, 0, 100)
		wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 1, verbs.WCSuccess, verbs.WCRecv)

		// An address nobody listens at: the failure comes after the whole timeout.
		w.sleep(3 * time.Second)
		ghost := a.makeAH(verbs.GID{10: 0xff, 11: 0xff, 12: 10, 13: 0, 14: 0, 15: 9, 8: 0x12, 9: 0xb7})
		start := w.now()
		a.sendAH(3, ghost, 5, 10)
		wc := a.one()
		if took := w.now() - start; wc.WRID != 3 || efaio.Status(wc.VendorErr) != efaio.StatusLocalUnreachRemote || took < time.Second {
			t.Fatalf("completion %+v after %v; want UNREACH_REMOTE after the 1 s transport timeout", wc, took)
		}
		check(t, ghost.Destroy())
	})
}

// Completions destroyed QPs left in their CQ are dropped, however often the QPs' number has been
// reused since, and never index a later QP's books: with a table of 6 numbers and 4096-entry
// queues (4 generation bits in a request id), generations alias after 16 reuses, so the request
// id alone would take a stale entry for the live QP's receive at the same index (a stale entry
// used to panic in the pool, then complete another QP's WR, then was delivered as the old QP's
// under a number the live QP holds).
func TestStaleCompletionsAfterQPNReuse(t *testing.T) {
	f := newQPFixture(t, func(c *config.Device) { c.QPNTableSize = 8 })
	cq := must[*verbs.CQ](t)(f.ctx.CreateCQ(4096, nil, nil, 0))
	const n = 200
	toInit := func(qp *verbs.QP) {
		t.Helper()
		check(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: qkey},
			verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrQKey))
	}
	for i := range n {
		a := f.srdAttr()
		a.SendCQ, a.RecvCQ = cq, cq
		a.Cap.MaxSendWR, a.Cap.MaxRecvWR = 4096, 4096
		qp := must[*verbs.QP](t)(efadv.CreateQPEx(f.ctx, &a, &efadv.QPInitAttr{}))
		toInit(qp)
		_, err := qp.PostRecv([]verbs.RecvWR{{WRID: uint64(1000 + i)}})
		check(t, err)
		check(t, qp.Destroy()) // one FLUSHED entry, left unpolled
	}
	a := f.srdAttr()
	a.SendCQ, a.RecvCQ = cq, cq
	a.Cap.MaxSendWR, a.Cap.MaxRecvWR = 4096, 4096
	live := must[*verbs.QP](t)(efadv.CreateQPEx(f.ctx, &a, &efadv.QPInitAttr{})) // holds a reused number
	toInit(live)
	_, err := live.PostRecv([]verbs.RecvWR{{WRID: 7}}) // pool index 0, as every stale entry's
	check(t, err)
	waitDropped(t, cq, n)
	check(t, live.Modify(&verbs.QPAttr{QPState: verbs.QPSErr}, verbs.QPAttrState))
	wantWC(t, waitWC(t, cq, 1)[0], 7, verbs.WCWRFlushErr, verbs.WCRecv)
	if k, err := cq.Poll(make([]verbs.WC, 1)); k != 0 || err != nil {
		t.Fatalf("poll after the live QP's flush: %d, %v", k, err)
	}
	check(t, live.Destroy())
	check(t, cq.Destroy())
}

// A QP reset with completions unpolled and then destroyed leaves them to be dropped too: the
// books its reset kept for them are a destroyed QP's now (they used to deliver them).
func TestDestroyDropsEntriesFromBeforeReset(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := newLoop(t, loopOpts{})
		b.recv(1, 0, 100)
		a.send(2, b, 0, 100)
		synctest.Wait()
		wantWC(t, b.one(), 1, verbs.WCSuccess, verbs.WCRecv)
		check(t, a.qp.Modify(&verbs.QPAttr{QPState: verbs.QPSReset}, verbs.QPAttrState)) // the send's entry unpolled
		check(t, a.qp.Destroy())
		a.qp, a.x = nil, nil
		waitDropped(t, a.cq, 1)
		a.empty()
	})
}

// A destroyed QP leaves nothing reachable: creating and destroying QPs one at a time does not
// grow the heap, whether or not their numbers have come round again.
func TestDestroyedQPsReleaseMemory(t *testing.T) {
	f := newQPFixture(t, nil)
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	cycle := func() {
		a := f.srdAttr()
		a.Cap.MaxSendWR, a.Cap.MaxRecvWR = 1024, 1024
		qp := must[*verbs.QP](t)(efadv.CreateQPEx(f.ctx, &a, &efadv.QPInitAttr{}))
		check(t, qp.Destroy())
	}
	for range 20 {
		cycle()
	}
	before := heap()
	const n = 500 // each holds ~150 KB of rings and books
	for range n {
		cycle()
	}
	if grew := int64(heap()) - int64(before); grew > 8<<20 {
		t.Fatalf("heap grew %d KB over %d destroyed QPs (%d B each)", grew>>10, n, grew/n)
	}
}

// A device with QPs and a peer but nothing outstanding does not wake: no timer ticks while idle
// (10,000 idle devices in one process ticking every 16 ms took both cores), and traffic after the
// quiet spell is served as before.
func TestIdleDeviceDoesNotWake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := memPair(t, memlink.New(1), 2, loopOpts{})
		exchange(t, a, b, 4, 1000, 10000, 1)
		time.Sleep(2 * time.Second) // the last ACKs, timers running down
		before := [2]uint64{a.ctx.Counters().EngineWakeups, b.ctx.Counters().EngineWakeups}
		time.Sleep(10 * time.Second)
		after := [2]uint64{a.ctx.Counters().EngineWakeups, b.ctx.Counters().EngineWakeups}
		if after != before {
			t.Fatalf("engine loops woke %d and %d times in 10 idle seconds", after[0]-before[0], after[1]-before[1])
		}
		exchange(t, a, b, 4, 1000, 10000, 2)
	})
}

// Every 16-bit counter of the data path wraps, several times, without a WR lost, doubled or given
// the wrong id: SQ and RQ producer and consumer counts, CQ producer and consumer counts and their
// phases, and the request-id pools, on queues of 8 and a CQ of 16, for 140,000 WRs a side.
func TestQueueCountersWrap(t *testing.T) {
	a, b := newLoop(t, loopOpts{cqe: 16, cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	rounds := 140_000
	if testing.Short() {
		rounds = 70_000
	}
	for i := range rounds {
		id := uint64(i)<<8 | 0x5a
		b.recv(id, 0, 64)
		a.send(id, b, 0, 64)
		wantWC(t, a.one(), id, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), id, verbs.WCSuccess, verbs.WCRecv)
	}
	if a.cq.BadCompletions()+b.cq.BadCompletions() != 0 {
		t.Fatalf("%d completions dropped", a.cq.BadCompletions()+b.cq.BadCompletions())
	}
}

// A destroyed QP's entries are dropped as its own however full its CQ is: four UD QPs with 8192
// receives each fill a CQ of 32768 with flushes, and the last QP's fence is a whole ring (2^15,
// the most-negative int16) ahead of the consumer. Its grave used to be dropped as passed already,
// and its entries taken for an unknown QP's.
func TestFullCQDropsDestroyedQPsCompletions(t *testing.T) {
	f := newQPFixture(t, nil)
	const nQP, nWR = 4, 8192
	cq := must[*verbs.CQ](t)(f.ctx.CreateCQ(nQP*nWR, nil, nil, 0))
	t.Cleanup(func() { check(t, cq.Destroy()) })
	wrs := make([]verbs.RecvWR, nWR)
	for q := range nQP {
		qp := must[*verbs.QP](t)(f.pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTUD,
			Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: nWR, MaxSendSGE: 1, MaxRecvSGE: 1}}))
		check(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: qkey},
			verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrQKey))
		for i := range wrs {
			wrs[i].WRID = uint64(q*nWR + i)
		}
		_, err := qp.PostRecv(wrs)
		check(t, err)
		check(t, qp.Destroy())
	}
	for q := range nQP {
		if err := waitDropped(t, cq, nWR); !strings.Contains(err.Error(), "destroyed QP") {
			t.Fatalf("QP %d's entries: %v, want them dropped as a destroyed QP's", q, err)
		}
	}
	if k, err := cq.Poll(make([]verbs.WC, 1)); k != 0 || err != nil || cq.Overrun() {
		t.Fatalf("after the flushes: poll %d, %v; overrun %v", k, err, cq.Overrun())
	}
}

// One StartPoll session may go on for ever with little outstanding: each entry NextPoll takes is
// reported in the doorbell at once, so the device does not find a CQ of 16 full at its 17th entry
// (it used to see the session's first count until EndPoll, drop the entry and mark the CQ overrun).
func TestLongPollSessionReportsConsumption(t *testing.T) {
	a, b := newLoop(t, loopOpts{typ: verbs.QPTUD, cqe: 16})
	await := func(poll func() error) {
		t.Helper()
		for {
			err := poll()
			if err == nil {
				return
			}
			if !errorsIs(err, syscall.ENOENT) || a.cq.Overrun() {
				t.Fatalf("poll: %v; CQ overrun %v", err, a.cq.Overrun())
			}
			runtime.Gosched()
		}
	}
	a.send(0, b, 0, 8) // no receive at b: dropped there, a success here
	await(func() error { return a.cq.StartPoll(verbs.PollCQAttr{}) })
	for i := range uint64(3 * 16) {
		if i > 0 {
			a.send(i, b, 0, 8)
			await(a.cq.NextPoll)
		}
		if a.cq.WRID() != i || a.cq.Status() != verbs.WCSuccess {
			t.Fatalf("completion %d: wr_id %d status %v", i, a.cq.WRID(), a.cq.Status())
		}
	}
	a.cq.EndPoll()
}

// A completion written before a QP went through RESET, and polled after, is the old WR's: it is
// polled with its own wr_id and counts against neither queue of the QP's new life. In 64-bit
// request-id mode it used to count as a completion of the emptied send queue, whose outstanding
// count then wrapped (every later post ENOMEM); with 16-bit request ids it named the same index
// and generation as the first WR posted after the reset, and completed that one early.
func TestCompletionFromBeforeResetKeepsItsLife(t *testing.T) {
	for _, id64 := range []bool{false, true} {
		t.Run(map[bool]string{false: "16-bit", true: "64-bit"}[id64], func(t *testing.T) {
			a, b := newLoop(t, loopOpts{typ: verbs.QPTUD, cfg: func(c *config.Device) { c.RequestID64 = id64 }})
			ch := must[*verbs.CompChannel](t)(a.ctx.CreateCompChannel())
			t.Cleanup(func() { check(t, ch.Destroy()) })
			cq := must[*verbs.CQ](t)(a.ctx.CreateCQ(64, nil, ch, 0))
			t.Cleanup(func() { check(t, cq.Destroy()) })
			qp := must[*verbs.QP](t)(a.pd.CreateQP(&verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTUD,
				Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}))
			t.Cleanup(func() { check(t, qp.Destroy()) })
			toRTS := func() {
				t.Helper()
				check(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: qkey},
					verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrQKey))
				check(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState))
				check(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSRTS, SQPSN: 1}, verbs.QPAttrState|verbs.QPAttrSQPSN))
			}
			send := func(wrid uint64) error {
				_, err := qp.PostSend([]verbs.SendWR{{WRID: wrid, SGList: []verbs.SGE{a.mr.SGE(0, 8)}, Opcode: verbs.WRSend,
					SendFlags: verbs.SendSignaled, AH: a.ah, RemoteQPN: b.qp.QPN(), RemoteQKey: qkey}})
				return err
			}
			toRTS()
			check(t, cq.ReqNotify(false))
			check(t, send(7)) // no receive at b: a success here
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			must[*verbs.CQ](t)(ch.GetCQEvent(ctx)) // its completion is in the ring, not polled
			cq.AckEvents(1)

			check(t, qp.Modify(&verbs.QPAttr{QPState: verbs.QPSReset}, verbs.QPAttrState))
			toRTS()
			check(t, send(8))
			for i, wc := range waitWC(t, cq, 2) {
				wantWC(t, wc, uint64(7+i), verbs.WCSuccess, verbs.WCSend)
			}
			for i := range uint64(16) { // a whole queue, and the next one ENOMEM
				if err := send(100 + i); err != nil {
					t.Fatalf("post %d of 16: %v", i+1, err)
				}
			}
			wantErrno(t, send(116), syscall.ENOMEM)
			for i, wc := range waitWC(t, cq, 16) {
				wantWC(t, wc, uint64(100+i), verbs.WCSuccess, verbs.WCSend)
			}
			if cq.BadCompletions() != 0 {
				t.Fatalf("%d completions dropped", cq.BadCompletions())
			}
		})
	}
}
