package engine

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
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

// AwaitCQ, a program's read of a CQ entry the device has not written yet (docs/cabi.md,
// "Completion traps"): the reading thread polls the network until the entry is written. Two
// devices over UDP on loopback; the budget is an hour, so a wait that never saw its entry would
// hang the test rather than pass it.
func TestAwaitCQ(t *testing.T) {
	a, b := udpRig(t), udpRig(t)
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	send, recv := a.q.sendCQ, b.q.recvCQ

	// Not the entry the device writes next: already written, or never to be (past the ring).
	a.d.AwaitCQ(send, 1, time.Hour)
	a.d.AwaitCQ(send, uint32(send.Depth()), time.Hour)
	if a.q.TalksToPeers() {
		t.Fatal("a QP that has sent nothing talks to peers")
	}

	const msg = "taken off the socket by the reader"
	efaio.RxDesc(b.q.rq.ring[:efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: b.a.iova, ReqID: 7,
		Length: 64, LKey: b.a.lkey, First: true, Last: true})
	atomic.StoreUint32(b.q.rq.db, 1)
	copy(a.inA, msg)
	a.q.sq.slot(0).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: 3, Length: 1, AHN: ah.ahn, QKey: 9,
		DestQPN: uint16(b.q.qpn), CompReq: true, Phase: a.q.sq.phase,
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: uint32(len(msg)), LKey: a.a.lkey, Addr: a.a.iova}}})
	atomic.StoreUint32(a.q.sq.db, 1)
	a.d.Ring(a.q)

	b.d.AwaitCQ(recv, 0, time.Hour)
	if recv.written.Load() != 1 {
		t.Fatalf("the receiver's CQ holds %d entries after the wait, want 1", recv.written.Load())
	}
	if got := string(b.inA[:len(msg)]); got != msg {
		t.Errorf("the receive buffer holds %q, want %q", got, msg)
	}
	a.d.AwaitCQ(send, 0, time.Hour) // the send completes on the receiver's ACK
	if send.written.Load() != 1 {
		t.Fatalf("the sender's CQ holds %d entries after the wait, want 1", send.written.Load())
	}
	if !a.q.TalksToPeers() || b.q.TalksToPeers() {
		t.Errorf("TalksToPeers: sender %v, receiver %v; want true, false", a.q.TalksToPeers(), b.q.TalksToPeers())
	}
	b.d.AwaitCQ(recv, 1, 0) // nothing more comes: with no budget, one poll and back
}

// AwaitRecv, a program's thread lingering after a post for the answer to it (docs/cabi.md,
// "Lingering after a post"): the thread polls the network until its QP has completed a receive
// past the count it saw. The budget is an hour, so a wait that missed its receive would hang the
// test rather than pass it.
func TestAwaitRecv(t *testing.T) {
	a, b := udpRig(t), udpRig(t)
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	b.d.AwaitRecv(b.q, 1, time.Hour) // a receive past 1 is not the next one: back at once

	const msg = "taken off the socket by the lingering thread"
	efaio.RxDesc(b.q.rq.ring[:efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: b.a.iova, ReqID: 7,
		Length: 64, LKey: b.a.lkey, First: true, Last: true})
	atomic.StoreUint32(b.q.rq.db, 1)
	copy(a.inA, msg)
	a.q.sq.slot(0).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: 3, Length: 1, AHN: ah.ahn, QKey: 9,
		DestQPN: uint16(b.q.qpn), CompReq: true, Phase: a.q.sq.phase,
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: uint32(len(msg)), LKey: a.a.lkey, Addr: a.a.iova}}})
	atomic.StoreUint32(a.q.sq.db, 1)
	a.d.Ring(a.q)

	b.d.AwaitRecv(b.q, 0, time.Hour)
	if n := b.q.counts.RecvWRs.Load(); n != 1 {
		t.Fatalf("the receiver has completed %d receives after the wait, want 1", n)
	}
	if got := string(b.inA[:len(msg)]); got != msg {
		t.Errorf("the receive buffer holds %q, want %q", got, msg)
	}
	if b.q.recvCQ.written.Load() != 1 {
		t.Errorf("the receiver's CQ holds %d entries after the wait, want 1", b.q.recvCQ.written.Load())
	}
	b.d.AwaitRecv(b.q, 1, 0) // nothing more comes: with no budget, one poll and back
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

	b.d.AwaitCQ(b.q.recvCQ, 0, time.Hour)
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
	driven := func() *accessRig {
		l, err := link.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), 1)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return newAccessRigOn(t, config.Device{Addr: l.LocalAddr(), Link: l, Driven: true, Clock: clock})
	}
	a, b := driven(), driven()
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
	for b.q.sendCQ.written.Load() == 0 {
		waiting("completion of b's SEND")
		a.d.Drive()
		b.d.Drive()
	}
	// a's SEND reaches b through a busy poll's lazy input: the ACK stays owed.
	post(a, b, 2)
	a.d.Drive()
	for b.q.recvCQ.written.Load() < 2 { // (one CQ for both queues: the first entry is b's SEND)
		waiting("receive of a's SEND at b")
		dr := b.d.drv
		b.d.mu.Lock()
		b.d.useTx(dr.q)
		if n, _ := dr.poller.TryReceive(dr.rx.Pkts); n > 0 {
			b.d.srd.Input(dr.rx, n, true)
		}
		b.d.mu.Unlock()
		b.d.sendTx(dr.q)
	}
	if !b.d.srd.AcksOwed() {
		t.Fatal("no ACK owed after a lazy input from a peer b talks to: the test would prove nothing")
	}
	b.d.FlushAcks()
	if b.d.srd.AcksOwed() {
		t.Fatal("an ACK is still owed after FlushAcks")
	}
	for a.q.sendCQ.written.Load() < 2 {
		waiting("completion of a's SEND")
		a.d.Drive() // only b's flushed ACK can complete it: the clock stands still
	}
	b.d.Close()
	b.d.FlushAcks() // a closed device: nothing to send, and no panic
}
