package engine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/link"
)

// udpRig is an access rig on a device of its own over UDP on loopback.
func udpRig(t *testing.T) *accessRig {
	l, err := link.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return newAccessRigOn(t, config.Device{Addr: l.LocalAddr(), Link: l})
}

// drivenRig is an access rig on a driven device of its own over UDP on loopback (no receive loop,
// no timer: the test calls Drive), with clock as its clock.
func drivenRig(t *testing.T, clock func() time.Duration) *accessRig {
	l, err := link.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return newAccessRigOn(t, config.Device{Addr: l.LocalAddr(), Link: l, Driven: true, Clock: clock})
}

// postSend posts, in slot 0 of each queue, a receive WR at b (req_id 7, 64 bytes at the start of
// region A) and a SEND of msg from a (req_id 3, from the start of its region A) through ah, and
// stores both doorbells; the caller rings or drives a.
func postSend(a, b *accessRig, ah *AH, msg string) {
	efaio.RxDesc(b.q.rq.ring[:efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: b.a.iova, ReqID: 7,
		Length: 64, LKey: b.a.lkey, First: true, Last: true})
	atomic.StoreUint32(b.q.rq.db, 1)
	copy(a.inA, msg)
	a.q.sq.slot(0).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: 3, Length: 1, AHN: ah.ahn, QKey: 9,
		DestQPN: uint16(b.q.qpn), CompReq: true, Phase: a.q.sq.phase,
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: uint32(len(msg)), LKey: a.a.lkey, Addr: a.a.iova}}})
	atomic.StoreUint32(a.q.sq.db, 1)
}

// awaitCQ polls the network on the calling goroutine, as PollNetwork does, until cq has written
// past slot's previous lap (its next entry to write is no longer slot) or budget has passed,
// sending owed ACKs at once: the tests' way to wait for a completion with no receive loop.
func (d *Device) awaitCQ(cq *CQ, slot uint32, budget time.Duration) {
	if slot >= cq.depth {
		return
	}
	d.pollWhile(func() bool { return cq.Written()&(cq.depth-1) == slot }, budget, false)
}

// AwaitRecv, a program's thread lingering after a post for the answer to it (docs/cabi.md,
// "Lingering after a post"): the thread polls the network until its QP has completed a receive
// past the count it saw. The budget is an hour, so a wait that missed its receive would hang the
// test rather than pass it.
func TestAwaitRecv(t *testing.T) {
	defer func(d time.Duration, y func()) { yieldAfter, yield = d, y }(yieldAfter, yield)
	var yields int
	yield = func() { yields++; OSYield() }
	for _, after := range []time.Duration{time.Hour, 0} {
		t.Run(fmt.Sprintf("yieldAfter=%v", after), func(t *testing.T) {
			yieldAfter, yields = after, 0
			testAwaitRecv(t)
			// Nothing comes: the wait polls out its budget of 20 ms. Past yieldAfter, each poll
			// that found nothing offers the core (OSYield): with 0, from the first; with an
			// hour, none.
			b := udpRig(t)
			b.d.AwaitRecv(b.q, 0, 20*time.Millisecond)
			if after == 0 && yields == 0 || after > 0 && yields > 0 {
				t.Errorf("%d yields with yieldAfter %v", yields, after)
			}
		})
	}
}

func testAwaitRecv(t *testing.T) {
	a, b := udpRig(t), udpRig(t)
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	b.d.AwaitRecv(b.q, 1, time.Hour) // a receive past 1 is not the next one: back at once

	const msg = "taken off the socket by the lingering thread"
	postSend(a, b, ah, msg)
	if a.q.TalksToPeers() {
		t.Fatal("a QP that has sent nothing talks to peers")
	}
	a.d.Ring(a.q)
	if !a.q.TalksToPeers() {
		t.Fatal("a QP that has sent to another device does not talk to peers (it would never linger)")
	}

	b.d.AwaitRecv(b.q, 0, time.Hour)
	if n := b.q.Recvs(); n != 1 {
		t.Fatalf("the receiver has completed %d receives after the wait, want 1", n)
	}
	if got := string(b.inA[:len(msg)]); got != msg {
		t.Errorf("the receive buffer holds %q, want %q", got, msg)
	}
	if b.q.recvCQ.Written() != 1 {
		t.Errorf("the receiver's CQ holds %d entries after the wait, want 1", b.q.recvCQ.Written())
	}
	b.d.AwaitRecv(b.q, 1, 0) // nothing more comes: with no budget, one poll and back
	if b.q.TalksToPeers() {
		t.Error("a QP that has only received talks to peers")
	}
}

