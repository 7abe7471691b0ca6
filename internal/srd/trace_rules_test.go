package srd

import (
	"bytes"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/wire"
)

// Trace tests: each checks one rule of docs/wire.md or docs/congestion.md against one transport,
// the test playing its peer (trace_test.go). The rule is named in each test's comment.

// wire.md "Completion": a SEND succeeds once ACKs cover all its segments and, with horizon 0,
// nothing more is needed.
func TestTraceAckCompletesSend(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	if len(d) != 1 || d[0].f.Data.PSN != 0 || d[0].f.Data.Op != wire.OpSend || d[0].f.Data.Length != 100 {
		t.Fatalf("sent %+v, want one SEND segment at PSN 0", d)
	}
	r.noCompletion()
	r.ack(1, nil, d[0].h.Path)
	r.wantCompletion(1, efaio.StatusOK)
}

// wire.md "Completion": with a horizon H, the SEND waits until the peer's stream has arrived up to
// H, and succeeds then, no RESP among it having failed it.
func TestTraceHorizonHoldsSuccess(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.recv(7) // the peer's data below lands here
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	r.horizon = 1 // the peer says: PSN 0 of my stream may answer you
	r.ack(1, nil, d[0].h.Path)
	r.noCompletion()
	r.peerData(wire.Data{Op: wire.OpSend, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	cs := r.completions()
	if len(cs) != 2 || !slices.ContainsFunc(cs, func(c completion) bool { return c.ReqID == 1 && c.Status == efaio.StatusOK }) {
		t.Fatalf("completions %+v, want the SEND's success and the receive", cs)
	}
}

// wire.md "Completion": a RESP below the horizon fails the message with its status.
func TestTraceRespFails(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.post(1, efaio.OpRDMAWrite, 100)
	d := r.data()
	r.horizon = 1
	r.ack(1, nil, d[0].h.Path)
	r.peerData(wire.Data{Op: wire.OpResp, MsgID: d[0].f.Data.MsgID, Status: uint8(efaio.StatusRemoteBadAddress)})
	r.wantCompletion(1, efaio.StatusRemoteBadAddress)
}

// wire.md "Packet streams", congestion.md loss rule: a packet is lost when one sent after it (by
// more than the reordering allowance) on the same path is acknowledged; it goes again on a
// different path if one is healthy. Here the peer acknowledges PSNs 1–4, sent after PSN 0 on the
// same path; PSN 0 goes again, on the other path.
func TestTraceSelectiveAckResendsHoleOnAnotherPath(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	d := r.sends(5)
	if got := psns(d); !slices.Equal(got, []wire.PSN{0, 1, 2, 3, 4}) {
		t.Fatalf("sent PSNs %v", got)
	}
	path := d[0].h.Path
	if got := paths(d); slices.ContainsFunc(got, func(p uint8) bool { return p != path }) {
		t.Fatalf("a burst spread over paths %v", got)
	}
	r.ack(0, []wire.PSN{1, 2, 3, 4}, path)
	again := r.data()
	if len(again) != 1 || again[0].f.Data.PSN != 0 || again[0].h.Path == path {
		t.Fatalf("after PSNs 1-4 acknowledged on path %d: sent %v on paths %v, want PSN 0 on the other path",
			path, psns(again), paths(again))
	}
	if cs := r.completions(); len(cs) != 4 {
		t.Fatalf("completions %+v, want WRs 1-4", cs)
	}
	r.ack(5, nil, again[0].h.Path)
	r.wantCompletion(0, efaio.StatusOK)
}

func paths(fs []traceFrame) []uint8 {
	var out []uint8
	for _, f := range fs {
		out = append(out, f.h.Path)
	}
	return out
}

// wire.md "Packet streams": a packet unacknowledged for the retransmission timeout goes again;
// each expiry doubles the timeout; an acknowledgement ends it.
func TestTraceRetransmissionTimeoutBacksOff(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.post(1, efaio.OpSend, 100)
	first := r.data()
	var times []time.Duration
	for len(times) < 3 {
		r.advance(100 * time.Microsecond)
		if d := r.data(); len(d) > 0 {
			if d[0].f.Data.PSN != 0 {
				t.Fatalf("resent PSN %d", d[0].f.Data.PSN)
			}
			times = append(times, r.f.Now())
		}
	}
	gap1, gap2 := times[1]-times[0], times[2]-times[1]
	if gap2 < 2*gap1-200*time.Microsecond || times[0] < initialRTO {
		t.Fatalf("resent at %v: the timeout does not start at %v and double", times, initialRTO)
	}
	r.ack(1, nil, first[0].h.Path)
	r.wantCompletion(1, efaio.StatusOK)
	r.advance(50 * time.Millisecond)
	if d := r.data(); len(d) > 0 {
		t.Fatalf("acknowledged, yet sent %v", psns(d))
	}
}

// wire.md "Packet streams": nothing acknowledged for the transport timeout fails the WR with 13
// (the peer answered the first contact, then nothing) and starts a new stream: tx epoch + 1,
// PSN 0. (TestTraceUnansweredFirstContact: 15, for a peer that never answered.)
func TestTraceTransportTimeoutStartsNewEpoch(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	epoch := d[0].h.TxEpoch
	r.advance(900 * time.Millisecond)
	r.noCompletion()
	r.advance(200 * time.Millisecond)
	r.wantCompletion(1, efaio.StatusLocalUnrespRemote) // (its challenge was heard)
	r.data()
	r.post(2, efaio.OpSend, 100)
	d = r.data()
	if len(d) != 1 || d[0].f.Data.PSN != 0 || d[0].h.TxEpoch != epoch+1 {
		t.Fatalf("after the timeout sent PSNs %v in epoch %d, want PSN 0 in epoch %d", psns(d), d[0].h.TxEpoch, epoch+1)
	}
}

// wire.md "Packet streams": a receiver acknowledges at the end of each batch it reads: the
// cumulative point, the path of the newest DATA frame, and its own horizon; each frame is handled
// once, a duplicate is acknowledged again (naming the path the PSN first came by, not the
// duplicate's) and not delivered twice.
func TestTraceReceiverAcknowledgesOnce(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.recv(7)
	r.recv(8)
	send := wire.Data{Op: wire.OpSend, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)}
	send.PSN = 0
	dgram := func(path uint8) {
		r.send(path, func(b []byte) []byte { return wire.AppendData(b, &send) })
	}
	dgram(1)
	acks := r.take(wire.TypeAck)
	if len(acks) != 1 || acks[0].f.Ack.Cum != 1 || acks[0].f.Ack.Path != 1 || acks[0].f.Ack.Horizon != 0 {
		t.Fatalf("ACKs %+v, want one: cumulative 1, path 1, horizon 0", acks)
	}
	r.wantCompletion(7, efaio.StatusOK)
	dgram(0) // the same PSN again
	if acks := r.take(wire.TypeAck); len(acks) != 1 || acks[0].f.Ack.Cum != 1 || acks[0].f.Ack.Path != 1 {
		t.Fatalf("ACKs %+v for the duplicate, want cumulative 1 and path 1 again", acks)
	}
	r.noCompletion()
}

// wire.md "Packet streams": frames of a newer epoch of the peer's stream start it afresh (PSN 0
// again is new data); frames of the older epoch are dropped.
func TestTracePeerEpochStartsAfresh(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	for i := range 3 {
		r.recv(uint16(i))
	}
	send := wire.Data{Op: wire.OpSend, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)}
	r.peerData(send)
	r.wantCompletion(0, efaio.StatusOK)
	r.epoch, r.next = 1, 0
	r.peerData(send) // PSN 0 of epoch 1
	r.wantCompletion(1, efaio.StatusOK)
	r.epoch, r.next = 0, 1
	stale := r.counts.StalePackets.Load()
	r.peerData(send) // PSN 1 of the abandoned epoch 0
	r.noCompletion()
	if r.counts.StalePackets.Load() != stale+1 {
		t.Fatal("a frame of the abandoned epoch was not counted stale")
	}
}

// congestion.md "Window": the window grows by one per acknowledged packet in slow start and
// halves once per round trip with losses.
func TestTraceWindowGrowsAndHalves(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	cwnd := func() float64 { return r.tr.PathStats()[0].Cwnd }
	d := r.sends(4)
	start := cwnd()
	r.ack(2, nil, d[0].h.Path)
	if got := cwnd(); got != start+2 {
		t.Fatalf("window %v after 2 acknowledged from %v, want +2 (slow start)", got, start)
	}
	r.ack(2, []wire.PSN{3}, d[0].h.Path) // PSN 2 lost: sent before 3 on the same path
	if got := cwnd(); got != (start+2)/2 {
		t.Fatalf("window %v after a loss, want half of %v", got, start+2)
	}
}

// congestion.md "Multipath": three packets of a path lost, revealed by a later one's
// acknowledgement, mark the path failed (another is healthy): new packets avoid it, and it is
// probed every 50 ms until a PROBE_ACK with the probe's nonce puts it back.
func TestTracePathFailsAndIsProbed(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	d := r.sends(4)
	bad := d[0].h.Path
	r.ack(0, []wire.PSN{3}, bad)
	again := r.data()
	if got := psns(again); !slices.Equal(got, []wire.PSN{0, 1, 2}) || slices.Contains(paths(again), bad) {
		t.Fatalf("resent %v on paths %v, want 0-2 off path %d", got, paths(again), bad)
	}
	if !r.tr.PathStats()[bad].Failed {
		t.Fatalf("path %d not marked failed", bad)
	}
	r.ack(4, nil, again[0].h.Path)
	r.post(9, efaio.OpSend, 100)
	if p := paths(r.data()); len(p) != 1 || p[0] == bad {
		t.Fatalf("new packet on paths %v, want not %d", p, bad)
	}
	r.advance(60 * time.Millisecond)
	probes := r.take(wire.TypeProbe)
	if len(probes) == 0 || probes[0].h.Path != bad {
		t.Fatalf("probes %+v, want one on path %d", probes, bad)
	}
	r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, probes[0].f.Nonce, true) })
	if r.tr.PathStats()[bad].Failed {
		t.Fatal("the PROBE_ACK did not put the path back")
	}
}

// congestion.md "Sparse copies": after a loss, while at most 4 packets are in flight, each new
// packet goes on a second path too.
func TestTraceSparseCopiesAfterLoss(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.rttSample() // a first round trip (a timeout before one is no loss)
	r.post(1, efaio.OpSend, 100)
	r.data()
	r.advance(30 * time.Millisecond) // lost: the retransmission timeout sends it again
	again := r.data()
	if len(again) == 0 {
		t.Fatal("no retransmission")
	}
	r.ack(2, nil, again[0].h.Path)
	r.wantCompletion(1, efaio.StatusOK)
	r.post(2, efaio.OpSend, 100)
	d := r.data()
	if len(d) != 2 || d[0].f.Data.PSN != 2 || d[1].f.Data.PSN != 2 || d[0].h.Path == d[1].h.Path {
		t.Fatalf("after a loss sent PSNs %v on paths %v, want PSN 2 on both paths", psns(d), paths(d))
	}
}

// wire.md "Incarnations": a datagram from the peer with a new source incarnation is a restarted
// peer: a request its earlier life acknowledged part of fails with REMOTE_ABORT; one it never
// acknowledged goes again, whole, in a new epoch of the stream, and succeeds when acknowledged.
func TestTraceRestartedPeer(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.post(1, efaio.OpSend, 3000) // three segments
	r.advance(100 * time.Microsecond)
	d := r.data()
	r.ack(1, nil, d[0].h.Path) // the earlier life had the first segment
	r.post(2, efaio.OpSend, 100)
	r.data()
	epoch := d[0].h.TxEpoch
	r.inc, r.epoch, r.next = 0x0f0f0f0f, 0, 0 // a new life
	r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, 5, false) })
	r.wantCompletion(1, efaio.StatusRemoteAbort)
	again := r.data()
	if len(again) != 1 || again[0].f.Data.PSN != 0 || again[0].h.TxEpoch != epoch+1 || again[0].h.DstInc != r.inc {
		t.Fatalf("after the restart sent %+v, want WR 2's SEND at PSN 0 of epoch %d to the new life", again, epoch+1)
	}
	r.ack(1, nil, again[0].h.Path)
	r.wantCompletion(2, efaio.StatusOK)
}

// wire.md "Address validation": a datagram naming the peer but sent from another port of its IP
// gets one CHALLENGE, sent to the peer's endpoint, and nothing else, whatever it carries.
func TestTraceOtherPortIsChallenged(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.recv(7)
	h := wire.Header{SrcPort: tracePeer.Port(), SrcInc: r.inc, DstInc: r.tr.inc}
	b := wire.AppendHeader(nil, &h)
	b = wire.AppendData(b, &wire.Data{Op: wire.OpSend, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	wire.PutChecksum(b)
	r.f.Inject(netip.AddrPortFrom(tracePeer.Addr(), 9999), traceDev, b)
	r.drive()
	if len(r.got) != 1 || r.got[0].f.Type != wire.TypeChallenge {
		t.Fatalf("answered with %+v, want one CHALLENGE", r.got)
	}
	r.noCompletion()
}

// wire.md "Packet streams": a batch read by a polling application leaves its ACK owed, for up to
// 50 µs, to a peer the device sends data to; the application's answer carries it, in the same
// datagram as the answer's DATA, on a path proven by acknowledged data. Unanswered, the ACK goes
// on its own when it is due.
func TestTraceOwedAckRidesOnAnswer(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.recv(7)
	r.recv(8)
	r.advance(time.Millisecond) // (a send time of 0 reads as "never sent")
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	r.ack(1, nil, d[0].h.Path) // proves the path, and the device talks to the peer
	r.wantCompletion(1, efaio.StatusOK)
	r.owedAckRidesOnAnswer(7, 2, 1)
	r.inject(0, func(b []byte) []byte {
		return wire.AppendData(b, &wire.Data{PSN: r.next, Op: wire.OpSend, Length: 10, DstQPN: 3, QKey: traceQKey,
			Payload: make([]byte, 10)})
	})
	r.next++
	r.busyPoll()
	r.advance(100 * time.Microsecond) // no answer: the owed ACK goes alone
	if acks := r.take(wire.TypeAck); len(acks) != 1 || acks[0].f.Ack.Cum != 2 {
		t.Fatalf("ACKs %+v, want the owed ACK of PSN 1 on its own", acks)
	}
}

// docs/congestion.md "Multipath": with no path proven (nothing of ours acknowledged within a few RTTs:
// acknowledgements of sparse copies credit no path), an owed ACK still rides in the answer's
// datagram on a healthy path, one an ACK of its own could take too. Before, it went alone after
// the answer, and the peer, taking the answer first, waited for it.
func TestTraceOwedAckRidesWithoutProvenPath(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.recv(7)
	r.advance(time.Millisecond) // (a send time of 0 reads as "never sent")
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	r.ack(1, nil, d[0].h.Path)
	r.wantCompletion(1, efaio.StatusOK)
	// 9 ms on, the proof (an acknowledged packet sent within 4 × the 2 ms minimum RTO of now) is
	// stale, but the device still talks to the peer (it sent within 10 ms): an ACK may be owed.
	r.advance(9 * time.Millisecond)
	if newest, _ := r.tr.peers[config.GIDFromAddr(tracePeer)].provenSince(r.f.Now()); newest != 0 {
		t.Fatalf("a path is still proven (newest %v): the test would prove nothing", newest)
	}
	r.owedAckRidesOnAnswer(7, 2, 1)
}

// owedAckRidesOnAnswer has the peer send a SEND, which a busy poll takes (completing the receive
// WR wrid) without acknowledging it at once; the device's answer (WR id answer) must then carry
// the owed ACK, cumulative point cum, in its own datagram.
func (r *trace) owedAckRidesOnAnswer(wrid, answer uint16, cum wire.PSN) {
	r.t.Helper()
	send := wire.Data{PSN: r.next, Op: wire.OpSend, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)}
	r.next++
	r.inject(0, func(b []byte) []byte { return wire.AppendData(b, &send) })
	r.busyPoll()
	if acks := r.take(wire.TypeAck); len(acks) != 0 {
		r.t.Fatalf("ACKed at once: %+v", acks)
	}
	r.wantCompletion(wrid, efaio.StatusOK)
	r.post(answer, efaio.OpSend, 100)
	acks, data := r.take(wire.TypeAck), r.data()
	if len(acks) != 1 || len(data) != 1 || acks[0].dgram != data[0].dgram || acks[0].f.Ack.Cum != cum {
		r.t.Fatalf("ACKs %+v, DATA %+v: want the ACK of PSN %d in the answer's datagram", acks, data, cum-1)
	}
}

// wire.md "Packet streams": within one batch of datagrams a receiver acknowledges after every 16
// DATA frames, and at the batch's end.
func TestTraceAckEvery16Frames(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	for i := range 40 {
		r.recv(uint16(i))
	}
	send := wire.Data{Op: wire.OpSend, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)}
	for range 40 { // one batch: the device reads them all at once
		send.PSN = r.next
		r.next++
		r.inject(0, func(b []byte) []byte { return wire.AppendData(b, &send) })
	}
	r.drive()
	var cums []wire.PSN
	for _, a := range r.take(wire.TypeAck) {
		cums = append(cums, a.f.Ack.Cum)
	}
	if !slices.Equal(cums, []wire.PSN{16, 32, 40}) {
		t.Fatalf("ACKs with cumulative points %v, want 16, 32 and 40", cums)
	}
}

