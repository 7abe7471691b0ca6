package engine

import (
	"slices"
	"testing"
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/wire"
)

// Trace tests: each checks one rule of docs/wire.md or docs/congestion.md against one device, the
// test playing its peer (trace_test.go). The rule is named in each test's comment.

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
	r.recv(7, 0, 1000) // the peer's data below lands here
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	r.horizon = 1 // the peer says: PSN 0 of my stream may answer you
	r.ack(1, nil, d[0].h.Path)
	r.noCompletion()
	r.peerData(wire.Data{Op: wire.OpSend, Length: 10, DstQPN: uint16(r.qp.qpn), QKey: traceQKey, Payload: make([]byte, 10)})
	cs := r.completions()
	if len(cs) != 2 || !slices.ContainsFunc(cs, func(c efaio.Completion) bool { return c.ReqID == 1 && c.Status == efaio.StatusOK }) {
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
	for i := range 5 {
		r.post(uint16(i), efaio.OpSend, 100)
		r.advance(100 * time.Microsecond)
	}
	d := r.data()
	if got := psns(d); !slices.Equal(got, []uint32{0, 1, 2, 3, 4}) {
		t.Fatalf("sent PSNs %v", got)
	}
	path := d[0].h.Path
	if got := paths(d); slices.ContainsFunc(got, func(p uint8) bool { return p != path }) {
		t.Fatalf("a burst spread over paths %v", got)
	}
	r.ack(0, []uint32{1, 2, 3, 4}, path)
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

// wire.md "Packet streams": nothing acknowledged for the transport timeout fails the WR with 15
// (the peer never answered) and starts a new stream: tx epoch + 1, PSN 0.
func TestTraceTransportTimeoutStartsNewEpoch(t *testing.T) {
	r := newTrace(t, 2, nil)
	r.post(1, efaio.OpSend, 100)
	d := r.data()
	epoch := d[0].h.TxEpoch
	r.advance(900 * time.Millisecond)
	r.noCompletion()
	r.advance(200 * time.Millisecond)
	r.wantCompletion(1, efaio.StatusLocalUnreachRemote)
	r.data()
	r.post(2, efaio.OpSend, 100)
	d = r.data()
	if len(d) != 1 || d[0].f.Data.PSN != 0 || d[0].h.TxEpoch != epoch+1 {
		t.Fatalf("after the timeout sent PSNs %v in epoch %d, want PSN 0 in epoch %d", psns(d), d[0].h.TxEpoch, epoch+1)
	}
}