// AwaitRecv waits for the QP's sends on the network as well as for its next receive: the program
// looks for both completions next (libfabric's fi_pingpong waits for its send's first), and an ACK
// that comes after the answer must be taken off the socket too. With yieldAfter 0, every poll
// that found nothing yields: the count shows whether the wait polled on or came back at once.
func TestAwaitRecvWaitsForSends(t *testing.T) {
	defer func(d time.Duration, y func()) { yieldAfter, yield = d, y }(yieldAfter, yield)
	var yields int
	yieldAfter, yield = 0, func() { yields++ }

	// Its SEND answered, a QP whose receive count is past seen has nothing to wait for.
	a, b := udpRig(t), udpRig(t)
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	postSend(a, b, ah, "answered")
	a.d.Ring(a.q)
	a.d.awaitCQ(a.q.sendCQ, 0, time.Hour)
	yields = 0                       // (awaitCQ's)
	a.d.AwaitRecv(a.q, 1, time.Hour) // (an hour: a wait that polled on would hang the test)
	if yields != 0 {
		t.Fatalf("%d empty polls with no send on the network and the receive count past seen", yields)
	}

	// A SEND to a device that answers nothing (closed) keeps the wait going for its budget.
	c, dead := udpRig(t), udpRig(t)
	ah, err = c.d.CreateAH(c.pd, dead.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	dead.d.Close()
	postSend(c, dead, ah, "unanswered")
	c.d.Ring(c.q)
	awaitOut(t, c.q, 1)
	c.d.AwaitRecv(c.q, 1, 20*time.Millisecond)
	if yields == 0 {
		t.Error("AwaitRecv came back at once with a send of the QP unanswered")
	}

	// With more than the post's own send on the network (a stream, not a ping-pong), the next
	// receive is enough: waiting for the whole flight would drain the program's pipeline.
	c.q.sq.slot(1).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: 4, Length: 1, AHN: ah.ahn, QKey: 9,
		DestQPN: uint16(dead.q.qpn), CompReq: true, Phase: c.q.sq.phase,
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: 8, LKey: c.a.lkey, Addr: c.a.iova}}})
	atomic.StoreUint32(c.q.sq.db, 2)
	c.d.Ring(c.q)
	awaitOut(t, c.q, 2)
	yields = 0
	c.d.AwaitRecv(c.q, 1, time.Hour) // (an hour: a wait that polled on would hang the test)
	if yields != 0 {
		t.Errorf("%d empty polls with two sends on the network and the receive count past seen", yields)
	}
}

// An inline SEND keeps the bytes that were posted while it waits for the peer: the SQ slot it
// came from may be written again before it completes (libefa reuses a slot once fewer than a
// ring's worth of WRs are outstanding, and SRD completes out of order), and its RNR retry (or a
// retransmission) must not send what the slot holds by then.
func TestInlineSendOutlivesItsSlot(t *testing.T) {
	a, b := udpRig(t), udpRig(t)
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	const posted, later = "posted inline", "slot written again"
	a.q.sq.slot(0).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: 3, Inline: true, Length: uint16(len(posted)),
		InlineBuf: []byte(posted), AHN: ah.ahn, QKey: 9, DestQPN: uint16(b.q.qpn), CompReq: true, Phase: a.q.sq.phase})
	atomic.StoreUint32(a.q.sq.db, 1)
	a.d.Ring(a.q) // no receive posted at b: RNR, and the SEND waits to be tried again

	// The peer's RNR answer parks the SEND; then its slot is written again, and b posts a receive.
	for parked := false; !parked; {
		a.d.mu.Lock()
		parked = len(a.q.parked) > 0
		a.d.mu.Unlock()
		b.d.PollNetwork()
		a.d.PollNetwork()
	}
	a.q.sq.slot(0).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: 4, Inline: true, Length: uint16(len(later)),
		InlineBuf: []byte(later), AHN: ah.ahn, QKey: 9, DestQPN: uint16(b.q.qpn), CompReq: true, Phase: a.q.sq.phase})
	efaio.RxDesc(b.q.rq.ring[:efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: b.a.iova, ReqID: 7,
		Length: 64, LKey: b.a.lkey, First: true, Last: true})
	atomic.StoreUint32(b.q.rq.db, 1)

	b.d.awaitCQ(b.q.recvCQ, 0, time.Hour)
	if got := string(b.inA[:len(posted)]); got != posted {
		t.Errorf("the receiver got %q, want the bytes posted, %q", got, posted)
	}
}