// wire.md "RESP": a message answered with status 10 (RNR) ends with that status, and the host
// may try it again (its retries, paced by the RNR interval, are the device's): the transport says
// so; a retry is a new message.
func TestTraceRNRRetries(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	r.horizon = r.next + 1
	r.ack(d[0].f.Data.PSN+1, nil, d[0].h.Path)
	r.noCompletion()
	r.peerData(wire.Data{Op: wire.OpResp, MsgID: d[0].f.Data.MsgID, Status: uint8(efaio.StatusRemoteRNR)})
	if cs := r.completions(); len(cs) != 1 || cs[0].ReqID != 1 || cs[0].Status != efaio.StatusRemoteRNR || !cs[0].MayRetry {
		t.Fatalf("outcomes %+v, want RNR for WR 1, to be retried", cs)
	}
	r.post(1, efaio.OpSend, 100)
	again := r.data()
	if len(again) != 1 || again[0].f.Data.MsgID == d[0].f.Data.MsgID || again[0].f.Data.PSN != d[0].f.Data.PSN+1 {
		t.Fatalf("the retry went as %+v, want a new message at the next PSN", again)
	}
}

// congestion.md "Reordering": a packet counted lost that is acknowledged after all was only
// reordered: the loss is taken back (counted spurious) and the allowance grows, so that the same
// reordering does not count as loss again.
func TestTraceSpuriousLossWidensAllowance(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	d := r.sends(4)
	steps := r.tr.peers[config.GIDFromAddr(tracePeer)].tx.reoSteps
	r.ack(0, []wire.PSN{3}, d[0].h.Path) // 0-2 counted lost
	r.data()                             // (sent again)
	r.ack(4, nil, d[0].h.Path)           // the originals arrive after all
	if r.counts.SpuriousRetrans.Load() == 0 || r.tr.peers[config.GIDFromAddr(tracePeer)].tx.reoSteps <= steps {
		t.Fatalf("spurious %d, allowance steps %d (from %d): want the losses taken back and the allowance wider",
			r.counts.SpuriousRetrans.Load(), r.tr.peers[config.GIDFromAddr(tracePeer)].tx.reoSteps, steps)
	}
}

// congestion.md "Loss detection": a loss that proves spurious shows how far its path reorders
// (the send time of the packet whose acknowledgement counted it lost, less its own), and the
// allowance covers that much from then on, not one step more. Here PSN 0 is overtaken by PSN 1,
// sent 400 µs after it on the same path, and arrives after all; then PSNs 2 and 3, 400 µs apart,
// arrive in the same reversed order, and nothing counts lost or goes again.
func TestTraceSpuriousLossWidensAllowanceToItsGap(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	path := r.sendPair(0, 400*time.Microsecond)
	r.ack(0, []wire.PSN{1}, path) // PSN 0 counted lost, and sent again
	if again := r.data(); len(again) != 1 || again[0].f.Data.PSN != 0 {
		t.Fatalf("after PSN 1 was acknowledged first: sent %v, want PSN 0 again", psns(again))
	}
	r.ack(2, nil, path) // the original arrived: the loss was reordering
	if n := r.counts.SpuriousRetrans.Load(); n != 1 {
		t.Fatalf("%d losses counted spurious, want 1", n)
	}
	path = r.sendPair(2, 400*time.Microsecond)
	r.ack(2, []wire.PSN{3}, path)
	if again := r.data(); len(again) != 0 {
		t.Fatalf("the same reordering again: PSNs %v sent again, want none", psns(again))
	}
	r.ack(4, nil, path)
	if n := r.counts.RetransPkts.Load(); n != 1 {
		t.Fatalf("%d packets sent again, want 1 (the first reordering's)", n)
	}
}

// congestion.md "Loss detection": a packet acknowledged after one sent later on its path, within
// the allowance, shows reordering before any loss is counted, and the allowance grows to cover
// it with an eighth to spare. Here a spurious loss sets the allowance to 450 µs (a 400 µs gap);
// a 440 µs reordering then counts nothing lost and widens it to 495 µs, so that a 480 µs one
// counts nothing lost either.
func TestTraceSeenReorderingWidensAllowance(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	path := r.sendPair(0, 400*time.Microsecond)
	r.ack(0, []wire.PSN{1}, path)
	r.data()
	r.ack(2, nil, path)
	for i, gap := range []time.Duration{440 * time.Microsecond, 480 * time.Microsecond} {
		first := wire.PSN(2 + 2*i)
		path = r.sendPair(first, gap)
		r.ack(first, []wire.PSN{first + 1}, path)
		if again := r.data(); len(again) != 0 {
			t.Fatalf("a reordering of %v: PSNs %v sent again, want none", gap, psns(again))
		}
		r.ack(first+2, nil, path)
	}
	if n := r.counts.RetransPkts.Load(); n != 1 {
		t.Fatalf("%d packets sent again, want 1 (the first reordering's)", n)
	}
}

// congestion.md "Loss detection": the reordering seen widens the allowance only up to half the
// retransmission timeout (2 ms here, the least), so that acknowledgements still find a loss
// before the timer would. Here a 3 ms reordering proves spurious: the allowance is 1 ms, and a
// packet overtaken by one sent 1.5 ms after it counts lost and goes again at once.
func TestTraceSeenReorderingStopsAtHalfTheTimer(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	tx := func() *txStream { return &r.tr.peers[config.GIDFromAddr(tracePeer)].tx }
	path := r.sendPair(0, 3*time.Millisecond)
	r.ack(0, []wire.PSN{1}, path)
	r.data()
	r.ack(2, nil, path)
	if r.counts.SpuriousRetrans.Load() != 1 {
		t.Fatalf("%d losses counted spurious, want 1", r.counts.SpuriousRetrans.Load())
	}
	if got, want := tx().reorderWindow(), tx().rto/2; tx().reoSeen < 3*time.Millisecond || got != want {
		t.Fatalf("allowance %v with %v of reordering seen, want half the timeout, %v", got, tx().reoSeen, want)
	}
	path = r.sendPair(2, 1500*time.Microsecond)
	r.ack(2, []wire.PSN{3}, path)
	if again := r.data(); len(again) != 1 || again[0].f.Data.PSN != 2 {
		t.Fatalf("overtaken by 1.5 ms: PSNs %v sent again, want PSN 2", psns(again))
	}
}

// congestion.md "Loss detection": reordering is measured between packets sent once. A packet
// sent again leaves out of PSN order, and an acknowledgement is taken in PSN order: here PSN 0,
// counted lost, goes again on path 1 after PSN 16 went there, and one acknowledgement covers
// both. Nothing was reordered, and the allowance stays as it was. (Measured against the
// retransmission's send time, PSN 16 looked 100 µs late; under 1% loss such false measures held
// the allowance near the retransmission timeout.)
func TestTraceRetransmissionIsNoReordering(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	tx := func() *txStream { return &r.tr.peers[config.GIDFromAddr(tracePeer)].tx }
	r.post(0, efaio.OpSend, 100)
	r.advance(100 * time.Microsecond)
	for i := 1; i < 16; i++ {
		r.post(uint16(i), efaio.OpSend, 100)
	}
	r.advance(100 * time.Microsecond)
	r.post(16, efaio.OpSend, 100) // the next burst: on path 1
	d := r.data()
	if len(d) != 17 || d[0].h.Path != 0 || d[16].h.Path != 1 {
		t.Fatalf("PSNs %v went on paths %v: want 0-15 on path 0, 16 on path 1", psns(d), paths(d))
	}
	r.advance(100 * time.Microsecond)
	var sack []wire.PSN
	for i := 1; i < 16; i++ {
		sack = append(sack, wire.PSN(i))
	}
	r.ack(0, sack, 0) // PSN 0 counted lost
	if again := r.data(); len(again) != 1 || again[0].f.Data.PSN != 0 || again[0].h.Path != 1 {
		t.Fatalf("sent %v on paths %v, want PSN 0 again on path 1", psns(again), paths(again))
	}
	before := tx().reorderWindow()
	r.advance(200 * time.Microsecond)
	r.ack(17, nil, 1)
	if seen, after := tx().reoSeen, tx().reorderWindow(); seen != 0 || after != before {
		t.Fatalf("reordering seen %v, allowance %v (was %v): want none seen, the allowance as it was", seen, after, before)
	}
}

// congestion.md "Undo": when every packet a loss episode counted lost is acknowledged as the
// original after all, nothing was lost: the window cut is undone. Here PSNs 0–2 are counted lost
// (PSN 3 overtook them), sent again, and then acknowledged at once, before a copy sent again could
// have made the round trip: the window is back where it was.
func TestTraceSpuriousLossUndoesCut(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	cwnd := func() float64 { return r.tr.PathStats()[0].Cwnd }
	d := r.sends(4)
	before := cwnd()
	r.ack(0, []wire.PSN{3}, d[0].h.Path)
	r.data()
	if cut := cwnd(); cut >= before {
		t.Fatalf("window %v after losses, want under %v", cut, before)
	}
	r.ack(4, nil, d[0].h.Path)
	if got := cwnd(); got < before {
		t.Fatalf("window %v after the losses proved spurious, want %v or more", got, before)
	}
}

// congestion.md "Undo": a retransmission timeout whose packets then prove to have arrived (their
// acknowledgement came late: a busy receiver, or one descheduled) undoes its window cut and its
// backoff; a timeout whose packets were lost keeps both.
func TestTraceSpuriousTimeoutUndone(t *testing.T) {
	for _, spurious := range []bool{true, false} {
		r := newTrace(t, 2, nil)
		p := func() *peer { return r.tr.peers[config.GIDFromAddr(tracePeer)] }
		// An RTT sample of 1 ms: the timer is 2 ms (its least).
		r.rttSample()
		for i := range 3 {
			r.post(uint16(1+i), efaio.OpSend, 100)
		}
		sent := r.data()
		before, rto := p().tx.cwnd, p().tx.rto
		for len(r.data()) == 0 { // until the timer sends them again
			r.advance(100 * time.Microsecond)
		}
		if p().tx.cwnd >= before || p().tx.rto <= rto {
			t.Fatalf("after the timeout: window %v (from %v), timer %v (from %v): want both cut and backed off",
				p().tx.cwnd, before, p().tx.rto, rto)
		}
		if spurious {
			r.ack(4, nil, sent[0].h.Path) // the originals' acknowledgement, just late
			// The window is back; the timer is not backed off (the packets not sent again time
			// the late round trip: the timer follows the estimate).
			s := &p().tx
			if s.cwnd < before || s.rto != min(max(s.srtt+4*s.rttvar, minRTO), maxRTO) {
				t.Fatalf("spurious timeout: window %v (was %v), timer %v (estimate %v + 4 × %v): want the window back and no backoff",
					s.cwnd, before, s.rto, s.srtt, s.rttvar)
			}
		} else {
			r.advance(time.Millisecond) // the copies sent again make the round trip: a real loss
			r.ack(4, nil, sent[0].h.Path)
			if p().tx.cwnd >= before {
				t.Fatalf("real loss: window %v back to %v", p().tx.cwnd, before)
			}
		}
	}
}

// congestion.md "Reliability": a retransmission timeout sends only a PING; a peer that was held
// up (it answers nothing) and then acknowledges everything gets nothing twice. A peer that lost
// them all answers the PING with nothing acknowledged, and the packet sent longest ago goes again,
// alone, as a probe; its acknowledgement shows the others lost: they go again at once, not one
// timeout at a time.
func TestTraceTimeoutProbesOnce(t *testing.T) {
	for _, stalled := range []bool{true, false} {
		r := newTrace(t, 2, nil)
		r.rttSample()
		r.heldUp = stalled
		for i := range 8 {
			r.post(uint16(1+i), efaio.OpSend, 100)
		}
		sent := r.data()
		if len(sent) != 8 {
			t.Fatalf("sent %d DATA frames, want 8", len(sent))
		}
		if stalled {
			r.awaitPing()
			r.advance(time.Millisecond)
			r.ack(9, nil, sent[7].h.Path) // everything arrived, late
			r.advance(20 * time.Millisecond)
			if d := r.data(); len(d) != 0 || r.counts.RetransPkts.Load() != 0 {
				t.Fatalf("after the held-up peer acknowledged everything, sent PSNs %v again", psns(d))
			}
			continue
		}
		again := r.awaitData() // until the timer fires, and its PING is answered
		if len(again) != 1 || again[0].f.Data.PSN != 1 {
			t.Fatalf("the timer sent PSNs %v, want only 1", psns(again))
		}
		r.advance(time.Millisecond)    // the probe's round trip
		r.ack(2, nil, again[0].h.Path) // the probe arrived: the others were lost
		if d := r.data(); !slices.Equal(psns(d), []wire.PSN{2, 3, 4, 5, 6, 7, 8}) {
			t.Fatalf("after the probe's acknowledgement sent PSNs %v, want the rest, 2 to 8, at once", psns(d))
		}
	}
}

// congestion.md "Reliability": the timer's probe is the lowest PSN not acknowledged, even one
// counted lost and waiting for room in a full window: an ACK's selective bits reach only 256 PSNs
// past the peer's cumulative point, so a probe further on could be acknowledged by nothing, and
// the window stayed full of packets lost and not known to be until the transport timeout (a 32
// MiB write over loopback whose receiver's socket overflowed, TestLargeRDMAOverUDP).
func TestTraceTimeoutProbesTheCumulativePoint(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	s := &p.tx
	s.cwnd = 400
	for i := range 300 {
		r.post(uint16(1+i), efaio.OpSend, 100)
	}
	if n := len(r.data()); n != 300 {
		t.Fatalf("sent %d DATA frames, want 300", n)
	}
	// PSN 1 counted lost, waiting for room the window does not have; PSN 2 is the oldest still
	// out, more than 256 PSNs below the newest.
	e := s.slot(1)
	e.lost = true
	s.inflight--
	s.retx = append(s.retx, 1)
	s.cwnd = 2
	again := r.awaitData()
	if len(again) != 1 || again[0].f.Data.PSN != 1 {
		t.Fatalf("the timer sent PSNs %v, want the cumulative point, 1", psns(again))
	}
}

// congestion.md "Reliability": in a ping-pong the timer's probe is the only packet out, and its
// acknowledgement tells whether the first transmission arrived by the path it names (the path a
// PSN first came by: the probe went on another). A peer that was slow to answer costs no loss:
// no cut, and no sparse copies after; a first transmission that was lost counts as one.
func TestTracePingPongTimeoutByFirstTransmission(t *testing.T) {
	for _, firstCame := range []bool{true, false} {
		r := newTrace(t, 2, nil)
		p := r.rttSample()
		cwnd := p.tx.cwnd
		r.post(1, efaio.OpSend, 100)
		sent := r.data()
		probe := r.awaitData()
		if len(probe) != 1 || probe[0].h.Path == sent[0].h.Path {
			t.Fatalf("probe %v on path %d, first on %d: want one, on the other path", psns(probe), probe[0].h.Path, sent[0].h.Path)
		}
		answered := probe[0].h.Path
		if firstCame {
			answered = sent[0].h.Path
		}
		r.advance(time.Millisecond) // a round trip after the probe: its own acknowledgement, by time
		r.ack(2, nil, answered)
		r.wantCompletion(1, efaio.StatusOK)
		spurious := r.counts.SpuriousTimeouts.Load() == 1
		if spurious != firstCame || (p.tx.lossRate == 0) != firstCame || (p.tx.cwnd >= cwnd) != firstCame {
			t.Fatalf("first transmission came %v: spurious timeouts %d, loss rate %v, window %v (from %v)", firstCame,
				r.counts.SpuriousTimeouts.Load(), p.tx.lossRate, p.tx.cwnd, cwnd)
		}
		r.post(2, efaio.OpSend, 100)
		if d := r.data(); firstCame && len(d) != 1 || !firstCame && len(d) != 2 {
			t.Fatalf("first transmission came %v: the next SEND went as %d DATA frames (sparse copies only after a loss)", firstCame, len(d))
		}
	}
}

// congestion.md "Reliability": a retransmission timeout of a packet that went as a sparse copy
// too, on two paths, counts no loss: both copies lost is far less likely than a peer slow to
// answer, and counted, a loaded machine's stalls kept the copies on for good.
func TestTraceTimeoutOfCopiedPacketIsNoLoss(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	p.tx.lossRate, p.tx.lossAt = 0.01, r.f.Now() // a stream that lost a packet: copies on
	cwnd := p.tx.cwnd
	r.post(1, efaio.OpSend, 100)
	if d := r.data(); len(d) != 2 {
		t.Fatalf("the SEND went as %d DATA frames, want 2 (a sparse copy)", len(d))
	}
	probe := r.awaitData()
	r.advance(time.Millisecond)
	r.ack(2, nil, probe[0].h.Path)
	r.wantCompletion(1, efaio.StatusOK)
	if p.tx.lossRate > 0.01 || p.tx.cwnd < cwnd {
		t.Fatalf("loss rate %v (from 0.01), window %v (from %v): the timeout of a copied packet counted as a loss",
			p.tx.lossRate, p.tx.cwnd, cwnd)
	}
}

