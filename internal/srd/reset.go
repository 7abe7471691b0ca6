package srd

import (
	"cmp"
	"slices"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/wire"
)

// Why a stream is reset (resetTx).
const (
	// resetTimeout: the peer stopped acknowledging for the transport timeout. Every request
	// fails with the given status; our answers not yet acknowledged are queued again in the new
	// stream. RESPs: the peer's requests they fail may be waiting for them, and an ACK of the new
	// stream (whose horizon starts over) must not let those succeed. Read data, whole: the
	// peer's read would otherwise wait for bytes the old stream took with it (reading twice is
	// harmless; the peer counts afresh). They go again after every timeout until acknowledged,
	// to a peer that may be gone for good: correctness first.
	resetTimeout = iota
	// resetRestart: the peer is a new incarnation. Requests its earlier life acknowledged in
	// part or whole, or answered, fail with the given status (REMOTE_ABORT: what happened to
	// them died with it); requests it never acknowledged any of go again, whole, to the new
	// life, since nothing shows the earlier one had them (docs/wire.md, "Incarnations").
	resetRestart
	// resetBehind: the peer has had a later epoch of our stream than ours (we forgot it, our
	// memo of the peer evicted, and started over below it; the peer dropped what we sent as
	// stale). Our answers and read data go again, as after a timeout (the peer's requests
	// wait for them); requests the peer never acknowledged any of go again, whole, as after a
	// restart; the others fail with the given status.
	resetBehind
)

// resetTx abandons p's outgoing stream (why says what happens to its requests and answers) and
// starts it again from PSN 0 in a new epoch, so that the receiver starts afresh too.
func (t *Transport) resetTx(p *peer, st efaio.Status, why int) {
	s := &p.tx
	var answers []wire.Data
	var reads []readAgain
	var carry []*Msg
	// In the order they were sent (not the map's), so that a replayed run completes them alike.
	reqs := s.reqs.all(nil)
	slices.SortFunc(reqs, func(a, b *Msg) int { return cmp.Compare(a.hdr.MsgID-s.nextMsg, b.hdr.MsgID-s.nextMsg) })
	for _, m := range reqs {
		switch {
		case m.owner == nil:
		case why != resetTimeout && m.untouched():
			carry = append(carry, m)
		default:
			t.completeReq(m, st, false)
		}
	}
	for psn := s.una; psn != s.next; psn++ {
		if e := s.slot(psn); e.msg != nil {
			switch m := e.msg; {
			case why == resetRestart || e.acked:
			case m.kind == kindResp:
				answers = append(answers, m.hdr)
			case m.kind == kindReadResp && !m.again && !m.faulted: // (faulted: its RESP is among answers)
				m.again = true // once, whatever number of its segments are out
				reads = append(reads, readAgain{m.hdr, m.src[0], m.region, m.length})
			}
			e.msg.pending = 0
			e.msg.done = true
			e.msg.sent = e.msg.nseg
			t.release(e.msg)
			e.msg = nil
		}
	}
	for _, m := range s.queue {
		switch {
		case why == resetRestart:
		case m.kind == kindResp:
			answers = append(answers, m.hdr)
		case m.kind == kindReadResp && !m.again && !m.faulted:
			reads = append(reads, readAgain{m.hdr, m.src[0], m.region, m.length})
		}
		m.done, m.sent, m.pending, m.inQueue = true, m.nseg, 0, false
		t.release(m)
	}
	epoch := s.epoch + 1
	nextMsg := s.nextMsg
	*s = txStream{}
	s.init()
	s.epoch, s.nextMsg = epoch, nextMsg
	for i := range p.paths {
		p.paths[i] = pathState{}
	}
	t.unprove(p) // a restarted peer knows none of our ports; one that timed out may have forgotten them
	if t.txq != nil && t.txq.cur == p {
		t.txq.cur = nil // what follows is the new stream's: a datagram of its own
	}
	for _, h := range answers {
		o := t.newMsg(p, kindResp)
		o.hdr, o.done, o.withAck = h, true, true
		o.hdr.PSN, o.hdr.Offset = 0, 0
		t.queue(p, o) // all of them before any goes: the horizon an ACK carries lies past them all
	}
	for _, r := range reads {
		o := t.newMsg(p, kindReadResp)
		o.hdr, o.done = r.hdr, true
		o.hdr.PSN, o.hdr.Offset = 0, 0
		o.src[0], o.nsrc, o.region, o.length = r.src, 1, r.region, r.length
		t.queue(p, o)
	}
	if len(answers)+len(reads) > 0 {
		t.pump(p)
	}
	for _, m := range carry {
		t.resend(m)
	}
}

// readAgain is read data to send again in a new stream (resetTimeout).
type readAgain struct {
	hdr    wire.Data
	src    mem.Span
	region any // Host.Live asks again before each segment of the new epoch
	length uint64
}

// untouched reports whether nothing shows that the peer had any of request m: no segment
// acknowledged, no answer, no read data.
func (m *Msg) untouched() bool {
	return !m.answered && !m.waits && m.got == 0 && m.acked() == 0
}

// acked is how many of m's segments handed to the stream were acknowledged.
func (m *Msg) acked() uint32 { return m.sent - uint32(m.pending) }

// resend sends request m again from its start as a new message on its peer's stream (for the
// same owner).
func (t *Transport) resend(m *Msg) {
	p := m.p
	p.tx.reqs.remove(m.hdr.MsgID) // an answer to the old message, if one comes, finds nothing
	p.tx.unwait(m)
	*m = Msg{kind: kindRequest, p: p, owner: m.owner, hdr: m.hdr, src: m.src, nsrc: m.nsrc, length: m.length,
		sink: m.sink}
	m.hdr.MsgID, m.hdr.PSN, m.hdr.Offset = p.tx.nextMsg, 0, 0
	p.tx.nextMsg++
	t.enqueue(p, m)
}