// FlushAcks sends at once the ACKs a busy poll left owed (for the application's answer to carry):
// a process calls it as it exits, so that its peer's send completes instead of timing out. Two
// driven devices over UDP on loopback with a clock that stands still, so that nothing but
// FlushAcks can send the owed ACK: no receive loop, no timer. b has sent to a first (an ACK to a
// peer we talk to is what a busy poll leaves owed); a's SEND then completes on b's FlushAcks.
func TestFlushAcksLeavesNoneOwed(t *testing.T) {
	now := time.Second // (a send time of 0 reads as "never sent")
	clock := func() time.Duration { return now }
	a, b := drivenRig(t, clock), drivenRig(t, clock)
	post := func(from, to *accessRig, reqID uint16) {
		t.Helper()
		ah, err := from.d.CreateAH(from.pd, to.d.GID())
		if err != nil {
			t.Fatal(err)
		}
		// (each queue gets one entry in this test: slot 0, doorbell 1)
		efaio.RxDesc(to.q.rq.ring[:efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: to.a.iova, ReqID: reqID,
			Length: 64, LKey: to.a.lkey, First: true, Last: true})
		atomic.StoreUint32(to.q.rq.db, 1)
		from.q.sq.slot(0).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: reqID, Length: 1, AHN: ah.ahn, QKey: 9,
			DestQPN: uint16(to.q.qpn), CompReq: true, Phase: from.q.sq.phase,
			SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: 8, LKey: from.a.lkey, Addr: from.a.iova}}})
		atomic.StoreUint32(from.q.sq.db, 1)
	}
	// Loopback UDP loses nothing, but a datagram lost all the same would leave a loop below
	// spinning with a clock that stands still: the deadline turns that into a failure.
	deadline := time.Now().Add(time.Minute)
	waiting := func(what string) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after a minute", what)
		}
	}
	// b speaks first, and both drive until its SEND has completed.
	post(b, a, 1)
	for b.q.sendCQ.Written() == 0 {
		waiting("completion of b's SEND")
		a.d.Drive()
		b.d.Drive()
	}
	// a's SEND reaches b through a busy poll's lazy input: the ACK stays owed.
	post(a, b, 2)
	a.d.Drive()
	for b.q.recvCQ.Written() < 2 { // (one CQ for both queues: the first entry is b's SEND)
		waiting("receive of a's SEND at b")
		dr := b.d.drv
		b.d.locked(dr.q, func(now time.Duration) {
			if n, _ := dr.poller.TryReceive(dr.rx.Pkts); n > 0 {
				b.d.srd.Input(now, dr.rx, n, true)
			}
		})
	}
	if !b.d.srd.AcksOwed() {
		t.Fatal("no ACK owed after a lazy input from a peer b talks to: the test would prove nothing")
	}
	b.d.FlushAcks()
	if b.d.srd.AcksOwed() {
		t.Fatal("an ACK is still owed after FlushAcks")
	}
	for a.q.sendCQ.Written() < 2 {
		waiting("completion of a's SEND")
		a.d.Drive() // only b's flushed ACK can complete it: the clock stands still
	}
	b.d.Close()
	b.d.FlushAcks() // a closed device: nothing to send, and no panic
}