// congestion.md "Reliability": a retransmission timeout that the next acknowledgement proves
// spurious (it acknowledges packets sent once, before the timer fired: the peer was reading a
// backlog, a starved process) counts nothing lost. Before, the probe's copy counted as arrived
// and every packet sent before it on its path, still in the peer's socket, was declared lost and
// sent again; and so was everything that had waited the timeout.
func TestTraceSpuriousTimeoutLosesNothing(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	p.tx.cwnd = 64
	for i := range 16 {
		if i == 8 {
			r.advance(10 * time.Microsecond) // two batches: PSNs 1..8, then 9..16
		}
		r.post(uint16(1+i), efaio.OpSend, 100) // over both paths
	}
	if n := len(r.data()); n != 16 {
		t.Fatalf("sent %d DATA frames, want 16", n)
	}
	// The peer stalls: the timer fires and PINGs it.
	r.heldUp = true
	r.awaitPing()
	// The peer wakes and acknowledges the first half of its backlog, originals all: PSNs 1 to
	// 8, the second half still in its socket.
	r.advance(time.Millisecond)
	r.ack(9, nil, 0)
	if again := r.data(); len(again) != 0 {
		t.Fatalf("sent PSNs %v again after an acknowledgement that proved the timeout spurious", psns(again))
	}
	r.advance(100 * time.Microsecond)
	r.ack(17, nil, 0)
	if cs := r.completions(); len(cs) != 16 {
		t.Fatalf("%d completions, want 16", len(cs))
	}
	if n, sp := r.counts.RetransPkts.Load(), r.counts.SpuriousTimeouts.Load(); n != 0 || sp != 1 {
		t.Fatalf("%d packets retransmitted, %d spurious timeouts: want none, and 1", n, sp)
	}
}

// congestion.md "Reliability": a retransmission timeout before the stream's first RTT sample sends
// the packet again and backs the timer off, but counts no loss: the window stays, and the packets
// after it go without sparse copies. (Counted, it turned the copies on for thousands of packets
// of a ping-pong whose peer was slow to answer its first message.)
func TestTraceFirstRoundTripTimeoutIsNoLoss(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.post(0, efaio.OpSend, 100)
	first := r.data()
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	cwnd, rto := p.tx.cwnd, p.tx.rto
	r.advance(initialRTO + time.Millisecond)
	again := r.data()
	if len(again) != 1 || again[0].f.Data.PSN != first[0].f.Data.PSN || p.tx.rto <= rto {
		t.Fatalf("after the first timeout sent %+v, timer %v (from %v): want PSN %d again and the timer backed off",
			again, p.tx.rto, rto, first[0].f.Data.PSN)
	}
	r.ack(1, nil, again[0].h.Path)
	r.wantCompletion(0, efaio.StatusOK)
	if p.tx.cwnd < cwnd || p.tx.lossRate != 0 {
		t.Fatalf("window %v (from %v), loss rate %v: the first round trip's timeout counted as a loss", p.tx.cwnd, cwnd,
			p.tx.lossRate)
	}
	for i := range 4 {
		r.post(uint16(1+i), efaio.OpSend, 100)
		if d := r.data(); len(d) != 1 {
			t.Fatalf("SEND %d went as %d DATA frames, want 1 (no sparse copies)", 1+i, len(d))
		}
		r.advance(100 * time.Microsecond)
		r.ack(wire.PSN(2+i), nil, 0)
		r.completions()
	}
	if n := r.counts.SparseCopies.Load(); n != 0 {
		t.Fatalf("%d sparse copies after a first-round-trip timeout", n)
	}
}

// wire.md "Frames" (DATA) and "Completion": an RDMA read goes as one READ_REQ frame naming the
// length, remote address and key; the peer's READ_RESP segments, in any order, land in the sink
// at their offsets, and the read completes with the last byte.
func TestTraceReadCompletesWithData(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.post(1, efaio.OpRDMARead, 3000)
	reqs := r.data()
	if len(reqs) != 1 || reqs[0].f.Data.Op != wire.OpReadReq || reqs[0].f.Data.Length != 3000 ||
		reqs[0].f.Data.RAddr != 0x2000 || reqs[0].f.Data.RKey != 77 {
		t.Fatalf("sent %+v, want one READ_REQ of 3000 bytes at 0x2000 with key 77", reqs)
	}
	r.ack(1, nil, reqs[0].h.Path)
	id := reqs[0].f.Data.MsgID
	for _, off := range []int{2000, 0, 1000} { // out of order
		payload := make([]byte, 1000)
		for i := range payload {
			payload[i] = byte(off/1000 + 1)
		}
		r.noCompletion()
		r.peerData(wire.Data{Op: wire.OpReadResp, MsgID: id, Length: 3000, Offset: uint32(off), Payload: payload})
	}
	r.wantCompletion(1, efaio.StatusOK)
	for i, b := range r.buf[:3000] {
		if b != byte(i/1000+1) {
			t.Fatalf("byte %d of the sink is %d, want %d", i, b, i/1000+1)
		}
	}
}

// wire.md "Frames" (ACK horizon): a receiver that answers a failed message with a RESP puts the
// PSN after it in every ACK it writes afterwards, so that the sender waits for the RESP.
func TestTraceRespMovesHorizon(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	// No receive posted: the SEND fails with RNR, answered by a RESP in the transport's stream.
	r.peerData(wire.Data{Op: wire.OpSend, MsgID: 5, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	resps := r.data()
	if len(resps) != 1 || resps[0].f.Data.Op != wire.OpResp || resps[0].f.Data.MsgID != 5 ||
		efaio.Status(resps[0].f.Data.Status) != efaio.StatusRemoteRNR {
		t.Fatalf("sent %+v, want a RESP with RNR for message 5", resps)
	}
	r.peerData(wire.Data{Op: wire.OpWrite, MsgID: 6, Length: 10, Payload: make([]byte, 10)})
	acks := r.take(wire.TypeAck)
	if len(acks) == 0 || acks[len(acks)-1].f.Ack.Horizon != resps[0].f.Data.PSN+1 {
		t.Fatalf("ACKs %+v, want the horizon %d past the RESP", acks, resps[0].f.Data.PSN+1)
	}
}

// congestion.md loss rule, across paths: a packet is lost when one sent no earlier on any path
// has been acknowledged and it has waited two RTTs of its own path; not before.
func TestTraceLossAcrossPathsWaitsTwoRTTs(t *testing.T) {
	r := newTrace(t, 2, nil)
	// Both paths get an RTT sample of 1 ms: a burst on each, acknowledged after 1 ms.
	for round := range 2 {
		r.post(uint16(round), efaio.OpSend, 100)
		d := r.data()
		r.advance(time.Millisecond)
		r.ack(wire.PSN(round+1), nil, d[0].h.Path)
		r.completions()
		p := r.tr.peers[config.GIDFromAddr(tracePeer)]
		p.pathRR, p.tx.burst = (p.pathRR+1)%2, 16 // the next packet goes on the other path
	}
	// PSN 2 on one path, then PSN 3 on the other, acknowledged at once.
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	r.post(2, efaio.OpSend, 100)
	first := r.data()
	p.tx.burst = 16
	r.post(3, efaio.OpSend, 100)
	second := r.data()
	if first[0].h.Path == second[0].h.Path {
		t.Fatalf("both on path %d", first[0].h.Path)
	}
	r.ack(2, []wire.PSN{3}, second[0].h.Path)
	if again := r.data(); len(again) != 0 {
		t.Fatalf("PSN 2 sent again at once (%v): its own path has not had two RTTs", psns(again))
	}
	r.advance(2500 * time.Microsecond)
	r.ack(2, []wire.PSN{3}, second[0].h.Path) // the same ACK again, two RTTs later
	if again := r.data(); len(again) != 1 || again[0].f.Data.PSN != 2 {
		t.Fatalf("sent %v, want PSN 2 again after two RTTs", psns(again))
	}
}

// congestion.md loss rule, across paths, within one batch: a batch read the clock once, but its
// packets went in PSN order. A peer reading a backlog (or reading while the batch is still going
// out) acknowledges the first part of a batch long after it went; the rest, on another path, went
// after what it acknowledged and is not lost before the least retransmission timeout. Packets that
// went before an acknowledged one of their batch are lost once they have waited two RTTs of
// their path.
func TestTraceLossAcrossPathsWithinABatch(t *testing.T) {
	// batch sends one WRITE of 8 packets in one batch, PSNs 2-5 on one path and 6-9 on the
	// other, after both paths got an RTT sample of 200 µs, and lets a millisecond (five RTTs,
	// half the least retransmission timeout) go by.
	batch := func(t *testing.T) (*trace, []traceFrame) {
		r := newTrace(t, 2, nil)
		var p *peer
		for round := range 2 {
			r.post(uint16(round), efaio.OpSend, 100)
			d := r.data()
			r.advance(200 * time.Microsecond)
			r.ack(wire.PSN(round+1), nil, d[0].h.Path)
			r.completions()
			p = r.tr.peers[config.GIDFromAddr(tracePeer)]
			p.pathRR, p.tx.burst = (p.pathRR+1)%2, 16 // the next packet goes on the other path
		}
		p.tx.burst = 12
		r.post(2, efaio.OpRDMAWrite, 8*r.tr.segSize())
		d := r.data()
		if len(d) != 8 || d[0].h.Path == d[7].h.Path || d[3].h.Path != d[0].h.Path || d[4].h.Path != d[7].h.Path {
			t.Fatalf("sent %v on paths %d...%d, want 8 packets, 4 a path", psns(d), d[0].h.Path, d[7].h.Path)
		}
		r.advance(time.Millisecond)
		return r, d
	}
	t.Run("first part acknowledged", func(t *testing.T) {
		r, d := batch(t)
		r.ack(6, nil, d[3].h.Path) // the peer has read PSNs 2-5
		if again := r.data(); len(again) != 0 {
			t.Fatalf("sent %v again: they went after every packet acknowledged", psns(again))
		}
		r.ack(10, nil, d[7].h.Path)
		r.wantCompletion(2, efaio.StatusOK)
		if n := r.counts.RetransPkts.Load(); n != 0 {
			t.Fatalf("%d packets retransmitted, want none", n)
		}
	})
	t.Run("second part acknowledged", func(t *testing.T) {
		r, d := batch(t)
		r.ack(2, []wire.PSN{6, 7, 8, 9}, d[7].h.Path) // the first path's four went before these
		if again := r.data(); len(again) != 4 || again[0].f.Data.PSN != 2 || again[3].f.Data.PSN != 5 {
			t.Fatalf("sent %v again, want PSNs 2-5", psns(again))
		}
	})
}

// congestion.md "Sent after": datagrams go on the link in the order their frames were written.
// A goroutine that wrote a batch and let go of the device's lock, and is kept from sending it
// (off its processor), holds back the next batch another goroutine writes: sent first, that
// batch's ACK would take the first for lost.
func TestBatchesGoOutInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newTrace(t, 2, nil)
		r.hear()
		var mu sync.Mutex // the device's lock
		write := func(q *Queue, wrid uint16) {
			mu.Lock()
			defer mu.Unlock()
			r.tr.Use(q)
			req := Request{Op: wire.OpSend, DstQPN: 9, QKey: 0x77, Length: 100}
			req.Src[0], req.NSrc = mem.Own(r.buf[:100]), 1
			if _, st := r.tr.Request(r.f.Now(), config.GIDFromAddr(tracePeer), &req, wrid); st != efaio.StatusOK {
				t.Errorf("request: status %d", st)
			}
			r.tr.Hold(q)
		}
		first, second := r.tr.NewQueue(), r.tr.NewQueue()
		write(first, 1) // and then held up before sending
		sent := make(chan struct{})
		go func() {
			write(second, 2)
			r.tr.Flush(second)
			close(sent)
		}()
		synctest.Wait()
		select {
		case <-sent:
			t.Fatal("the second batch went out before the first")
		default:
		}
		r.tr.Flush(first)
		<-sent
		r.collect()
		if d := r.data(); len(d) != 2 || d[0].f.Data.PSN != 0 || d[1].f.Data.PSN != 1 {
			t.Fatalf("sent %v, want PSNs 0 and 1 in that order", psns(d))
		}
	})
}

// congestion.md "Loss detection" (timer): a READ_REQ whose acknowledgement was lost, but whose
// data came, is taken as acknowledged: the data showed that the peer had it. Nothing else would
// acknowledge it (no probe goes for an answered request, and nothing is sent after it while it
// fills the window), and the window would stay shut until the transport timeout.
func TestTraceAnsweredRequestLeavesTheWindow(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	p.tx.cwnd = 1
	r.post(1, efaio.OpRDMARead, 1000)
	reqs := r.data()
	if len(reqs) != 1 || reqs[0].f.Data.Op != wire.OpReadReq {
		t.Fatalf("sent %+v, want one READ_REQ", reqs)
	}
	r.post(2, efaio.OpSend, 100)
	if d := r.data(); len(d) != 0 {
		t.Fatalf("sent %v with the window full", psns(d))
	}
	// The data comes; the ACK of the READ_REQ was lost (none is sent).
	r.peerData(wire.Data{Op: wire.OpReadResp, MsgID: reqs[0].f.Data.MsgID, Length: 1000, Payload: make([]byte, 1000)})
	r.wantCompletion(1, efaio.StatusOK)
	r.advance(time.Millisecond)
	d := r.data()
	if len(d) != 1 || d[0].f.Data.Op != wire.OpSend {
		t.Fatalf("sent %+v within a millisecond of the read's data, want the SEND", d)
	}
	if n := r.counts.RetransPkts.Load(); n != 0 {
		t.Fatalf("%d packets retransmitted, want none", n)
	}
}

// congestion.md "Loss detection" (timer): the packet a PING's answer shows lost goes once; a
// timeout after that with nothing acknowledged since sends it on two paths: a path dark for a
// while, that a lost probe does not mark failed, would otherwise take the probes the rotation
// gives it until the transport timeout.
func TestTraceRepeatedTimeoutProbesTwoPaths(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	r.post(1, efaio.OpSend, 100)
	if d := r.data(); len(d) != 1 {
		t.Fatalf("sent %v, want PSN 0", psns(d))
	}
	if d := r.awaitData(); len(d) != 1 {
		t.Fatalf("the first timeout's answered PING sent %v, want PSN 0 once", psns(d))
	}
	d := r.awaitData()
	if len(d) != 2 || d[0].f.Data.PSN != 0 || d[1].f.Data.PSN != 0 || d[0].h.Path == d[1].h.Path {
		t.Fatalf("second timeout sent %v, want PSN 0 on both paths", psns(d))
	}
	r.ack(1, nil, d[1].h.Path)
	r.wantCompletion(1, efaio.StatusOK)
}

// wire.md "Address validation": a device sends no packet of its stream to a peer it never heard
// from, which has no context for it and would challenge the packet and drop it: it sends a PROBE on
// its endpoint's path, again after the retransmission timeout (backed off) on the next path, and
// the stream goes once the peer's challenge comes, its first datagram with the cookie: nothing
// goes twice.
func TestTraceFirstContactWaitsForChallenge(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.tr.ports = []uint16{traceDev.Port(), 4800}
	r.quietPeer = true
	for i := range 4 {
		r.post(uint16(i), efaio.OpSend, 100)
	}
	hellos := func() (paths []uint8) {
		for _, g := range r.take(wire.TypeProbe) {
			paths = append(paths, g.h.Path)
		}
		return paths
	}
	if d, h := r.data(), hellos(); len(d) != 0 || !slices.Equal(h, []uint8{0}) {
		t.Fatalf("sent %v and PROBEs on paths %v to a peer never heard from, want no DATA and a PROBE on path 0", psns(d), h)
	}
	r.advance(initialRTO)
	if h := hellos(); !slices.Equal(h, []uint8{1}) {
		t.Fatalf("PROBEs on paths %v after the retransmission timeout, want one on the next path, 1", h)
	}
	r.advance(initialRTO)
	if h := hellos(); len(h) != 0 {
		t.Fatalf("PROBEs on paths %v a timeout later, want none: the wait doubles", h)
	}
	r.advance(initialRTO)
	if h := hellos(); !slices.Equal(h, []uint8{0}) {
		t.Fatalf("PROBEs on paths %v after twice the timeout, want one on path 0", h)
	}
	r.send(0, func(b []byte) []byte { return wire.AppendChallenge(b, 0x1234567, traceDev.Port()) })
	d := r.data()
	if !slices.Equal(psns(d), []wire.PSN{0, 1, 2, 3}) {
		t.Fatalf("sent %v after the peer's challenge, want PSNs 0-3", psns(d))
	}
	if c := r.take(wire.TypeCookie); len(c) == 0 || c[0].dgram != d[0].dgram || c[0].f.Cookie != 0x1234567 {
		t.Fatalf("COOKIEs %+v, want the challenge's cookie in the first DATA's datagram", c)
	}
	r.ack(4, nil, 0)
	if cs := r.completions(); len(cs) != 4 || slices.ContainsFunc(cs, func(c completion) bool { return c.Status != efaio.StatusOK }) {
		t.Fatalf("completions %+v, want 4 OK", cs)
	}
	if n := r.counts.RetransPkts.Load(); n != 0 {
		t.Fatalf("%d packets retransmitted, want 0", n)
	}
}

