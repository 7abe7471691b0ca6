package srd

import (
	"slices"

	"github.com/softefa/softefa/efaio"
)

// completeReq finishes a request with st: its owner is told (mayRetry: an RNR it may try again)
// and it leaves its stream's request table.
func (t *Transport) completeReq(m *Msg, st efaio.Status, mayRetry bool) {
	m.p.tx.reqs.remove(m.hdr.MsgID)
	m.p.tx.unwait(m)
	m.done = true
	m.answered = true
	if o := m.owner; o != nil {
		m.owner = nil
		t.host.Done(t.now, o, st, mayRetry)
	}
	t.release(m)
}

// cancel detaches a request from its owner, whose queue pair was flushed: it stops waiting for
// an answer, its segments not yet sent are dropped and, if the responder may hold part of it, one
// ABORT frame tells it to let go. A request none of whose segments was framed yet (one queued in
// this batch before Hold or Frame, or one the window held back) is dropped whole.
func (t *Transport) cancel(m *Msg) {
	m.owner = nil
	m.p.tx.reqs.remove(m.hdr.MsgID) // an answer, if one comes, finds nothing
	m.p.tx.unwait(m)
	m.done = true
	if m.sent < m.nseg {
		partial := m.sent > 0
		old := m.nseg
		m.nseg = m.sent
		if partial {
			m.nseg++ // the ABORT, sent as the message's next segment
		}
		s := &m.p.tx
		s.unsent -= old - m.nseg
		if s.resp && s.next.Less(s.respEnd) {
			s.recountRespEnd() // a RESP queued behind m takes an earlier PSN now
		}
	}
	t.release(m)
}

// recountRespEnd finds where the latest queued RESP will go, from the queue as it stands.
func (s *txStream) recountRespEnd() {
	pos := s.next
	for _, m := range s.queue {
		pos = pos.Add(m.nseg - m.sent)
		if m.kind == kindResp {
			s.respEnd = pos
		}
	}
}

// unwait takes m out of the requests waiting for the peer's horizon.
func (s *txStream) unwait(m *Msg) {
	if !m.waits {
		return
	}
	m.waits = false
	if i := slices.Index(s.waiting, m); i >= 0 {
		s.waiting = slices.Delete(s.waiting, i, i+1)
	}
}

// settle completes the requests waiting for the peer's horizon that have it: the peer's stream
// has arrived up to the horizon its ACK named, and no RESP in it failed them, so they succeeded.
//
// A horizon in an epoch of the peer's stream that the peer has since abandoned (its stream timed
// out) can no longer come; but the peer queued every RESP of its old stream not yet acknowledged
// again at the start of the new one (resetTimeout), so the horizon of any ACK from the new epoch
// lies past every failure it answered: such a request waits for that horizon instead.
func (t *Transport) settle(p *peer) {
	s, r := &p.tx, &p.rx
	for i := 0; i < len(s.waiting); {
		m := s.waiting[i]
		switch {
		case !m.hasHzn || r.started && r.epoch == m.hEpoch && !r.cum.Less(m.horizon):
			t.completeReq(m, efaio.StatusOK, false) // takes it out of waiting
		case r.started && m.hEpoch.Less(r.epoch) && s.hznEpoch == r.epoch:
			m.hasHzn, m.horizon, m.hEpoch = s.hasHzn, s.hzn, s.hznEpoch // looked at again with the new horizon
		default:
			i++
		}
	}
}