// An RDMA read whose local buffer's region is deregistered while the read is on the network
// completes at once with LOCAL_INVALID_LKEY, and its data, arriving after, places nothing: the
// application may have reused the memory. Before, the data was copied into it. Two driven devices
// over UDP on loopback: the responder has read and sent its data before the requester deregisters.
func TestReadIntoDeregisteredRegion(t *testing.T) {
	now := time.Second
	clock := func() time.Duration { return now }
	a, b := drivenRig(t, clock), drivenRig(t, clock)
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	copy(b.inA, "the responder's bytes")
	a.q.sq.slot(0).Encode(&efaio.TxDesc{Op: efaio.OpRDMARead, ReqID: 5, Length: 1, AHN: ah.ahn, QKey: 9,
		DestQPN: uint16(b.q.qpn), CompReq: true, Phase: a.q.sq.phase,
		SGL:    [efaio.TxNumBufs]efaio.BufDesc{{Length: 64, LKey: a.a.lkey, Addr: a.a.iova}},
		Remote: efaio.RemoteMem{RKey: b.a.rkey, Addr: b.a.iova, Length: 64}})
	atomic.StoreUint32(a.q.sq.db, 1)

	deadline := time.Now().Add(time.Minute) // (a datagram lost on loopback would spin for ever)
	for b.d.counts.RDMAReadRespBytes.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the responder has not read after a minute")
		}
		a.d.Drive()
		b.d.Drive()
	}
	if got := a.q.sendCQ.Written(); got != 0 {
		t.Fatalf("%d completions before the requester took the read data: the test would prove nothing", got)
	}
	if err := a.d.DeregMR(a.a); err != nil {
		t.Fatal(err)
	}
	if got := a.q.sendCQ.Written(); got != 1 {
		t.Fatalf("%d completions at the dereg, want 1", got)
	}
	e := efaio.CQE(a.q.sendCQ.ring[:a.q.sendCQ.esz])
	var c efaio.Completion
	if err := e.Decode(binary.LittleEndian.Uint32(e), &c); err != nil || c.Status != efaio.StatusLocalInvalidLKey || c.ReqID != 5 {
		t.Errorf("the completion has status %d for WR %d (%v), want %d for WR 5", c.Status, c.ReqID, err, efaio.StatusLocalInvalidLKey)
	}
	for a.d.srd.Busy() || b.d.srd.Busy() {
		if time.Now().After(deadline) {
			t.Fatal("the streams are not idle after a minute")
		}
		now += time.Millisecond
		a.d.Drive()
		b.d.Drive()
	}
	if got := a.q.sendCQ.Written(); got != 1 {
		t.Errorf("%d completions after the read data came, want still 1", got)
	}
	if !bytes.Equal(a.inA[:64], make([]byte, 64)) {
		t.Errorf("the deregistered buffer holds %q: the read data was placed", a.inA[:24])
	}
}

// RTS→SQD with EN_SQD_ASYNC_NOTIFY while a SEND is on the network (not waiting after RNR): SQ_DRAINED
// is raised when its ACK completes it. Before, only a retry of a parked WR looked, and a QP whose
// last WR completed from the network never raised it.
func TestSQDrainedByNetworkCompletion(t *testing.T) {
	now := time.Second
	clock := func() time.Duration { return now }
	a, b := drivenRig(t, clock), drivenRig(t, clock)
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	postSend(a, b, ah, "8 bytes!")
	a.d.Drive() // the SEND goes out (or its first contact does)
	if len(a.q.out) != 1 {
		t.Fatalf("%d WRs on the network, want the SEND", len(a.q.out))
	}
	if err := a.d.ModifyQP(a.q, &QPAttr{State: uapi.QPSSQD, EnSQDAsyncNotify: true}, uapi.QPAttrState|uapi.QPAttrEnSQDAsyncNotify); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for a.q.sendCQ.Written() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no completion of the SEND after a minute")
		}
		b.d.Drive()
		a.d.Drive()
	}
	a.d.mu.Lock()
	evs := slices.Clone(a.d.events)
	a.d.mu.Unlock()
	if len(evs) != 1 || evs[0].Type != uapi.EventSQDrained || evs[0].QP != a.q {
		t.Errorf("events %+v, want SQ_DRAINED for the QP", evs)
	}
}