// wire.md "Address validation": a first contact whose endpoint's path is dark gets through on
// another: the retried PROBE goes on the next path, the peer challenges that path's port, the
// cookie comes back in a PROBE on it, and the stream goes there once the PROBE_ACK comes.
func TestTraceFirstContactAroundADarkPath(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.tr.ports = []uint16{traceDev.Port(), 4800}
	r.quietPeer = true
	r.post(1, efaio.OpSend, 100)
	r.take(wire.TypeProbe) // (lost)
	r.advance(initialRTO)
	if pr := r.take(wire.TypeProbe); len(pr) != 1 || pr[0].h.Path != 1 {
		t.Fatalf("PROBEs %+v after the timeout, want one on path 1", pr)
	}
	r.send(0, func(b []byte) []byte { return wire.AppendChallenge(b, 0x1234567, 4800) })
	pr, ck := r.take(wire.TypeProbe), r.take(wire.TypeCookie)
	if len(pr) != 1 || pr[0].h.Path != 1 || len(ck) != 1 || ck[0].dgram != pr[0].dgram || len(r.data()) != 0 {
		t.Fatalf("after the challenge to path 1's port: PROBEs %+v, COOKIEs %+v; want one PROBE with the cookie on path 1, no DATA", pr, ck)
	}
	r.send(1, func(b []byte) []byte { return wire.AppendProbe(b, pr[0].f.Nonce, true) })
	if d := r.data(); len(d) != 1 || d[0].h.Path != 1 {
		t.Fatalf("sent %+v after the PROBE_ACK, want the DATA on path 1", d)
	}
}

// wire.md "Address validation": a CHALLENGE in a datagram the device does not take (sealed by
// another run of the peer, or a capture of one replayed) is echoed, but nothing in flight goes
// again and no path is unproven: a replay could otherwise do either at will.
func TestTraceChallengeNotTakenOnlyEchoed(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.tr.ports = []uint16{traceDev.Port(), 4800}
	r.hear()
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	for i := range p.paths {
		p.paths[i].unproven = false
	}
	if d := r.sends(4); len(d) != 4 {
		t.Fatalf("sent %v, want 4 packets", psns(d))
	}
	r.take(wire.TypeCookie)
	for _, port := range []uint16{traceDev.Port(), 4800} {
		r.batch(r.q, func(time.Duration) { r.tr.onChallenge(p, 0x7654321, port, false) })
		r.collect()
		if d := r.data(); len(d) != 0 || !p.paths[1].usable() {
			t.Fatalf("after a challenge not taken to port %d: sent %v again, path 1 usable %v; want nothing, usable", port, psns(d), p.paths[1].usable())
		}
	}
	r.post(9, efaio.OpSend, 100)
	if c := r.take(wire.TypeCookie); len(c) == 0 || c[0].f.Cookie != 0x7654321 {
		t.Fatalf("COOKIEs %+v with the next DATA, want the challenge's echoed", c)
	}
}

// wire.md "Address validation" and "Completion": a peer that never answers gets no packet of the
// stream, a PROBE at most every 200 ms once the wait has doubled up to it, and the requests end
// as LOCAL_UNREACH_REMOTE at the transport timeout.
func TestTraceUnansweredFirstContact(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.quietPeer = true
	r.post(1, efaio.OpSend, 100)
	r.advance(900 * time.Millisecond)
	r.noCompletion()
	r.advance(200 * time.Millisecond)
	r.wantCompletion(1, efaio.StatusLocalUnreachRemote)
	// 10, 20, 40, 80, 160, then 200 ms apart: 10 within the second.
	if d, probes := r.data(), r.take(wire.TypeProbe); len(d) != 0 || len(probes) < 8 || len(probes) > 10 {
		t.Fatalf("sent %d DATA and %d PROBEs to a peer that never answered, want none and 8-10", len(d), len(probes))
	}
}

// wire.md "Address validation": a peer that still has a context for the device answers its
// first-contact PROBE with a PROBE_ACK, and the stream goes as that answer is taken, not at the
// next tick.
func TestTraceFirstContactAnsweredByProbeAck(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.quietPeer = true
	r.post(1, efaio.OpSend, 100)
	hello := r.take(wire.TypeProbe)
	if len(hello) != 1 || len(r.data()) != 0 {
		t.Fatalf("PROBEs %+v, want one and no DATA", hello)
	}
	r.inject(0, func(b []byte) []byte { return wire.AppendProbe(b, hello[0].f.Nonce, true) })
	r.busyPoll() // (no tick)
	if d := r.data(); len(d) != 1 || d[0].f.Data.PSN != 0 {
		t.Fatalf("sent %v as the PROBE_ACK was taken, want PSN 0", psns(d))
	}
}

// wire.md "Address validation": a request cancelled while the device waits for a peer's first
// answer leaves nothing to send: the PROBEs stop and the device goes idle.
func TestTraceCancelStopsFirstContact(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.quietPeer = true
	var m *Msg
	req := Request{Op: wire.OpSend, DstQPN: 9, QKey: 0x77, Length: 100, NSrc: 1}
	req.Src[0] = mem.Own(r.buf[:100])
	r.batch(r.q, func(now time.Duration) { m, _ = r.tr.Request(now, config.GIDFromAddr(tracePeer), &req, uint16(1)) })
	r.drive()
	if len(r.take(wire.TypeProbe)) != 1 {
		t.Fatal("no first-contact PROBE")
	}
	r.batch(r.q, func(time.Duration) { r.tr.Cancel(m) })
	r.advance(100 * time.Millisecond)
	if n := len(r.take(wire.TypeProbe)); n != 0 || r.tr.Busy() {
		t.Fatalf("%d PROBEs after the cancel, busy %v: want none, idle", n, r.tr.Busy())
	}
}

// wire.md "Datagrams": small messages share datagrams up to the path MTU, and a path carries a
// burst of 16 datagrams, not of 16 frames, before the next takes over.
func TestTraceSmallMessagesFillDatagrams(t *testing.T) {
	r := newTrace(t, 2, func(c *config.Device) { c.PathMTU = 9001 })
	r.hear()
	const n = 60 // (within the initial window)
	r.batch(r.q, func(now time.Duration) { r.queueSends(now, n, 64) })
	r.collect()
	d := r.data()
	if len(d) != n {
		t.Fatalf("sent %d DATA frames, want %d", len(d), n)
	}
	if dgrams := d[n-1].dgram - d[0].dgram + 1; dgrams > 2 {
		t.Fatalf("%d messages of 64 bytes took %d datagrams of 9,001 bytes at most, want 1 or 2", n, dgrams)
	}
	for _, f := range d {
		if f.h.Path != d[0].h.Path {
			t.Fatalf("frames on paths %d and %d: two datagrams are one burst", d[0].h.Path, f.h.Path)
		}
	}
}

// wire.md "Packet streams": within a batch the receiver acknowledges after every 16 datagrams
// of the peer's stream, however many frames they carry, and at the batch's end.
func TestTraceAckEvery16Datagrams(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	for range 20 {
		r.inject(0, func(b []byte) []byte {
			for range 4 {
				d := wire.Data{Op: wire.OpWrite, MsgID: uint32(r.next), Length: 10, Payload: make([]byte, 10), PSN: r.next}
				r.next++
				b = wire.AppendData(b, &d)
			}
			return b
		})
	}
	r.drive()
	acks := r.take(wire.TypeAck)
	if len(acks) != 2 || acks[0].f.Ack.Cum != 64 || acks[1].f.Ack.Cum != 80 {
		t.Fatalf("ACKs %+v of 20 datagrams of 4 frames, want two: after 16 datagrams and at the end", acks)
	}
}

// congestion.md "Loss detection" (timer): a timeout proved spurious by an acknowledgement that
// came 8 ms after the packets went (a stall) keeps the device's timers at 10 ms at least, after
// the RTT estimate has come back down, for a second; then the floor halves each second.
func TestTraceStallRaisesTheTimer(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	r.rttSample() // 1 ms: the timer at 2 ms
	// probeAfter posts a SEND and reports how long the timer took to send it again (its PING
	// answered with nothing acknowledged).
	probeAfter := func(wrid uint16) time.Duration {
		r.post(wrid, efaio.OpSend, 100)
		d := r.data()
		start := r.f.Now()
		r.awaitData()
		r.ack(wire.PSN(d[0].f.Data.PSN+1), nil, d[0].h.Path)
		r.completions()
		return r.f.Now() - start
	}
	// exchange makes n round trips of 1 ms: the RTT estimate back at 1 ms.
	exchange := func(n int) {
		for i := range n {
			r.post(uint16(100+i), efaio.OpSend, 100)
			d := r.data()
			r.advance(time.Millisecond)
			r.ack(d[0].f.Data.PSN+1, nil, d[0].h.Path)
			r.completions()
		}
	}
	// PSNs 1 and 2; the peer is held up, the timer fires and PINGs; PSNs 1 and 2, sent once, are
	// acknowledged 8 ms after they went: the timeout was spurious.
	r.post(1, efaio.OpSend, 100)
	r.post(2, efaio.OpSend, 100)
	d := r.data()
	start := r.f.Now()
	r.heldUp = true
	r.awaitPing()
	r.heldUp = false
	r.advance(start + 8*time.Millisecond - r.f.Now())
	r.ack(1, []wire.PSN{2}, d[1].h.Path)
	r.ack(3, nil, d[1].h.Path)
	r.completions()
	if n := r.counts.SpuriousTimeouts.Load(); n != 1 {
		t.Fatalf("%d spurious timeouts, want 1", n)
	}
	exchange(20)
	if took := probeAfter(3); took < 10*time.Millisecond {
		t.Fatalf("the timer fired %v after a send, within a second of an 8 ms stall: want 10 ms at least", took)
	}
	r.advance(2 * time.Second)
	exchange(20)
	if took := probeAfter(4); took > 4*time.Millisecond { // (the timer, 3 ms, and its PING's answer)
		t.Fatalf("the timer fired %v after a send, 2 s after the stall: want the floor forgotten", took)
	}
}

// wire.md "Packet streams": the transport timeout fails requests with 13 when the peer had
// answered before (it is unresponsive), with 15 when it never did (unreachable).
func TestTraceTimeoutOfAPeerHeardBefore(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	r.ack(1, nil, d[0].h.Path)
	r.wantCompletion(1, efaio.StatusOK)
	r.post(2, efaio.OpSend, 100)
	r.advance(1100 * time.Millisecond)
	r.wantCompletion(2, efaio.StatusLocalUnrespRemote)
	if r.counts.UnresponsiveRemoteEvents.Load() != 1 {
		t.Fatalf("unresponsive events %d, want 1", r.counts.UnresponsiveRemoteEvents.Load())
	}
}

// A transport timeout that abandons a message of several packets frees it once: its packets'
// slots all name it, and freeing it for each would hand one message to several later requests.
func TestTraceTransportTimeoutFreesMessagesOnce(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	r.post(1, efaio.OpRDMAWrite, 4*r.tr.segSize()) // four packets
	if d := r.data(); len(d) != 4 {
		t.Fatalf("sent %d packets, want 4", len(d))
	}
	r.advance(1100 * time.Millisecond)
	r.wantCompletion(1, efaio.StatusLocalUnrespRemote) // (heard from before)
	seen := make(map[*Msg]bool)
	for _, m := range r.tr.freeMsgs {
		if seen[m] {
			t.Fatalf("a message is on the free list twice (%d entries)", len(r.tr.freeMsgs))
		}
		seen[m] = true
	}
}

// wire.md "Completion": the horizon an ACK carries never lags the stream by so much that it reads
// as ahead of it. Once the peer has acknowledged the RESP, the horizon moves with the
// acknowledged point; before, it stayed at the PSN after the RESP, and 2^31 PSNs later (here
// jumped to) the peer, comparing it with its cumulative point, would wait for it forever.
func TestTraceHorizonFollowsAcknowledgedStream(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.peerData(wire.Data{Op: wire.OpSend, MsgID: 5, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	resps := r.data()
	if len(resps) != 1 || resps[0].f.Data.Op != wire.OpResp {
		t.Fatalf("sent %+v, want a RESP", resps)
	}
	end := resps[0].f.Data.PSN + 1
	r.ack(end, nil, 0) // the peer has the RESP
	r.take(wire.TypeAck)
	s := &r.tr.peers[config.GIDFromAddr(tracePeer)].tx
	if s.una != end || s.next != end {
		t.Fatalf("stream [%d, %d), want everything up to %d acknowledged", s.una, s.next, end)
	}
	far := end + 1<<31 + 5 // as if that many more PSNs had been sent and acknowledged
	s.una, s.next = far, far
	r.peerData(wire.Data{Op: wire.OpWrite, MsgID: 6, Length: 10, Payload: make([]byte, 10)})
	acks := r.take(wire.TypeAck)
	if len(acks) == 0 {
		t.Fatal("the WRITE was not acknowledged")
	}
	if h := acks[len(acks)-1].f.Ack.Horizon; h != far {
		t.Fatalf("horizon %d, want %d: the acknowledged point (the RESP's end, %d, reads as ahead of it)", h, far, end)
	}
}

// wire.md "Frames" (ABORT): a segment of a message that arrives after the message's ABORT (the
// ABORT overtook it by another path) is dropped; it does not start the message anew and take a
// second receive WR, which no further segment would ever finish.
func TestTraceSegmentAfterAbortIsDropped(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.recv(7)
	r.recv(8)
	seg := func(psn wire.PSN, off uint32) {
		d := wire.Data{PSN: psn, Op: wire.OpSend, MsgID: 5, Length: 30, Offset: off, DstQPN: 3, QKey: traceQKey,
			Payload: make([]byte, 10)}
		r.send(0, func(b []byte) []byte { return wire.AppendData(b, &d) })
	}
	seg(0, 0)
	ab := wire.Data{PSN: 2, Op: wire.OpAbort, MsgID: 5}
	r.send(1, func(b []byte) []byte { return wire.AppendData(b, &ab) })
	r.wantCompletion(7, efaio.StatusRemoteAbort)
	seg(1, 10) // sent before the ABORT, arriving after it
	r.noCompletion()
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if len(p.rx.in) != 0 || len(r.host.recvs) != 1 {
		t.Fatalf("%d messages held, %d receives left; want none held and WR 8 still posted", len(p.rx.in), len(r.host.recvs))
	}
	if len(p.rx.aborted) != 0 {
		t.Errorf("the ABORT is still remembered with the stream complete up to %d", p.rx.cum)
	}
}

// A peer that goes quiet in the middle of a message does not hold its receive WR forever: after
// the peer idle timeout the message is aborted, and the peer can then be forgotten.
func TestTraceQuietPeerReleasesPartMessage(t *testing.T) {
	r := newTrace(t, 2, func(c *config.Device) { c.PeerIdleTimeout = 2 * time.Second })
	r.meet()
	r.recv(7)
	r.peerData(wire.Data{Op: wire.OpSend, MsgID: 5, Length: 30, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	r.noCompletion()
	r.advance(4 * time.Second)
	r.wantCompletion(7, efaio.StatusRemoteAbort)
	if _, ok := r.tr.peers[config.GIDFromAddr(tracePeer)]; ok {
		r.advance(2 * time.Second)
		if _, ok := r.tr.peers[config.GIDFromAddr(tracePeer)]; ok {
			t.Error("the quiet peer is still remembered")
		}
	}
}

// A peer may have at most maxInbound messages arriving in part: one that starts more RDMA writes
// and never finishes them has the first segments past the bound dropped, not held.
func TestTraceMessagesInPartAreBounded(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	for id := range uint32(maxInbound + 10) {
		r.peerData(wire.Data{Op: wire.OpWrite, MsgID: id, Length: 30, Payload: make([]byte, 10)})
	}
	if n := len(r.tr.peers[config.GIDFromAddr(tracePeer)].rx.in); n != maxInbound {
		t.Fatalf("%d messages held in part, want the bound, %d", n, maxInbound)
	}
	if got := r.counts.RxDrops.Load(); got != 10 || len(r.data()) != 10 {
		t.Errorf("%d segments dropped, want the 10 past the bound, each answered with a RESP", got)
	}
}

// wire.md "Epochs": a device that forgot a peer (its memo evicted) starts its stream to the peer
// at epoch 0 again, below the epoch the peer last had from it. The peer answers the stale DATA
// with an ACK whose header names the epoch it has; the device then moves its stream past it at
// once and sends again what the peer never acknowledged. Before, the peer dropped the stale
// DATA without a word and the device climbed one epoch per transport timeout (hours for a peer
// that had seen many epochs).
func TestTraceStaleEpochIsAnswered(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.epoch = 7
	r.peerData(wire.Data{Op: wire.OpWrite, MsgID: 1, Length: 10, Payload: make([]byte, 10)})
	r.take(wire.TypeAck)
	r.epoch, r.next = 2, 0 // the peer, having forgotten us, starts over below
	r.peerData(wire.Data{Op: wire.OpWrite, MsgID: 1, Length: 10, Payload: make([]byte, 10)})
	r.advance(time.Millisecond)
	acks := r.take(wire.TypeAck)
	if len(acks) == 0 || acks[len(acks)-1].h.RxEpoch != 7 {
		t.Fatalf("ACKs %+v after stale DATA, want one naming epoch 7", acks)
	}
}

func TestTraceStreamMovesPastThePeersEpoch(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.post(1, efaio.OpSend, 100)
	first := r.data()
	if len(first) != 1 || first[0].h.TxEpoch != 0 {
		t.Fatalf("sent %+v, want one DATA in epoch 0", first)
	}
	r.devTx = 9 // the peer has had epoch 9 of our stream, from before we forgot it
	r.send(0, func(b []byte) []byte { return wire.AppendAck(b, &wire.Ack{}) })
	again := r.data()
	if len(again) != 1 || again[0].h.TxEpoch != 10 || again[0].f.Data.PSN != 0 || again[0].f.Data.Length != 100 {
		t.Fatalf("sent %+v, want the SEND again as PSN 0 of epoch 10", again)
	}
	r.noCompletion()
}

// The timer's loops over peers walk only the peers not slim (Transport.active): a slimmed peer
// leaves the list, and its next traffic puts it back.
func TestTraceSlimPeerLeavesTheTimersList(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.recv(1)
	r.peerData(wire.Data{Op: wire.OpSend, MsgID: 1, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if len(r.tr.active) != 1 || r.tr.active[0] != p {
		t.Fatalf("active peers %v, want the one peer", r.tr.active)
	}
	r.advance(2 * slimAfter)
	if !p.slim || len(r.tr.active) != 0 {
		t.Fatalf("slim %v, %d active peers; want slim and none", p.slim, len(r.tr.active))
	}
	r.recv(2)
	r.peerData(wire.Data{Op: wire.OpSend, MsgID: 2, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	if p.slim || len(r.tr.active) != 1 {
		t.Fatalf("slim %v, %d active peers after new traffic; want the peer back", p.slim, len(r.tr.active))
	}
}

// When the stream moves past the peer's epoch (TestTraceStreamMovesPastThePeersEpoch), the
// answers in it go again in the new epoch: the peer's SEND that failed waits for its RESP, and an
// ACK of the new epoch (whose horizon starts over) must not let it pass for a success.
func TestTraceStreamMovingPastKeepsAnswers(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.peerData(wire.Data{Op: wire.OpSend, MsgID: 5, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	resps := r.data()
	if len(resps) != 1 || resps[0].f.Data.Op != wire.OpResp || resps[0].h.TxEpoch != 0 {
		t.Fatalf("sent %+v, want a RESP in epoch 0", resps)
	}
	r.devTx = 3 // the peer has had epoch 3 of our stream: it dropped the RESP as stale
	r.send(0, func(b []byte) []byte { return wire.AppendAck(b, &wire.Ack{}) })
	again := r.data()
	if len(again) != 1 || again[0].f.Data.Op != wire.OpResp || again[0].f.Data.MsgID != 5 || again[0].h.TxEpoch != 4 ||
		efaio.Status(again[0].f.Data.Status) != efaio.StatusRemoteRNR {
		t.Fatalf("sent %+v, want the RESP for message 5 again in epoch 4", again)
	}
}

// wire.md "ACK" (horizon) and "Completion": a RESP that takes the last PSN, 2^32-1, makes the
// horizon PSN 0, which the ACK flags as such (a bare 0 means no RESP). The requester waits for
// that RESP instead of taking its failed message for a success.
func TestTraceRespAtTheLastPSN(t *testing.T) {
	const last = ^wire.PSN(0)
	t.Run("responder", func(t *testing.T) {
		r := newTrace(t, 2, nil)
		r.meet()
		// A first RESP (no receive posted), acknowledged; then the stream jumps to the last PSN.
		r.peerData(wire.Data{Op: wire.OpSend, MsgID: 5, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
		first := r.data()
		r.ack(first[0].f.Data.PSN+1, nil, 0)
		r.take(wire.TypeAck)
		s := &r.tr.peers[config.GIDFromAddr(tracePeer)].tx
		s.una, s.next = last, last
		r.peerData(wire.Data{Op: wire.OpSend, MsgID: 6, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
		resps := r.data()
		if len(resps) != 1 || resps[0].f.Data.Op != wire.OpResp || resps[0].f.Data.PSN != last {
			t.Fatalf("sent %+v, want a RESP at PSN %d", resps, last)
		}
		r.peerData(wire.Data{Op: wire.OpWrite, MsgID: 7, Length: 10, Payload: make([]byte, 10)})
		acks := r.take(wire.TypeAck)
		if len(acks) == 0 {
			t.Fatal("the WRITE was not acknowledged")
		}
		if a := acks[len(acks)-1].f.Ack; a.Horizon != 0 || !a.HasHorizon {
			t.Fatalf("ACK %+v, want horizon PSN 0, flagged as a horizon", a)
		}
	})
	t.Run("requester", func(t *testing.T) {
		r := newTrace(t, 2, nil)
		r.post(1, efaio.OpSend, 100)
		r.ack(1, nil, r.data()[0].h.Path)
		r.wantCompletion(1, efaio.StatusOK)
		r.recv(7)
		r.peerData(wire.Data{Op: wire.OpSend, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
		r.wantCompletion(7, efaio.StatusOK)
		// The peer's stream jumps to its last PSN, where its next RESP will go.
		rx := &r.tr.peers[config.GIDFromAddr(tracePeer)].rx
		rx.cum, rx.highest, r.next = last, last-1, last
		r.post(2, efaio.OpRDMAWrite, 100)
		d := r.data()
		r.horizonZero = true // the peer's RESP at PSN 2^32-1 will fail it
		r.ack(d[0].f.Data.PSN+1, nil, d[0].h.Path)
		r.noCompletion()
		r.peerData(wire.Data{Op: wire.OpResp, MsgID: d[0].f.Data.MsgID, Status: uint8(efaio.StatusRemoteBadAddress)})
		r.wantCompletion(2, efaio.StatusRemoteBadAddress)
	})
}

// wire.md "Frames" (READ_RESP) and security.md: read data is read from the region when each
// segment goes, the first time or again, in the stream's epoch or a later one. Once the region is
// deregistered, a segment sent again (its first copy lost) does not carry what the application
// has since written there: it goes as an ABORT, and one RESP with REMOTE_BAD_ADDRESS fails the
// peer's read. A stream reset (transport timeout) before or after the dereg changes nothing.
func TestTraceReadDataAfterDereg(t *testing.T) {
	for _, c := range []struct {
		name              string
		resetBefore, wait time.Duration // the stream times out before the dereg; how long after it to watch
	}{
		{"lost", 0, 900 * time.Millisecond},
		{"reset then dereg", 1100 * time.Millisecond, 200 * time.Millisecond},
		{"dereg then reset", 0, 1300 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newTrace(t, 2, nil)
			r.meet()
			seg := r.tr.segSize()
			r.host.mem = bytes.Repeat([]byte("old!"), seg)
			r.peerData(wire.Data{Op: wire.OpReadReq, MsgID: 9, Length: uint32(3 * seg), SrcQPN: 3, DstQPN: 3})
			if first := r.data(); len(first) == 0 || first[0].f.Data.Op != wire.OpReadResp {
				t.Fatalf("sent %+v, want read data", first)
			}
			// Every segment is lost (the peer never answers); the application deregisters the
			// region and reuses its memory.
			r.advance(c.resetBefore)
			r.data()
			r.host.dereg = true
			copy(r.host.mem, bytes.Repeat([]byte("new!"), seg))
			r.advance(c.wait)
			resps := map[[2]uint32]bool{} // (epoch, PSN) of each RESP for the read
			for _, f := range r.data() {
				switch d := f.f.Data; {
				case d.Op == wire.OpReadResp && len(d.Payload) > 0:
					t.Fatalf("read data sent after the dereg (epoch %d, PSN %d): %q...", f.h.TxEpoch, d.PSN, d.Payload[:min(8, len(d.Payload))])
				case d.Op == wire.OpResp && d.MsgID == 9:
					if efaio.Status(d.Status) != efaio.StatusRemoteBadAddress {
						t.Fatalf("RESP status %d, want %d", d.Status, efaio.StatusRemoteBadAddress)
					}
					resps[[2]uint32{uint32(f.h.TxEpoch), uint32(d.PSN)}] = true
				}
			}
			perEpoch := map[uint32]int{}
			for k := range resps {
				perEpoch[k[0]]++
			}
			if len(resps) == 0 {
				t.Fatal("no RESP failed the read")
			}
			for e, n := range perEpoch {
				if n != 1 {
					t.Errorf("%d RESPs for the read in epoch %d (%v), want one (sent again as often as need be)", n, e, resps)
				}
			}
		})
	}
}

// congestion.md loss rules: a packet is stamped with the time it is sent, not with the start of
// the batch that sent it (read once per batch, that time can be tens of microseconds old by the
// batch's end). Stamped with it, a packet sent late in one batch looked older than one sent just
// after it in the next, and the acknowledgement of the second counted the first lost.
func TestTracePacketsStampedWhenSent(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.hear()
	send := func(wrid uint16, now time.Duration) {
		req := Request{Op: wire.OpSend, DstQPN: 9, QKey: 0x77, Length: 100}
		req.Src[0], req.NSrc = mem.Own(r.buf[:100]), 1
		if _, st := r.tr.Request(now, config.GIDFromAddr(tracePeer), &req, wrid); st != efaio.StatusOK {
			t.Fatalf("request: status %d", st)
		}
	}
	r.batch(r.q, func(now time.Duration) { // a batch starts,
		r.f.Advance(300 * time.Microsecond) // works for a while,
		send(1, now)                        // and sends a packet at its end
	})
	r.f.Advance(10 * time.Microsecond)
	r.batch(r.q, func(now time.Duration) { send(2, now) }) // the next batch sends another on the same path
	r.collect()
	d := r.data()
	if len(d) != 2 || d[0].h.Path != d[1].h.Path {
		t.Fatalf("sent %+v, want two packets on one path", d)
	}
	r.ack(d[0].f.Data.PSN, []wire.PSN{d[1].f.Data.PSN}, d[1].h.Path) // the second overtook the first
	if again := r.data(); len(again) != 0 {
		t.Fatalf("sent %v again: a packet sent 10 µs before the one acknowledged counted lost", psns(again))
	}
}

// wire.md "PROBE": a datagram packed with PROBEs gets one PROBE_ACK, not one datagram per PROBE
// sent to the endpoint its header names.
func TestTraceOneProbeAnsweredADatagram(t *testing.T) {
	r := newTrace(t, 4, nil)
	r.meet()
	r.send(0, func(b []byte) []byte {
		for i := range 50 {
			b = wire.AppendProbe(b, uint32(100+i), false)
		}
		return b
	})
	if acks := r.take(wire.TypeProbeAck); len(acks) != 1 || acks[0].f.Nonce != 100 {
		t.Fatalf("%d PROBE_ACKs, want one, of nonce 100", len(acks))
	}
}

// wire.md "Address validation": a cookie names the second it was issued in and is taken for 20
// seconds; for a datagram sealed by another run of a peer the device knows, only if it was issued
// no earlier than the second the peer's current run was taken (a capture of an earlier run's
// datagram carries that run's cookie).
func TestTraceCookieAgeAndRun(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.tr.now = 5 * time.Hour // (past a wrap of the 16 bits of seconds)
	c := r.tr.cookie(tracePeer, tracePeer.Port(), r.tr.cookieNow())
	r.tr.now += 20*time.Second + 999*time.Millisecond
	if _, ok := r.tr.cookieOK(tracePeer, tracePeer.Port(), c); !ok {
		t.Fatal("a cookie of 20 seconds ago refused")
	}
	if _, ok := r.tr.cookieOK(tracePeer, tracePeer.Port()+1, c); ok {
		t.Fatal("a cookie taken for another port")
	}
	r.tr.now += time.Millisecond
	if _, ok := r.tr.cookieOK(tracePeer, tracePeer.Port(), c); ok {
		t.Fatal("a cookie of 21 seconds ago taken")
	}
	r.tr.now -= 10 * time.Second
	gid := config.GIDFromAddr(tracePeer)
	p := &peer{runTick: uint16(r.tr.cookieNow() - 5)} // its current run taken 5 s ago, after c
	if r.tr.cookieTakes(p, gid, tracePeer, tracePeer.Port(), c, true) {
		t.Fatal("a cookie older than the peer's current run took another run")
	}
	if !r.tr.cookieTakes(p, gid, tracePeer, tracePeer.Port(), c, false) || !r.tr.cookieTakes(nil, gid, tracePeer, tracePeer.Port(), c, true) {
		t.Fatal("a valid cookie refused where no run is replaced")
	}
	r.tr.memos[gid] = memo{runTick: p.runTick, salt: 7} // the same peer, forgotten
	if r.tr.cookieTakes(nil, gid, tracePeer, tracePeer.Port(), c, true) {
		t.Fatal("a cookie older than a forgotten peer's current run took another run")
	}
	p.runTick = uint16(r.tr.cookieNow() - 11) // taken in the second c was issued in
	if !r.tr.cookieTakes(p, gid, tracePeer, tracePeer.Port(), c, true) {
		t.Fatal("a cookie issued in the second of the current run's start refused")
	}
}

// wire.md "Address validation": only a datagram's first COOKIE is checked (each check costs two
// hashes): a valid cookie behind an invalid one admits nothing, and gets a CHALLENGE.
func TestTraceFirstCookieOnly(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.send(0, func(b []byte) []byte { return wire.AppendAck(b, &wire.Ack{}) })
	good := r.cookie
	if good == 0 {
		t.Fatal("no challenge to a peer never met")
	}
	r.take(wire.TypeChallenge)
	r.cookie = 0
	r.send(0, func(b []byte) []byte {
		b = wire.AppendCookie(b, good^2, []uint16{tracePeer.Port()})
		b = wire.AppendCookie(b, good, []uint16{tracePeer.Port()})
		return wire.AppendAck(b, &wire.Ack{})
	})
	if len(r.tr.peers) != 0 || len(r.take(wire.TypeChallenge)) != 1 {
		t.Fatalf("%d peers after a datagram whose first cookie is wrong, want 0 and a challenge", len(r.tr.peers))
	}
	r.send(0, func(b []byte) []byte {
		b = wire.AppendCookie(b, good, []uint16{tracePeer.Port()})
		b = wire.AppendCookie(b, good^2, []uint16{tracePeer.Port()})
		return wire.AppendAck(b, &wire.Ack{})
	})
	if len(r.tr.peers) != 1 {
		t.Fatalf("%d peers after a datagram whose first cookie is right, want 1", len(r.tr.peers))
	}
}

// security.md "Bounded state": a peer that sends READ_REQs and never acknowledges the read data
// cannot grow the responder's queue without bound: past maxBacklog messages not yet sent, its
// requests are refused unacknowledged (it sends them again once the stream drains).
func TestTraceRequestsWaitForTheBacklog(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.meet()
	r.host.mem = make([]byte, 8)
	drops := r.tr.counts.RxDrops.Load()
	const reqs = maxBacklog + 2000
	for sent := 0; sent < reqs; {
		r.send(0, func(b []byte) []byte {
			for range 100 {
				d := wire.Data{Op: wire.OpReadReq, PSN: r.next, MsgID: uint32(r.next), Length: 8, SrcQPN: 3, DstQPN: 3}
				r.next++
				b = wire.AppendData(b, &d)
			}
			return b
		})
		sent += 100
		r.data()
	}
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if q := len(p.tx.queue); q > maxBacklog || p.tx.answers != q {
		t.Fatalf("%d messages queued (%d counted answers) for a peer that never acknowledges, want at most %d",
			q, p.tx.answers, maxBacklog)
	}
	if got := r.tr.counts.RxDrops.Load() - drops; got == 0 {
		t.Fatal("no request refused past the backlog")
	}
	if p.rx.cum.Less(maxBacklog) {
		t.Fatalf("cumulative point %d: requests below the backlog were refused", p.rx.cum)
	}
}

// security.md "Source binding": a port the peer proved is trusted for the life that proved it. A
// process that binds it after the peer exits and sends as the peer's next life (another source
// incarnation) is challenged: nothing is delivered and the peer's state stays; the real next
// life, from its endpoint, is taken.
func TestTraceProvenPortIsForOneLife(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.meet()
	port := netip.AddrPortFrom(tracePeer.Addr(), 40000)
	r.provePort(port)
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	r.recv(5)
	r.sendFrom(port, 0xbad, 0, r.sendFrame("evil"))
	if cs := r.completions(); len(cs) != 0 || p.inc != r.inc || len(r.take(wire.TypeChallenge)) != 1 {
		t.Fatalf("from a proven port as a new life: completions %+v, peer incarnation %#x (want %#x), want a challenge only",
			cs, p.inc, r.inc)
	}
	r.sendFrom(tracePeer, 0x600d, 0, r.sendFrame("good"))
	if cs := r.completions(); len(cs) != 1 || p.inc != 0x600d {
		t.Fatalf("the new life from its endpoint: completions %+v, peer incarnation %#x", cs, p.inc)
	}
	if p.trusts(port.Port(), tracePeer.Port(), r.f.Now()) {
		t.Fatal("the earlier life's port is still trusted")
	}
}

// wire.md "Address validation": a datagram from a port of the peer's IP not yet proven gets a
// CHALLENGE naming that port, sent to the peer's endpoint; the cookie echoed from that port proves
// it, and from then on its datagrams are taken.
func TestTracePortProvenByItsOwnChallenge(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.meet()
	port := netip.AddrPortFrom(tracePeer.Addr(), 40000)
	// A PROBE's datagram, the smallest a peer sends on a path, is long enough to be challenged.
	r.sendFrom(port, r.inc, 0, func(b []byte) []byte { return wire.AppendProbe(b, 1, false) })
	if ch := r.take(wire.TypeChallenge); len(ch) != 1 || len(r.take(wire.TypeProbeAck)) != 0 {
		t.Fatalf("a PROBE from an unproven port: challenges %+v, want one and no PROBE_ACK", ch)
	}
	r.recv(5)
	r.sendFrom(port, r.inc, 0, r.sendFrame("hold"))
	ch := r.take(wire.TypeChallenge)
	if len(ch) != 1 || ch[0].f.Port != port.Port() {
		t.Fatalf("challenges %+v, want one naming port %d", ch, port.Port())
	}
	r.noCompletion()
	r.sendFrom(port, r.inc, ch[0].f.Cookie, r.sendFrame("hold"))
	r.wantCompletion(5, efaio.StatusOK)
	r.recv(6)
	r.sendFrom(port, r.inc, 0, r.sendFrame("more")) // proven: no cookie needed now
	r.wantCompletion(6, efaio.StatusOK)
	if len(r.take(wire.TypeChallenge)) != 0 {
		t.Fatal("a proven port was challenged")
	}
}

// security.md "Source binding": a cookie proves only the port it was sent for. An attacker who
// captured the peer's datagram with its cookie and sends it again from a port of its own, listing
// that port, with a READ_REQ ahead in the stream gets one CHALLENGE and no read data: before, the
// cookie's list of ports was trusted, and the device sent the peer's endpoint 16 KiB for 84 bytes.
func TestTraceCapturedCookieFromAnotherPort(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.meet()
	port := netip.AddrPortFrom(tracePeer.Addr(), 40000)
	cookie := r.provePort(port)
	r.host.mem = make([]byte, 16<<10)
	evil := netip.AddrPortFrom(tracePeer.Addr(), 40001)
	before := r.dgrams
	h := wire.Header{SrcPort: tracePeer.Port(), SrcInc: r.inc, DstInc: r.tr.inc}
	b := wire.AppendHeader(nil, &h)
	b = wire.AppendCookie(b, cookie, []uint16{port.Port(), evil.Port()})
	b = wire.AppendData(b, &wire.Data{Op: wire.OpReadReq, PSN: r.next + 50, MsgID: 1, Length: 16 << 10, SrcQPN: 3, DstQPN: 3})
	wire.PutChecksum(b)
	r.f.Inject(evil, traceDev, b)
	r.advance(time.Millisecond)
	if d := r.data(); len(d) != 0 {
		t.Fatalf("%d DATA frames sent for a captured cookie replayed from another port", len(d))
	}
	if ch := r.take(wire.TypeChallenge); len(ch) != 1 || ch[0].f.Port != evil.Port() {
		t.Fatalf("challenges %+v, want one naming port %d", ch, evil.Port())
	}
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if p.trusts(evil.Port(), tracePeer.Port(), r.f.Now()) {
		t.Fatal("the attacker's port is trusted")
	}
	if r.dgrams-before > 1 {
		t.Fatalf("%d datagrams sent, want the one challenge", r.dgrams-before)
	}
}

// security.md "Source binding": the proven ports of a peer that falls quiet prove themselves
// again: the peer may have exited and another process bound them. A READ_REQ from one after
// portQuiet is challenged, not served. While the peer keeps sending, from any of its sources, its
// ports stay proven, however long one of them is quiet (a failed path sends only probes).
func TestTraceQuietPortProvesItselfAgain(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.meet()
	port := netip.AddrPortFrom(tracePeer.Addr(), 40000)
	r.provePort(port)
	for range 4 {
		r.advance(portQuiet / 2)
		r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, 1, false) }) // from the endpoint
	}
	r.take(wire.TypeProbeAck)
	r.sendFrom(port, r.inc, 0, func(b []byte) []byte { return wire.AppendProbe(b, 2, false) })
	if len(r.take(wire.TypeChallenge)) != 0 || len(r.take(wire.TypeProbeAck)) != 1 {
		t.Fatalf("a proven port of a peer that kept sending from its endpoint was not trusted after %v", 2*portQuiet)
	}
	r.host.mem = make([]byte, 16<<10)
	r.advance(portQuiet)
	d := wire.Data{Op: wire.OpReadReq, PSN: r.next, MsgID: 1, Length: 16 << 10, SrcQPN: 3, DstQPN: 3}
	r.sendFrom(port, r.inc, 0, func(b []byte) []byte { return wire.AppendData(b, &d) })
	if got := r.data(); len(got) != 0 {
		t.Fatalf("%d DATA frames sent for a READ_REQ from a port quiet for %v", len(got), portQuiet)
	}
	ch := r.take(wire.TypeChallenge)
	if len(ch) != 1 || ch[0].f.Port != port.Port() {
		t.Fatalf("challenges %+v, want one naming port %d", ch, port.Port())
	}
	r.sendFrom(port, r.inc, ch[0].f.Cookie, func(b []byte) []byte { return wire.AppendData(b, &d) })
	if got := r.data(); len(got) == 0 {
		t.Fatal("no read data once the port proved itself again")
	}
}

// wire.md "Address validation": a path whose UDP port is not the device's endpoint's carries
// nothing but PROBEs until it has proved itself to the peer: the peer's challenge to its port is
// echoed at once in a PROBE on it, the PROBE_ACK puts it in use, and the cookie rides on it until
// a packet it carried since is acknowledged. After a second with nothing sent to the peer (which
// forgets the ports of a device it took nothing from for that long) it proves itself again.
func TestTraceNewPathProvesItself(t *testing.T) {
	r := newTrace(t, 2, nil)
	ports := []uint16{traceDev.Port(), 4800}
	r.tr.ports = ports // as a UDP link's sockets would have them (memlink sends every path from one)
	r.meet()
	r.post(1, efaio.OpSend, 100)
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if d := r.data(); len(d) != 1 || d[0].h.Path != 0 {
		t.Fatalf("sent %+v, want one DATA on path 0", d)
	}
	r.take(wire.TypeCookie) // (the first contact's, for the endpoint's port, with the DATA)
	probes := r.take(wire.TypeProbe)
	if len(probes) != 1 || probes[0].h.Path != 1 {
		t.Fatalf("probes %+v, want one on the unproven path 1", probes)
	}
	r.ack(1, nil, 0)
	r.wantCompletion(1, efaio.StatusOK)
	// The peer challenges the probe's port: the cookie goes back at once, in a PROBE on path 1.
	r.send(0, func(b []byte) []byte { return wire.AppendChallenge(b, 0x1234567, ports[1]) })
	probes, cookies := r.take(wire.TypeProbe), r.take(wire.TypeCookie)
	if len(probes) != 1 || probes[0].h.Path != 1 || len(cookies) != 1 || cookies[0].dgram != probes[0].dgram ||
		cookies[0].f.Cookie != 0x1234567 || cookies[0].f.Ports.Len() != 1 || cookies[0].f.Ports.At(0) != ports[1] {
		t.Fatalf("after the challenge: probes %+v, COOKIEs %+v; want a PROBE on path 1 with the cookie for port %d",
			probes, cookies, ports[1])
	}
	p.pathRR, p.tx.burst = 1, 1
	r.post(2, efaio.OpSend, 100)
	if d := r.data(); len(d) != 1 || d[0].h.Path != 0 {
		t.Fatalf("sent %+v before the PROBE_ACK, want one DATA on path 0", d)
	}
	r.ack(2, nil, 0)
	r.wantCompletion(2, efaio.StatusOK)
	r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, probes[0].f.Nonce, true) })
	p.pathRR, p.tx.burst = 1, 1
	r.post(3, efaio.OpSend, 100)
	d := r.data()
	if len(d) != 1 || d[0].h.Path != 1 {
		t.Fatalf("sent %+v after the PROBE_ACK, want one DATA on path 1", d)
	}
	if c := r.take(wire.TypeCookie); len(c) != 1 || c[0].dgram != d[0].dgram {
		t.Fatalf("COOKIEs %+v: the first DATA on path 1 carried none", c)
	}
	r.ack(3, nil, 1)
	r.wantCompletion(3, efaio.StatusOK)
	p.pathRR, p.tx.burst = 1, 1
	r.post(4, efaio.OpSend, 100)
	if d := r.data(); len(d) != 1 || d[0].h.Path != 1 || len(r.take(wire.TypeCookie)) != 0 {
		t.Fatalf("sent %+v: want DATA on path 1 with no COOKIE once a packet of it was acknowledged", d)
	}
	r.ack(4, nil, 1)
	r.completions()
	r.advance(portQuiet)
	r.take(wire.TypeProbe)
	p.pathRR, p.tx.burst = 1, 1
	r.post(5, efaio.OpSend, 100)
	if d := r.data(); len(d) != 1 || d[0].h.Path != 0 {
		t.Fatalf("sent %+v after %v of silence, want one DATA on path 0", d, portQuiet)
	}
	if probes := r.take(wire.TypeProbe); len(probes) != 1 || probes[0].h.Path != 1 {
		t.Fatalf("probes %+v after %v of silence, want one on path 1", probes, portQuiet)
	}
}

// wire.md "Address validation": a challenge to a port that is none of ours (another process of
// our host sent the peer a datagram from a port of its own, naming us) is only echoed: nothing is
// sent again for it, however many come, and it does not displace the echo of a challenge to one
// of our ports. Before, each such challenge sent the whole flight again.
func TestTraceForeignPortChallengeResendsNothing(t *testing.T) {
	r := newTrace(t, 2, nil)
	ports := []uint16{traceDev.Port(), 4800}
	r.tr.ports = ports
	r.hear()
	for i := range 20 {
		r.post(uint16(i), efaio.OpSend, 1000)
	}
	if n := len(r.data()); n != 20 {
		t.Fatalf("sent %d DATA frames, want 20", n)
	}
	r.send(0, func(b []byte) []byte { return wire.AppendChallenge(b, 0x1234567, ports[1]) }) // one of ours
	r.got = nil
	for k := range 10 {
		r.send(0, func(b []byte) []byte { return wire.AppendChallenge(b, 0x1001+uint64(2*k), 50000+uint16(k%2)) })
		if d := r.data(); len(d) != 0 {
			t.Fatalf("challenge %d to a port not ours sent PSNs %v again", k, psns(d))
		}
	}
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if e := p.echo[1]; e.cookie != 0x1234567 || e.port != ports[1] {
		t.Fatalf("path 1 echoes cookie %#x for port %d, want %#x for port %d", e.cookie, e.port, 0x1234567, ports[1])
	}
}

// wire.md "Address validation": a peer that restarted knows none of our ports, and one we timed
// out on may have forgotten them: the paths other than the endpoint's prove themselves again.
// After a second with nothing sent to the peer, an ACK goes on the endpoint's path too.
func TestTracePathsProveThemselvesAgain(t *testing.T) {
	for _, why := range []string{"restart", "timeout", "quiet"} {
		r := newTrace(t, 2, nil)
		ports := []uint16{traceDev.Port(), 4800}
		r.tr.ports = ports
		r.meet()
		r.post(1, efaio.OpSend, 100)
		r.ack(1, nil, 0)
		r.completions()
		p := r.tr.peers[config.GIDFromAddr(tracePeer)]
		probes := r.take(wire.TypeProbe)
		if len(probes) == 0 {
			t.Fatalf("%s: no PROBE on the new path", why)
		}
		r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, probes[0].f.Nonce, true) })
		if p.paths[1].unproven {
			t.Fatalf("%s: the PROBE_ACK did not prove path 1", why)
		}
		switch why {
		case "restart":
			r.inc = 0x600d
			r.send(0, func(b []byte) []byte { return wire.AppendAck(b, &wire.Ack{}) })
		case "timeout":
			r.post(2, efaio.OpSend, 100)
			r.advance(1500 * time.Millisecond) // the trace's transport timeout is 1 s
			r.completions()
		case "quiet":
			r.advance(portQuiet)
			r.recv(9)
			r.got = nil
			r.send(0, r.sendFrame("x"))
			if acks := r.take(wire.TypeAck); len(acks) == 0 || acks[0].h.Path != 0 {
				t.Fatalf("quiet: ACKs %+v, want one on path 0", acks)
			}
		}
		if !p.paths[1].unproven {
			t.Fatalf("%s: path 1 is still in use", why)
		}
	}
}

// wire.md "PROBE": a probe's nonce stays until it is answered, so that a path whose round trip is
// longer than the probing interval proves itself (before, each probe drew a new nonce and
// refused the answers to the ones before).
func TestTraceSlowPathProvesItself(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.tr.ports = []uint16{traceDev.Port(), 4800}
	r.meet()
	r.post(1, efaio.OpSend, 100)
	r.ack(1, nil, 0)
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	r.post(2, efaio.OpSend, 100) // (something outstanding: unproven paths are probed for a stream)
	first := r.take(wire.TypeProbe)
	if len(first) == 0 {
		t.Fatal("no PROBE")
	}
	r.advance(3 * probeInterval / 2) // the answer takes longer than the interval
	r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, first[0].f.Nonce, true) })
	if p.paths[1].unproven {
		t.Fatalf("the answer to a PROBE %v old did not prove the path", 3*probeInterval/2)
	}
}

// wire.md "Address validation": a device that only receives a peer's stream proves its paths too
// (its ACKs rotate over the paths the peer knows): without that, every ACK took the endpoint's
// path, and a network that lost that path lost them all (bench's bw-8KiB-4paths-1down timed out).
func TestTraceReceiverProvesItsPaths(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.tr.ports = []uint16{traceDev.Port(), 4800}
	r.meet()
	r.recv(1)
	r.peerData(wire.Data{Op: wire.OpSend, Length: 1, DstQPN: 9, QKey: 0x77, Payload: []byte{1}})
	r.wantCompletion(1, efaio.StatusOK)
	r.advance(time.Millisecond)
	if probes := r.take(wire.TypeProbe); len(probes) == 0 || probes[0].h.Path != 1 {
		t.Fatalf("probes %+v from a device that only receives, want one on path 1", probes)
	}
}

// sendFrame returns a frame adder for a SEND of payload to the trace's receive QP, at the peer's
// next PSN.
func (r *trace) sendFrame(payload string) func([]byte) []byte {
	return func(b []byte) []byte {
		d := wire.Data{PSN: r.next, Op: wire.OpSend, Length: uint32(len(payload)), DstQPN: 9, QKey: 0x77,
			Payload: []byte(payload)}
		r.next++
		return wire.AppendData(b, &d)
	}
}

// sendFrom delivers a datagram of the peer from UDP source from as incarnation inc (its header
// naming the peer's endpoint), with a COOKIE of cookie for from's port first if cookie is not 0,
// and lets the transport handle it.
func (r *trace) sendFrom(from netip.AddrPort, inc uint32, cookie uint64, add func([]byte) []byte) {
	h := wire.Header{SrcPort: tracePeer.Port(), SrcInc: inc, DstInc: r.tr.inc, TxEpoch: r.epoch, RxEpoch: r.devTx}
	b := wire.AppendHeader(nil, &h)
	if cookie != 0 {
		b = wire.AppendCookie(b, cookie, []uint16{from.Port()})
	}
	b = add(b)
	wire.PutChecksum(b)
	r.f.Inject(from, traceDev, b)
	r.drive()
}

// provePort proves the peer's UDP source port port to the transport as a peer would: a datagram
// from it is challenged, and the cookie comes back from it. It returns the cookie.
func (r *trace) provePort(port netip.AddrPort) uint64 {
	r.t.Helper()
	r.sendFrom(port, r.inc, 0, func(b []byte) []byte { return wire.AppendAck(b, &wire.Ack{}) })
	ch := r.take(wire.TypeChallenge)
	if len(ch) != 1 || ch[0].f.Port != port.Port() {
		r.t.Fatalf("challenges %+v, want one naming port %d", ch, port.Port())
	}
	r.sendFrom(port, r.inc, ch[0].f.Cookie, func(b []byte) []byte { return wire.AppendAck(b, &wire.Ack{}) })
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if p == nil || !p.trusts(port.Port(), tracePeer.Port(), r.f.Now()) {
		r.t.Fatalf("port %d not proven by its cookie", port.Port())
	}
	return ch[0].f.Cookie
}

// The backlog counts only answers: a device with more than maxBacklog requests of its own queued
// to a peer still takes the peer's requests (two devices that each queue many for the other
// would otherwise refuse each other's for ever).
func TestTraceOwnRequestsAreNoBacklog(t *testing.T) {
	r := newTrace(t, 1, nil)
	r.meet()
	gid := config.GIDFromAddr(tracePeer)
	r.batch(r.q, func(now time.Duration) {
		for i := range maxBacklog + 100 {
			req := Request{Op: wire.OpSend, DstQPN: 9, QKey: 0x77, Length: 8, NSrc: 1}
			req.Src[0] = mem.Own(r.buf[:8])
			if _, st := r.tr.Request(now, gid, &req, uint16(i)); st != efaio.StatusOK {
				t.Fatalf("request %d: status %d", i, st)
			}
		}
	})
	p := r.tr.peers[gid]
	if len(p.tx.queue) < maxBacklog {
		t.Fatalf("%d of our requests queued, want at least %d", len(p.tx.queue), maxBacklog)
	}
	drops := r.tr.counts.RxDrops.Load()
	r.host.mem = make([]byte, 8)
	r.peerData(wire.Data{Op: wire.OpReadReq, MsgID: 1, Length: 8, SrcQPN: 3, DstQPN: 3})
	if r.tr.counts.RxDrops.Load() != drops || p.rx.cum != r.next {
		t.Fatalf("the peer's READ_REQ was refused behind our own %d requests", len(p.tx.queue))
	}
}

// wire.md "Frames" (RESP): a RESP's status byte is one a responder sends, or the WR fails with
// REMOTE_BAD_STATUS: a hostile peer cannot complete a WR with a local status, or with a byte that
// is no EFA status at all (255 is the device's own "on the network" mark).
func TestTraceRespStatusChecked(t *testing.T) {
	for _, c := range []struct {
		sent uint8
		want efaio.Status
	}{
		{uint8(efaio.StatusRemoteBadLength), efaio.StatusRemoteBadLength},
		{uint8(efaio.StatusFlushed), efaio.StatusRemoteBadStatus},
		{uint8(efaio.StatusLocalInvalidLKey), efaio.StatusRemoteBadStatus},
		{uint8(efaio.StatusLocalUnrespRemote), efaio.StatusRemoteBadStatus},
		{255, efaio.StatusRemoteBadStatus},
	} {
		r := newTrace(t, 2, nil)
		r.post(1, efaio.OpRDMAWrite, 100)
		d := r.data()
		r.horizon = 1
		r.ack(1, nil, d[0].h.Path)
		r.peerData(wire.Data{Op: wire.OpResp, MsgID: d[0].f.Data.MsgID, Status: c.sent})
		r.wantCompletion(1, c.want)
	}
}

// wire.md "Frames" (ABORT): ABORTs that overtake earlier PSNs are remembered, however many, until
// the cumulative point passes each; here 3,000 of them wait behind one missing PSN, a segment of
// one of their messages arriving after its ABORT is dropped, and when the hole is filled they are
// all forgotten at once.
func TestTraceManyAbortsPastAHole(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.recv(7)
	const n = 3000
	for i := uint32(1); i <= n; i++ {
		ab := wire.Data{PSN: wire.PSN(i), Op: wire.OpAbort, MsgID: 100 + i}
		r.inject(uint8(i%2), func(b []byte) []byte { return wire.AppendData(b, &ab) })
		if i%64 == 0 {
			r.drive()
		}
	}
	r.drive()
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if len(p.rx.aborted) != n || len(p.rx.abortQ) != n {
		t.Fatalf("%d ABORTs remembered (%d queued), want %d", len(p.rx.aborted), len(p.rx.abortQ), n)
	}
	late := wire.Data{PSN: n + 1, Op: wire.OpSend, MsgID: 100 + n/2, Length: 30, Offset: 10, DstQPN: 3,
		QKey: traceQKey, Payload: make([]byte, 10)}
	r.send(0, func(b []byte) []byte { return wire.AppendData(b, &late) })
	if len(p.rx.in) != 0 || len(r.host.recvs) != 1 {
		t.Fatalf("%d messages held, %d receives left after a segment behind its ABORT; want none held, WR 7 posted",
			len(p.rx.in), len(r.host.recvs))
	}
	hole := wire.Data{PSN: 0, Op: wire.OpAbort, MsgID: 99}
	r.send(1, func(b []byte) []byte { return wire.AppendData(b, &hole) })
	if p.rx.cum != n+2 {
		t.Fatalf("cumulative point %d, want %d", p.rx.cum, n+2)
	}
	if len(p.rx.aborted) != 0 || len(p.rx.abortQ) != 0 {
		t.Errorf("%d ABORTs still remembered (%d queued) with the stream complete", len(p.rx.aborted), len(p.rx.abortQ))
	}
}

// Messages in part are bounded across peers too (maxHeld): with the device's count at the bound,
// a segment that would start one more is dropped and answered, and the count follows what is held.
func TestTraceMessagesInPartAreBoundedAcrossPeers(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.tr.held = maxHeld - 1 // (as if other peers held the rest)
	for id := range uint32(2) {
		r.peerData(wire.Data{Op: wire.OpWrite, MsgID: id, Length: 30, Payload: make([]byte, 10)})
	}
	if n := len(r.tr.peers[config.GIDFromAddr(tracePeer)].rx.in); n != 1 || r.tr.held != maxHeld {
		t.Fatalf("%d messages held in part (device count %d), want 1 (%d)", n, r.tr.held, maxHeld)
	}
	if got := r.counts.RxDrops.Load(); got != 1 || len(r.data()) != 1 {
		t.Errorf("%d segments dropped, want the one past the bound, answered with a RESP", got)
	}
	r.peerData(wire.Data{Op: wire.OpAbort, MsgID: 0})
	if r.tr.held != maxHeld-1 {
		t.Errorf("device count %d after the ABORT, want %d", r.tr.held, maxHeld-1)
	}
}

// wire.md "Forgotten peers": a peer whose stream has a gap (PSNs beyond the cumulative point
// arrived) is not forgotten while its sender may still fill it, since its memo keeps only the
// cumulative point: forgotten, a PSN sent again would complete a second time. Once the peer has
// been quiet past twice the transport timeout (its sender has moved to a new epoch, or is gone),
// the gap is dropped and the peer forgotten.
func TestTracePeerWithGapIsKept(t *testing.T) {
	r := newTrace(t, 2, func(c *config.Device) { c.PeerIdleTimeout = time.Second; c.TransportTimeout = 2 * time.Second })
	r.meet()
	r.recv(7)
	r.recv(8)
	send := wire.Data{PSN: 1, Op: wire.OpSend, MsgID: 2, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)}
	r.send(0, func(b []byte) []byte { return wire.AppendData(b, &send) }) // PSN 0 is still to come
	r.wantCompletion(7, efaio.StatusOK)
	r.advance(2 * time.Second) // past the idle timeout, not the quiet time (4 s)
	if _, ok := r.tr.peers[config.GIDFromAddr(tracePeer)]; !ok {
		t.Fatal("the peer was forgotten with a gap in its stream")
	}
	r.send(1, func(b []byte) []byte { return wire.AppendData(b, &send) }) // sent again (its ACK was lost)
	r.noCompletion()
	r.advance(5 * time.Second) // quiet past 4 s since that
	if _, ok := r.tr.peers[config.GIDFromAddr(tracePeer)]; ok {
		t.Fatal("the peer is still remembered, quiet past twice the transport timeout")
	}
	// It comes back in the same epoch, its PSN 0 at last: answered as stale, nothing delivered.
	r.meet()
	r.peerData(wire.Data{Op: wire.OpSend, MsgID: 1, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	r.noCompletion()
	if got := r.counts.StalePackets.Load(); got == 0 {
		t.Error("DATA of the given-up epoch was not counted stale")
	}
}

// A message may have several ABORTs (a lost segment of a cancelled message goes again as one, and
// the ABORT after its last segment follows): the receiver forgets it only once the cumulative
// point passes the latest. Here X's segments are PSNs 2 and 3, its ABORTs PSNs 1 (a segment sent
// again) and 4, and PSN 0 another message's; with PSNs 0 and 1 in, X's segments arriving after
// must still be dropped.
func TestTraceMessageForgottenAtItsLatestAbort(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.recv(7)
	abort := func(psn wire.PSN, id uint32) {
		ab := wire.Data{PSN: psn, Op: wire.OpAbort, MsgID: id}
		r.send(1, func(b []byte) []byte { return wire.AppendData(b, &ab) })
	}
	seg := func(psn wire.PSN, off uint32) {
		d := wire.Data{PSN: psn, Op: wire.OpSend, MsgID: 5, Length: 30, Offset: off, DstQPN: 3, QKey: traceQKey,
			Payload: make([]byte, 10)}
		r.send(0, func(b []byte) []byte { return wire.AppendData(b, &d) })
	}
	abort(4, 5)
	abort(1, 5)
	abort(0, 9) // the cumulative point moves past X's first ABORT
	seg(2, 10)
	seg(3, 20)
	p := r.tr.peers[config.GIDFromAddr(tracePeer)]
	if len(p.rx.in) != 0 || len(r.host.recvs) != 1 {
		t.Fatalf("%d messages held, %d receives left; want none held and WR 7 still posted", len(p.rx.in), len(r.host.recvs))
	}
	r.noCompletion()
	if p.rx.cum != 5 || len(p.rx.aborted) != 0 || len(p.rx.abortQ) != 0 {
		t.Errorf("cumulative point %d, %d ABORTs remembered (%d queued); want 5, none", p.rx.cum, len(p.rx.aborted), len(p.rx.abortQ))
	}
}

// congestion.md "Loss detection" (timer): a retransmission timeout sends no data; it PINGs the
// peer. A peer held up (it answers nothing) that then acknowledges everything gets nothing twice,
// and the timeout counts as spurious.
func TestTraceTimeoutPingsAHeldUpPeer(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample() // the timer at 3 ms
	r.heldUp = true
	for i := range 8 {
		r.post(uint16(1+i), efaio.OpSend, 100)
	}
	sent := r.data()
	r.awaitPing()
	if p.tx.rtoAt == 0 {
		t.Fatal("a PING with the timer not fired")
	}
	r.advance(3 * time.Millisecond) // before the timer fires again (6 ms)
	r.ack(9, nil, sent[7].h.Path)   // the peer wakes: everything arrived
	if cs := r.completions(); len(cs) != 8 {
		t.Fatalf("%d completions, want 8", len(cs))
	}
	r.advance(50 * time.Millisecond)
	if d := r.data(); len(d) != 0 {
		t.Fatalf("sent PSNs %v again", psns(d))
	}
	if n, to, sp := r.counts.RetransPkts.Load(), r.counts.RetransTimeoutEvents.Load(), r.counts.SpuriousTimeouts.Load(); n != 0 || to != 1 || sp != 1 || r.pings != 1 {
		t.Fatalf("%d packets sent again, %d timeouts (%d spurious), %d PINGs: want 0, 1 (1), 1", n, to, sp, r.pings)
	}
}

// congestion.md "Loss detection" (timer): a PING answered with nothing acknowledged (the
// acknowledgement rides in front of the PROBE_ACK) shows the packet lost: it goes again at once,
// on another path, and counts as a loss.
func TestTraceTimeoutPongResendsAtOnce(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	cwnd := p.tx.cwnd
	r.post(1, efaio.OpSend, 100)
	sent := r.data()
	r.awaitPing()
	pinged := r.f.Now()
	again := r.awaitData()
	if len(again) != 1 || again[0].f.Data.PSN != 1 || again[0].h.Path == sent[0].h.Path || r.f.Now()-pinged > 200*time.Microsecond {
		t.Fatalf("after the PONG (%v after the PING) sent %v on path %d (first on %d): want PSN 1 once, at once, on the other path",
			r.f.Now()-pinged, psns(again), again[0].h.Path, sent[0].h.Path)
	}
	r.advance(time.Millisecond)
	r.ack(2, nil, again[0].h.Path)
	r.wantCompletion(1, efaio.StatusOK)
	if p.tx.cwnd >= cwnd || p.tx.lossRate == 0 {
		t.Fatalf("window %v (from %v), loss rate %v: a loss shown by a PING's answer not counted", p.tx.cwnd, cwnd, p.tx.lossRate)
	}
}

// congestion.md "Loss detection" (timer): a peer that answers no PING gets maxPings of them, the
// timer backing off each time; the next expiry sends the data, on two paths.
func TestTraceUnansweredPingsThenData(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.rttSample()
	r.heldUp = true
	r.post(1, efaio.OpSend, 100)
	r.data()
	var at []time.Duration
	for len(at) < maxPings {
		r.awaitPing()
		at = append(at, r.f.Now())
	}
	if at[2]-at[1] < 2*(at[1]-at[0])-200*time.Microsecond {
		t.Fatalf("PINGs at %v: the timer did not back off", at)
	}
	d := r.awaitData()
	if len(d) != 2 || d[0].f.Data.PSN != 1 || d[1].f.Data.PSN != 1 || d[0].h.Path == d[1].h.Path || r.pings != maxPings {
		t.Fatalf("after %d PINGs sent %v: want PSN 1 on both paths, and no PING", r.pings, psns(d))
	}
}

// wire.md "PROBE": a PROBE from a peer whose stream the device has is answered with the stream's
// ACK in front of the PROBE_ACK, in the same datagram, so that the peer's timer, which PINGs, can
// tell a loss from a late acknowledgement.
func TestTraceProbeAnsweredWithTheAck(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.meet()
	r.recv(1)
	r.peerData(wire.Data{Op: wire.OpSend, Length: 10, DstQPN: 3, QKey: traceQKey, Payload: make([]byte, 10)})
	r.take(wire.TypeAck)
	r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, 42, false) })
	ackFirst := len(r.got) == 2 && r.got[0].f.Type == wire.TypeAck && r.got[1].f.Type == wire.TypeProbeAck
	acks, answers := r.take(wire.TypeAck), r.take(wire.TypeProbeAck)
	if !ackFirst || len(acks) != 1 || len(answers) != 1 || acks[0].dgram != answers[0].dgram || acks[0].f.Ack.Cum != r.next {
		t.Fatalf("ACKs %+v, PROBE_ACKs %+v: want the ACK of PSN %d in front of the PROBE_ACK, in its datagram", acks, answers, r.next-1)
	}
}

// congestion.md "Loss detection" (timer): a loss shown by a PING's answer is a loss: a packet
// sent after the timer fired and acknowledged with the packet sent again does not make the
// timeout spurious (nor raise the timer's floor, as a stall would).
func TestTraceLossShownByPongIsNoStall(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	r.heldUp = true
	r.post(1, efaio.OpSend, 100)
	r.data() // lost
	r.awaitPing()
	r.advance(300 * time.Microsecond)
	r.post(2, efaio.OpSend, 100) // after the timer fired, before the answer
	if d := r.data(); len(d) != 1 {
		t.Fatalf("PSN 2 went as %v", psns(d))
	}
	r.advance(500 * time.Microsecond)
	nonce := pingNonce(p.tx.rtoLine)
	r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, nonce, true) }) // nothing of PSN 1
	again := r.data()
	if len(again) != 1 || again[0].f.Data.PSN != 1 {
		t.Fatalf("after the PING's answer sent %v, want PSN 1", psns(again))
	}
	r.advance(time.Millisecond)
	r.ack(3, nil, again[0].h.Path)
	if sp := r.counts.SpuriousTimeouts.Load(); sp != 0 || r.tr.stallFloor != 0 {
		t.Fatalf("a loss shown by a PING's answer counted as %d spurious timeouts, timer floor %v", sp, r.tr.stallFloor)
	}
}