// QP.OnRecv: a host device's answer to a program's thread, which sleeps meanwhile, for the QP's
// next receive (docs/architecture.md, "Doorbells on the host device"): told by the goroutine that
// counts the receive, once; one waiter a CQ; Withdraw takes it back. Two devices over UDP on
// loopback, each with its receive loop.
func TestQPOnRecv(t *testing.T) {
	a, b := udpRig(t), udpRig(t)
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	told := make(chan int, 2)
	w := &RecvWaiter{Fn: func(by any) {
		if by != nil {
			t.Errorf("a receive counted by the receive loop told %v", by)
		}
		told <- 1
	}}
	other := &RecvWaiter{Fn: func(any) { told <- 2 }}
	if b.q.OnRecv(1, w) {
		t.Fatal("OnRecv with the receive count already past seen registered a waiter")
	}
	if !b.q.OnRecv(0, w) {
		t.Fatal("OnRecv on an idle CQ did not register the waiter")
	}
	if b.q.OnRecv(0, w) {
		t.Error("a waiter already waiting was registered again")
	}
	if b.q.OnRecv(0, other) {
		t.Error("a second waiter on the CQ was not turned away")
	}
	if !b.d.Withdraw(w) {
		t.Error("Withdraw of a waiting waiter reported false")
	}
	if b.d.Withdraw(w) {
		t.Error("a second Withdraw reported true")
	}
	if !b.q.OnRecv(0, other) {
		t.Fatal("the CQ turned a waiter away after the first was withdrawn")
	}
	if !b.d.Withdraw(other) {
		t.Fatal("Withdraw of the second waiter reported false")
	}

	if !b.q.OnRecv(0, w) {
		t.Fatal("OnRecv did not register the waiter again")
	}
	const msg = "written while the waiter slept"
	postSend(a, b, ah, msg)
	a.d.Ring(a.q)
	if got := <-told; got != 1 {
		t.Fatalf("waiter %d told of the receive, want 1", got)
	}
	if b.q.recvCQ.Written() != 1 {
		t.Fatalf("the receiver's CQ holds %d entries when the waiter is told, want 1", b.q.recvCQ.Written())
	}
	if got := string(b.inA[:len(msg)]); got != msg {
		t.Errorf("the receive buffer holds %q, want %q", got, msg)
	}
	if b.d.Withdraw(w) {
		t.Error("Withdraw after the receive came reported true")
	}
	select {
	case got := <-told:
		t.Errorf("waiter %d told again", got)
	default:
	}
	if !b.q.OnRecv(b.q.Recvs(), w) {
		t.Error("the CQ turned the waiter away after its receive came")
	}
	b.d.Withdraw(w)
}

// awaitOut waits until q has n sends on the network, n at most 2 (QP.outN counts no further).
// Ring serves a post on the caller's goroutine only when the device is free; when the engine
// loop holds it (a busy machine), the loop serves it a moment later.
func awaitOut(t *testing.T, q *QP, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); q.outN.Load() != int32(n); runtime.Gosched() {
		if time.Now().After(deadline) {
			t.Fatalf("%d sends on the network, want %d", q.outN.Load(), n)
		}
	}
}