// congestion.md "Loss detection" (timer): the timer's round ends when nothing is left
// outstanding, also without an acknowledgement (a request the peer answered, its ACK lost): the
// next message's timer PINGs first again.
func TestTraceTimerRoundEndsWhenIdle(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	r.post(1, efaio.OpRDMARead, 100)
	req := r.data()
	r.awaitData() // the timer's PING answered with nothing: the READ_REQ again
	r.peerData(wire.Data{Op: wire.OpReadResp, MsgID: req[0].f.Data.MsgID, Length: 100, Payload: make([]byte, 100)})
	r.take(wire.TypeAck) // lost
	r.advance(20 * time.Millisecond)
	r.wantCompletion(1, efaio.StatusOK)
	if p.tx.busy() || p.tx.rtoAt != 0 || p.tx.ponged {
		t.Fatalf("idle %v, timer fired at %v, answered %v: want the round over", !p.tx.busy(), p.tx.rtoAt, p.tx.ponged)
	}
	r.heldUp = true
	r.post(2, efaio.OpSend, 100)
	r.data()
	r.awaitPing()
}

// congestion.md "Loss detection" (timer): a lost packet (both its copies: copies on, whose
// acknowledgements credit no path, so no acknowledgement rule reveals the loss) while later
// packets keep being acknowledged: it goes again, and the acknowledgements after the timer fired
// of packets sent since (not of packets that had waited) are no sign of a stall: no spurious
// timeout, no higher timer floor. A real peer answers each PING with its ACK in front. (When
// such acknowledgements ended the timer's round as a stall, a timer that PINGed in a stream with
// copies on PINGed at every tick and the packet never went again while the trickle lasted.)
func TestTraceLossAmidAcknowledgedTrickle(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	p.tx.lossRate, p.tx.lossAt = 0.01, r.f.Now() // copies on
	r.post(1, efaio.OpSend, 100)
	if d := r.data(); len(d) != 2 || d[0].f.Data.PSN != 1 {
		t.Fatalf("PSN 1 went as %v, want two copies", psns(d))
	}
	// The peer's view: PSN 1 missing, the later ones as they arrive, a round trip of 200 µs.
	var sent, have []wire.PSN
	ack := func() wire.Ack {
		a := wire.Ack{Cum: 1}
		for _, q := range have {
			i := q - 2
			a.Sack[i/64] |= 1 << (i % 64)
			a.Highest = max(a.Highest, q)
		}
		return a
	}
	var pings []uint32
	r.onPing = func(n uint32) { pings = append(pings, n) }
	start, again := r.f.Now(), time.Duration(0)
	look := func() {
		for _, d := range r.data() {
			if psn := d.f.Data.PSN; psn == 1 && again == 0 {
				again = r.f.Now() - start
			} else if psn != 1 && !slices.Contains(sent, psn) {
				sent = append(sent, psn)
			}
		}
	}
	for k := 0; again == 0 && r.f.Now()-start < 20*time.Millisecond && len(have) < 200; k++ { // (an ACK's bits reach 256 PSNs)
		r.advance(100 * time.Microsecond)
		r.post(uint16(2+k), efaio.OpSend, 100)
		look()
		if len(sent) > 2 {
			have = sent[:len(sent)-2]
		}
		for _, n := range pings {
			a := ack()
			r.inject(0, func(b []byte) []byte { return wire.AppendProbe(wire.AppendAck(b, &a), n, true) })
		}
		pings = nil
		a := ack()
		r.send(0, func(b []byte) []byte { return wire.AppendAck(b, &a) })
		look()
	}
	if again == 0 || again > 5*time.Millisecond {
		t.Fatalf("PSN 1, lost, sent again after %v of acknowledged traffic (0: not at all); %d PINGs, %d spurious timeouts, timer floor %v",
			again, r.pings, r.counts.SpuriousTimeouts.Load(), r.tr.stallFloor)
	}
	if n := r.counts.SpuriousTimeouts.Load(); n != 0 || r.tr.stallFloor != 0 {
		t.Fatalf("%d spurious timeouts, timer floor %v: acknowledgements of later packets taken for a stall", n, r.tr.stallFloor)
	}
}

// congestion.md "Loss detection" (timer): a round's packet goes again once however many of its
// PINGs are answered.
func TestTracePongOnceARound(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	r.heldUp = true
	r.post(1, efaio.OpSend, 100)
	r.data()
	r.awaitPing()
	r.awaitPing()
	n := pingNonce(p.tx.rtoLine)
	r.inject(0, func(b []byte) []byte { return wire.AppendProbe(b, n, true) })
	r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, n, true) })
	r.advance(200 * time.Microsecond)
	if d := r.data(); len(d) != 1 {
		t.Fatalf("two answers of one round sent %v, want PSN 1 once", psns(d))
	}
}

// congestion.md "Loss detection" (timer): a round ended by an acknowledgement of what waited (a
// stall) leaves the next timeout to PING first again.
func TestTraceRoundEndedByAckPingsAgain(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.rttSample()
	r.heldUp = true
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	r.awaitPing()
	r.awaitPing()
	r.ack(2, nil, d[0].h.Path) // the peer woke
	r.wantCompletion(1, efaio.StatusOK)
	r.post(2, efaio.OpSend, 100)
	r.data()
	before := r.pings
	r.awaitPing()
	if r.pings != before+1 {
		t.Fatalf("%d PINGs, want one more", r.pings-before)
	}
}