// samePair is two QPs of one driven device (no receive loop, no timer: nothing but the test takes
// its lock): a's rig, and b, a second QP with its own CQ sharing a's regions; ah addresses the
// device itself.
func samePair(t *testing.T) (a, b *accessRig, ah *AH) {
	a = drivenRig(t, func() time.Duration { return 0 })
	bb := *a
	bb.q = readyQP(t, a.d, a.pd)
	ah, err := a.d.CreateAH(a.pd, a.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	return a, &bb, ah
}

// RingBy tells a waiter whose receive the ring's own work completed what the ring was given, and
// a destroyed QP tells its waiter at once (no receive comes for it now). Two QPs of one device:
// the SEND is delivered by the ring's work, on the ringing goroutine (a driven device: nothing
// else takes its lock).
func TestRingByTellsWaiter(t *testing.T) {
	a, b, ah := samePair(t)
	var told []any
	w := &RecvWaiter{Fn: func(by any) { told = append(told, by) }} // (under the device's lock)
	if !b.q.OnRecv(0, w) {
		t.Fatal("OnRecv did not register the waiter")
	}
	postSend(a, b, ah, "from the other QP")
	by := "the ringer"
	a.d.RingBy(a.q, by)
	a.d.mu.Lock()
	got := slices.Clone(told)
	a.d.mu.Unlock()
	if len(got) != 1 || got[0] != by {
		t.Fatalf("the waiter was told %v, want [%q] (the ring's own work completed the receive)", got, by)
	}
	if p := a.q.LocalPeer(); p != b.q {
		t.Errorf("the sender's LocalPeer is %p, want the receiving QP %p", p, b.q)
	}

	told = nil
	if !b.q.OnRecv(b.q.Recvs(), w) {
		t.Fatal("OnRecv did not register the waiter again")
	}
	if err := a.d.DestroyQP(b.q); err != nil {
		t.Fatal(err)
	}
	a.d.mu.Lock()
	got = slices.Clone(told)
	a.d.mu.Unlock()
	if len(got) != 1 || got[0] != nil {
		t.Fatalf("the destroyed QP's waiter was told %v, want [nil]", got)
	}
	if b.q.OnRecv(b.q.Recvs(), w) {
		t.Error("OnRecv registered a waiter on a destroyed QP")
	}
}

// RecvsBefore gives the receive count from when the device took a send from the SQ, not from when
// the program's ring for it came: the engine loop's look at every SQ (here Drive) may take the
// send first, and its answer come, before the ring; counted from the ring, the answer would be
// missed and a host-device kick waiting for it would wait its whole linger budget
// (docs/architecture.md, "Doorbells on the host device"). Sends not yet taken count from now.
func TestRecvsBefore(t *testing.T) {
	a, b, ah := samePair(t)
	postSend(a, b, ah, "ping") // a's SEND, its SQ doorbell at 1, not rung
	if got := a.q.RecvsBefore(1); got != 0 {
		t.Fatalf("before the send was taken: RecvsBefore = %d, want 0 (the count now)", got)
	}
	a.d.Drive() // the engine loop's look at every SQ takes a's SEND and delivers it to b
	if b.q.Recvs() != 1 {
		t.Fatalf("b completed %d receives, want 1", b.q.Recvs())
	}
	postSend(b, a, ah, "pong") // b answers into a receive of a's
	a.d.Ring(b.q)
	if a.q.Recvs() != 1 {
		t.Fatalf("a completed %d receives, want 1 (the answer)", a.q.Recvs())
	}
	if got := a.q.RecvsBefore(1); got != 0 {
		t.Errorf("after the answer: RecvsBefore(1) = %d, want 0 (the count when the send was taken)", got)
	}
	if got := a.q.RecvsBefore(2); got != 1 {
		t.Errorf("for a post not yet taken: RecvsBefore(2) = %d, want 1 (the count now)", got)
	}
}

// RecvsBefore keeps the count's low 48 bits beside the SQ's 16-bit ci and rebuilds the whole count
// from the count now, across every wrap of those 48 bits; a doorbell value other than the ci taken
// to counts from now.
func TestRecvsBeforeWraps(t *testing.T) {
	const wrap = 1 << 48
	for _, c := range []struct {
		then, now uint64
		ci        uint16
		db        uint32
		want      uint64
	}{
		{then: 0, now: 0, ci: 1, db: 1, want: 0},
		{then: 5, now: 9, ci: 7, db: 7, want: 5},
		{then: wrap - 1, now: wrap + 1, ci: 65535, db: 65535, want: wrap - 1},
		{then: wrap + 5, now: wrap + 7, ci: 3, db: 1<<16 | 3, want: wrap + 5}, // (the doorbell's high bits are not the ci's)
		{then: 3*wrap + 2, now: 3*wrap + 2, ci: 9, db: 9, want: 3*wrap + 2},
		{then: 5, now: 9, ci: 7, db: 8, want: 9}, // not taken yet: now
		{then: 5, now: 9, ci: 8, db: 7, want: 9}, // later posts taken too: now
	} {
		var q QP
		q.taken.Store(c.then<<16 | uint64(c.ci))
		q.recvs.Store(c.now)
		if got := q.RecvsBefore(c.db); got != c.want {
			t.Errorf("taken at %d (ci %d), %d now: RecvsBefore(%d) = %d, want %d", c.then, c.ci, c.now, c.db, got, c.want)
		}
	}
}