// congestion.md "Loss detection" (timer): a stream that lost packets lately (copies on) does not
// PING: its timer sends the packet at once, once, and again on two paths at its next expiry.
func TestTraceLosingStreamTimerSendsAtOnce(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	p.tx.lossRate, p.tx.lossAt = 0.01, r.f.Now()
	r.heldUp = true
	r.post(1, efaio.OpSend, 100)
	r.data()
	d := r.awaitData()
	if len(d) != 1 || d[0].f.Data.PSN != 1 || r.pings != 0 {
		t.Fatalf("the timer of a losing stream sent %v and %d PINGs, want PSN 1 once and none", psns(d), r.pings)
	}
	d = r.awaitData()
	if len(d) != 2 || d[0].h.Path == d[1].h.Path || r.pings != 0 {
		t.Fatalf("its next expiry sent %v and %d PINGs, want PSN 1 on both paths", psns(d), r.pings)
	}
}

// congestion.md "Loss detection" (timer): the PING goes on the path an ACK would take, a recently
// proven one: here the one path of four whose packet was acknowledged lately, which is neither
// path 0 nor the path of the packet the timer waits for.
func TestTracePingOnAProvenPath(t *testing.T) {
	r := newTrace(t, 4, nil)
	p := r.rttSample() // on path 0: proof that goes stale below
	r.advance(100 * time.Millisecond)
	p.pathRR, p.tx.burst = 2, 0 // the next data burst's path
	r.post(1, efaio.OpSend, 100)
	if d := r.data(); len(d) != 1 || d[0].h.Path != 2 {
		t.Fatalf("WR 1 went as %v, want one packet on path 2", d)
	}
	r.advance(time.Millisecond)
	r.ack(2, nil, 2)
	r.wantCompletion(1, efaio.StatusOK)
	r.heldUp = true
	p.pathRR, p.tx.burst = 3, 0 // WR 2 on path 3: the PING's path is not the data's
	r.post(2, efaio.OpSend, 100)
	if d := r.data(); len(d) != 1 || d[0].h.Path != 3 {
		t.Fatalf("WR 2 went as %v, want one packet on path 3", d)
	}
	r.awaitPing()
	if len(r.pingPaths) != 1 || r.pingPaths[0] != 2 {
		t.Fatalf("PINGs on paths %v, want one on path 2, the one proven", r.pingPaths)
	}
}

// congestion.md "Loss detection" (timer): a PING's answer that comes after the round ended (the
// acknowledgement it waited for came first) sends nothing again, not even the packet sent since.
func TestTraceLatePongAfterTheRoundSendsNothing(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	r.onPing = func(uint32) {} // answered below, late
	r.post(1, efaio.OpSend, 100)
	first := r.data()
	r.awaitPing()
	nonce := pingNonce(p.tx.rtoLine)
	r.ack(2, nil, first[0].h.Path) // the held-up peer's acknowledgement: the round ends
	r.wantCompletion(1, efaio.StatusOK)
	if p.tx.rtoAt != 0 {
		t.Fatal("the timer's round did not end with everything acknowledged")
	}
	r.post(2, efaio.OpSend, 100) // outstanding, well within its timeout
	if d := r.data(); len(d) != 1 {
		t.Fatalf("WR 2 went as %v", psns(d))
	}
	r.send(0, func(b []byte) []byte { return wire.AppendProbe(b, nonce, true) }) // the late answer
	r.advance(500 * time.Microsecond)
	if d := r.data(); len(d) != 0 {
		t.Fatalf("a late PROBE_ACK, nothing acknowledged, sent PSNs %v again", psns(d))
	}
}

// congestion.md "Loss detection" (timer): unanswered PINGs back off as the timer does, at 1, 3 and
// 7 timeouts after the packet went (2, 6 and 14 ms at the least timer), and the data goes at 15
// (30 ms).
func TestTracePingBackoffTimes(t *testing.T) {
	r := newTrace(t, 2, nil)
	p := r.rttSample()
	r.heldUp = true
	r.post(1, efaio.OpSend, 100)
	r.data()
	sent, rto := r.f.Now(), p.tx.rto
	if maxPings != 3 {
		t.Fatalf("maxPings is %d: the times below are for 3", maxPings)
	}
	var at []time.Duration
	for len(at) < maxPings {
		r.awaitPing()
		at = append(at, r.f.Now()-sent)
	}
	r.awaitData()
	at = append(at, r.f.Now()-sent)
	// awaitPing and awaitData step 100 µs at a time, from the packet's sending: each expiry is
	// seen at the first step at or after it (the engine's check of the timer, at every step here,
	// adds nothing), and the next timeout runs from the step that saw it.
	step := 100 * time.Microsecond
	ceil := func(d time.Duration) time.Duration { return (d + step - 1) / step * step }
	var want []time.Duration
	for i, last := 0, time.Duration(0); i < 4; i++ {
		last = ceil(last + rto<<i)
		want = append(want, last)
	}
	for i := range want {
		if at[i] != want[i] {
			t.Fatalf("PINGs then data at %v after the packet (timeout %v): want %v (1, 3, 7 and 15 timeouts, each seen at a 100 µs step)", at, rto, want)
		}
	}
}

// A doorbell's list of requests is framed at the end of its batch (Hold), by one pump of the
// stream: the clock is read once for the pump and once a datagram begun, not once a request.
func TestTraceRequestsOfABatchFramedTogether(t *testing.T) {
	var reads int
	r := newTrace(t, 2, nil)
	r.hear()
	r.tr.cfg.Clock = func() time.Duration { reads++; return r.f.Now() }
	const n = 32
	r.tr.Use(r.q)
	r.queueSends(r.f.Now(), n, 64)
	if r.q.n != 0 {
		t.Errorf("%d datagrams framed before the batch's end", r.q.n)
	}
	r.tr.Hold(r.q)
	datagrams := r.q.n
	if datagrams == 0 {
		t.Errorf("nothing framed at the batch's end")
	}
	r.tr.Flush(r.q)
	if datagrams >= n || reads != 1+datagrams {
		t.Errorf("the clock was read %d times for a list of %d requests in %d datagrams, want %d (fewer datagrams than requests)", reads, n, datagrams, 1+datagrams)
	}
	r.collect()
	if d := r.data(); len(d) != n {
		t.Fatalf("sent %d DATA frames, want %d", len(d), n)
	}
}

// A request cancelled in the batch that made it goes out whole if Frame framed it first (the
// window allows), and not at all if not: cancel drops what is not framed.
func TestTraceFrameBeforeCancel(t *testing.T) {
	for _, frame := range []bool{true, false} {
		r := newTrace(t, 2, nil)
		r.hear()
		r.batch(r.q, func(now time.Duration) {
			req := Request{Op: wire.OpSend, DstQPN: 9, QKey: 0x77, Length: 64}
			req.Src[0], req.NSrc = mem.Own(r.buf[:64]), 1
			m, st := r.tr.Request(now, config.GIDFromAddr(tracePeer), &req, uint16(1))
			if st != efaio.StatusOK {
				t.Fatalf("request: status %d", st)
			}
			if frame {
				r.tr.Frame(now)
			}
			r.tr.Cancel(m)
		})
		r.collect()
		want := 0
		if frame {
			want = 1
		}
		if d := r.data(); len(d) != want {
			t.Errorf("Frame %v: %d DATA frames sent, want %d", frame, len(d), want)
		}
	}
}

// congestion.md loss rules, with the batch's requests framed by one pump (Hold): a pump reads
// the clock again for each datagram it begins, so that a long list is not stamped with the time
// its framing began. With one reading for a whole list, bench's bw-8KiB (lists of 64 8 KiB
// SENDs) retransmitted 85-353 packets a run that were never lost, its last packets stamped tens
// of microseconds early; and rate-64B-loaded (several lists of small SENDs in one step, several
// datagrams under one stamp) 63-252. The clock here moves a microsecond a reading, as framing
// takes time.
func TestTraceDatagramsStampedWhenBegun(t *testing.T) {
	for _, size := range []int{8 << 10, 64} {
		var reads int
		r := newTrace(t, 2, nil)
		r.hear()
		r.tr.cfg.Clock = func() time.Duration { reads++; return r.f.Now() + time.Duration(reads)*time.Microsecond }
		const n = 32
		r.tr.Use(r.q)
		r.queueSends(r.f.Now(), n, size)
		r.tr.Hold(r.q)
		datagrams := r.q.n
		s := &r.tr.peers[config.GIDFromAddr(tracePeer)].tx
		stamps := map[time.Duration]bool{}
		for psn := s.una; psn != s.next; psn++ {
			stamps[s.slot(psn).at] = true
		}
		r.tr.Flush(r.q)
		if datagrams < 2 {
			t.Fatalf("%d-byte SENDs: %d datagrams, want a list longer than one", size, datagrams)
		}
		if len(stamps) != datagrams || reads != datagrams+1 {
			t.Errorf("%d-byte SENDs: %d datagrams, %d stamps, %d clock readings; want a stamp a datagram, read when it was begun (and one reading for the pump)",
				size, datagrams, len(stamps), reads)
		}
	}
}

// congestion.md "Reliability" (Acknowledgements): an ACK covers whole datagrams of the peer's.
// What a datagram's frames set going is framed once the batch is handled (answers: RNR RESPs to
// SENDs with no receive posted, read data to READ_REQs; what an ACK frame after DATA frames lets
// out of the window), and the resend a PROBE_ACK answering the timer's PING makes goes after the
// datagram's frames: an ACK riding with any of it covers every frame of the datagram, and its
// horizon lies above every RESP. Framed at the frame that set it going, the first answer carried
// an ACK of the datagram's frames up to that one, and the peer, whose stamp for the whole datagram
// was the same, counted the rest lost. An ACK frame at the head of a datagram lets data out at
// once, before the datagram's DATA: no ACK of that datagram rides with it.
func TestTraceAnswersAckWholeDatagrams(t *testing.T) {
	for _, c := range []struct {
		name     string
		op       wire.Op
		lazy     bool // taken by a busy poll, which leaves the ACK owed
		ackAt    int  // where an ACK of ours goes among the datagram's 4 DATA frames (-1: none)
		pong     bool // a PROBE_ACK answering the timer's PING goes between the DATA frames
		atOnce   bool // what the datagram lets out goes before its DATA is handled
		answered bool // each DATA frame is answered
	}{
		{name: "SEND, no receive", op: wire.OpSend, ackAt: -1, answered: true},
		{name: "SEND, no receive, busy poll", op: wire.OpSend, ackAt: -1, answered: true, lazy: true},
		{name: "READ_REQ", op: wire.OpReadReq, ackAt: -1, answered: true},
		{name: "ACK after DATA", op: wire.OpSend, ackAt: 2},
		{name: "ACK after DATA, busy poll", op: wire.OpSend, ackAt: 2, lazy: true},
		{name: "ACK at the head", op: wire.OpSend, ackAt: 0, atOnce: true},
		{name: "PING answered", op: wire.OpSend, ackAt: -1, pong: true},
	} {
		r := newTrace(t, 2, nil)
		var mid []byte // what goes among the datagram's DATA frames
		switch {
		case c.ackAt >= 0:
			// More requests than the initial window: the ACK in the datagram lets the rest out.
			r.hear()
			r.batch(r.q, func(now time.Duration) { r.queueSends(now, 2*initialCwnd, 64) })
			r.collect()
			d := r.data()
			if len(d) == 0 || len(d) >= 2*initialCwnd {
				t.Fatalf("%s: %d of %d requests sent at once, want the window's", c.name, len(d), 2*initialCwnd)
			}
			mid = wire.AppendAck(nil, &wire.Ack{Cum: d[len(d)-1].f.Data.PSN + 1, Highest: d[len(d)-1].f.Data.PSN, Path: d[0].h.Path})
		case c.pong:
			r.rttSample()
			var nonce uint32
			r.onPing = func(n uint32) { nonce = n }
			r.post(1, efaio.OpSend, 100)
			r.data()
			r.awaitPing()
			mid = wire.AppendProbe(nil, nonce, true)
		default:
			r.hear()
		}
		if !c.answered {
			for i := range 4 {
				r.recv(uint16(100 + i))
			}
		}
		const n = 4
		at := n / 2 // (the PROBE_ACK's place)
		if c.ackAt >= 0 {
			at = c.ackAt
		}
		first := r.next
		r.inject(0, func(b []byte) []byte {
			for i := range n {
				if i == at {
					b = append(b, mid...)
				}
				d := wire.Data{PSN: r.next, MsgID: uint32(r.next), Op: c.op, Length: 10, DstQPN: 3, QKey: traceQKey}
				if c.op == wire.OpSend {
					d.Payload = make([]byte, 10)
				}
				b = wire.AppendData(b, &d)
				r.next++
			}
			return b
		})
		if c.lazy {
			r.busyPoll()
			r.advance(time.Millisecond) // the owed ACK's delay
		} else {
			r.drive()
		}
		sent := r.data()
		acks := r.take(wire.TypeAck)
		if len(acks) == 0 || len(sent) == 0 {
			t.Fatalf("%s: %d ACKs and %d DATA frames sent, want some of each", c.name, len(acks), len(sent))
		}
		for _, a := range acks {
			if a.f.Ack.Cum != first+n {
				t.Errorf("%s: an ACK with cumulative point %d, want %d: every ACK covers the whole datagram", c.name, a.f.Ack.Cum, first+n)
			}
		}
		riding := slices.ContainsFunc(acks, func(a traceFrame) bool {
			return slices.ContainsFunc(sent, func(d traceFrame) bool { return d.dgram == a.dgram })
		})
		switch {
		case c.atOnce && riding:
			t.Errorf("%s: an ACK of the datagram rides with what its head's ACK let out, want that sent at once", c.name)
		case !c.atOnce && !riding:
			t.Errorf("%s: no ACK rides with what the datagram set going", c.name)
		}
		answers := 0
		for _, d := range sent {
			switch d.f.Data.Op {
			case wire.OpResp:
				answers++
				for _, a := range acks { // (an answered SEND's message id is its PSN)
					if covers := wire.PSN(d.f.Data.MsgID).Less(a.f.Ack.Cum); covers && (!a.f.Ack.HasHorizon || !d.f.Data.PSN.Less(a.f.Ack.Horizon)) {
						t.Errorf("%s: an ACK with horizon %d (%v) covers the SEND the RESP at PSN %d answers", c.name, a.f.Ack.Horizon, a.f.Ack.HasHorizon, d.f.Data.PSN)
					}
				}
			case wire.OpReadResp:
				answers++
			}
		}
		if want := map[bool]int{true: n}[c.answered]; answers != want {
			t.Errorf("%s: %d answers, want %d", c.name, answers, want)
		}
	}
}
