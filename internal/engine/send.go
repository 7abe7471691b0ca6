package engine

import (
	"errors"
	"sync/atomic"
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/uapi"
)

// sqBatch bounds the WQEs taken from one SQ per look, so that one busy QP does not starve others.
const sqBatch = 256

// processSQ consumes the WQEs the producer has made visible in q's SQ. In ERR it flushes them;
// outside RTS it leaves them for later.
func (d *Device) processSQ(q *QP, now time.Duration) bool {
	if q.dead { // its doorbell memory may be gone: a Ring can arrive after DestroyQP
		return false
	}
	pc := uint16(atomic.LoadUint32(q.sq.db))
	if pc == q.sq.ci {
		return false
	}
	switch q.attr.State {
	case uapi.QPSErr:
		q.flush()
		return true
	case uapi.QPSRTS:
	default:
		return false
	}
	recvs := q.recvs.Load()
	for n := 0; q.sq.ci != pc && n < sqBatch; n++ {
		w := &q.scratch
		err := q.sq.slot(q.sq.ci).Decode(w)
		phase := q.sq.phase
		q.sq.advance()
		switch {
		case err != nil:
			w.CompReq = true
			q.completeSend(w, decodeStatus(err))
		case w.Phase != phase:
			w.CompReq = true // an entry from another lap: the producer overran or forgot the phase
			q.completeSend(w, efaio.StatusLocalQPInternalError)
		default:
			d.execute(q, w, 0, now)
		}
	}
	q.taken.Store(recvs<<16 | uint64(q.sq.ci)) // (QP.RecvsBefore)
	return true
}

// decodeStatus maps a WQE the device cannot parse to the status of its error completion.
func decodeStatus(err error) efaio.Status {
	switch {
	case errors.Is(err, efaio.ErrOpType):
		return efaio.StatusLocalUnsupportedOp
	case errors.Is(err, efaio.ErrLKey):
		return efaio.StatusLocalInvalidLKey
	case errors.Is(err, efaio.ErrLength):
		return efaio.StatusLocalBadLength
	}
	return efaio.StatusLocalQPInternalError
}

// execute carries out one send WR and completes it, or parks it for an RNR retry.
func (d *Device) execute(q *QP, w *efaio.TxDesc, tries int, now time.Duration) {
	var m message
	st := d.prepare(q, w, &m)
	if st == efaio.StatusOK {
		st = d.deliver(q, w, &m, tries, now)
	}
	if st == statusPending {
		return // on the network: completeReq finishes it
	}
	if st == efaio.StatusRemoteRNR && q.typ == uapi.QPTypeDriver &&
		(q.attr.RNRRetry == uapi.RNRRetryInfinite || tries < int(q.attr.RNRRetry)) {
		q.parked = append(q.parked, parked(w, tries+1, now+d.cfg.RNRInterval))
		d.parkedSends.Store(true)
		return
	}
	d.count(q, w, &m, st)
	q.completeSend(w, st)
}

// prepare checks a decoded send WR against the QP and device and builds its message: operation
// allowed, AH known, size within limits, local buffers covered by lkeys of the QP's PD.
func (d *Device) prepare(q *QP, w *efaio.TxDesc, m *message) efaio.Status {
	caps := d.cfg.Caps
	switch {
	case q.typ == uapi.QPTypeUD && w.Op != efaio.OpSend,
		w.Op == efaio.OpRDMARead && caps&uapi.CapRDMARead == 0,
		w.Op == efaio.OpRDMAWrite && caps&uapi.CapRDMAWrite == 0:
		return efaio.StatusLocalUnsupportedOp
	}
	ah := q.lastAH
	if ah == nil || ah.ahn != w.AHN || ah.refs <= 0 { // (a destroyed AH's number may be another's now)
		ah = q.pd.ahs.byNum[w.AHN]
		if ah == nil {
			return efaio.StatusLocalInvalidAH
		}
		q.lastAH = ah
	}
	*m = message{
		op: w.Op, typ: q.typ, hasImm: w.HasImm, imm: w.Imm, qkey: w.QKey,
		srcGID: d.gid, dstGID: ah.gid, srcQPN: uint16(q.qpn), dstQPN: w.DestQPN,
	}
	if w.Op == efaio.OpSend {
		return d.prepareSend(q, w, m)
	}
	m.raddr, m.rkey, m.length = w.Remote.Addr, w.Remote.RKey, uint64(w.Remote.Length)
	if m.length > uint64(d.cfg.MaxRDMASize) {
		return efaio.StatusLocalBadLength
	}
	if w.Inline {
		m.src[0], m.nsrc = mem.Own(w.InlineBuf), 1
		return efaio.StatusOK
	}
	if w.Length == 0 {
		if m.length != 0 {
			return efaio.StatusLocalBadLength
		}
		return efaio.StatusOK
	}
	sge := &w.SGL[0]
	if uint64(sge.Length) < m.length {
		return efaio.StatusLocalBadLength
	}
	need := 0
	if w.Op == efaio.OpRDMARead {
		need = uapi.AccessLocalWrite
	}
	b, ok := d.localSpan(q.pd, sge.LKey, sge.Addr, m.length, need)
	if !ok {
		return efaio.StatusLocalInvalidLKey
	}
	if w.Op == efaio.OpRDMARead {
		m.sink = b
	} else {
		m.src[0], m.nsrc = b, 1
	}
	return efaio.StatusOK
}

func (d *Device) prepareSend(q *QP, w *efaio.TxDesc, m *message) efaio.Status {
	if w.Inline {
		m.src[0], m.nsrc, m.length = mem.Own(w.InlineBuf), 1, uint64(len(w.InlineBuf))
	} else {
		for i := range int(w.Length) {
			m.length += uint64(w.SGL[i].Length)
		}
	}
	if m.length > uint64(d.cfg.MTU) {
		return efaio.StatusLocalBadLength
	}
	if w.Inline {
		return efaio.StatusOK
	}
	for i := range int(w.Length) {
		sge := &w.SGL[i]
		b, ok := d.localSpan(q.pd, sge.LKey, sge.Addr, uint64(sge.Length), 0)
		if !ok {
			return efaio.StatusLocalInvalidLKey
		}
		m.src[i] = b
	}
	m.nsrc = int(w.Length)
	return efaio.StatusOK
}

// deliver hands m to its destination, at now. Same-device messages are carried out at once;
// others go on the link: UD as one datagram, SRD on the peer's stream (statusPending). A device
// without a link reaches no other address.
func (d *Device) deliver(q *QP, w *efaio.TxDesc, m *message, tries int, now time.Duration) efaio.Status {
	switch {
	case m.dstGID == d.gid:
		d.countLoopback(m)
		st := d.respond(m)
		// (Stored only on a change, as remote below: a store every message would be a locked
		// instruction every message. accept left the destination QP in d.whole, nil if none.)
		if t := d.whole.t; t != nil && q.peer.Load() != t {
			q.peer.Store(t)
		}
		return st
	case d.link == nil:
		return efaio.StatusLocalUnreachRemote
	}
	if !q.remote.Load() {
		q.remote.Store(true) // (once: a store a message would be a locked instruction a message)
	}
	if q.peer.Load() != nil {
		q.peer.Store(nil) // (its last message went to another device)
	}
	if m.typ == uapi.QPTypeUD {
		return d.sendUD(m, now)
	}
	return d.sendRemote(q, w, m, tries, now)
}

// countLoopback counts a same-device message in the device's packet and byte counters, sent and
// received, as the DATA datagrams it would be between two devices: an SRD message's bytes in
// datagrams of loopSeg, at least one, each with loopHdr bytes more (an RDMA read adds one datagram
// of request); a UD message as one datagram, as sendUD sends it. (What the wire adds, ACKs and
// RESPs, is left out.) A NIC counts the traffic it loops back to itself likewise, and the
// programs of a host device read these counters to see that their traffic went through the
// device (fabtests' test_dgram_pingpong and test_efa_device_selection do; docs/cabi.md,
// "fabtests"). Each attempt counts, as a message sent again after RNR does on the wire.
func (d *Device) countLoopback(m *message) {
	pkts := max((m.length+d.loopSeg-1)/d.loopSeg, 1)
	switch {
	case m.typ == uapi.QPTypeUD:
		pkts = 1
	case m.op == efaio.OpRDMARead:
		pkts++
	}
	bytes := m.length + pkts*d.loopHdr
	c := &d.counts
	c.TxPkts.Add(pkts)
	c.TxBytes.Add(bytes)
	c.RxPkts.Add(pkts)
	c.RxBytes.Add(bytes)
}

// count counts w's outcome st in q's counters (and the device's, for the RDMA errors that only
// it counts). It runs under d.mu: q's counts are plain fields (QP.counts).
func (d *Device) count(q *QP, w *efaio.TxDesc, m *message, st efaio.Status) {
	qc := &q.counts
	if st != efaio.StatusOK {
		qc.WRErrors++
	}
	switch w.Op {
	case efaio.OpSend:
		if st == efaio.StatusOK {
			qc.SendWRs++
			qc.SendBytes += m.length
		}
	case efaio.OpRDMARead:
		qc.RDMAReadWRs++
		if st != efaio.StatusOK {
			d.counts.RDMAReadWRErr.Add(1)
		} else {
			qc.RDMAReadBytes += m.length
		}
	case efaio.OpRDMAWrite:
		qc.RDMAWriteWRs++
		if st != efaio.StatusOK {
			d.counts.RDMAWriteWRErr.Add(1)
		} else {
			qc.RDMAWriteBytes += m.length
		}
	}
}

// completeSend writes q's send completion for w, echoing its request id. A successful WR that
// did not ask for a completion (comp_req clear) gets none; an error always gets one.
func (q *QP) completeSend(w *efaio.TxDesc, st efaio.Status) {
	if !w.CompReq && st == efaio.StatusOK {
		return
	}
	c := efaio.Completion{ReqID: w.ReqID, Status: st, QType: efaio.QTypeSend, Op: w.Op, QPN: uint16(q.qpn)}
	if q.flags&uapi.QPFlagSQ64BitReqID != 0 {
		c.ReqIDEx = w.ReqIDEx
	}
	q.sendCQ.post(&c)
}

// retryParked runs again the sends of q that wait after RNR: all of them when receives were
// posted on the device (rqMoved), otherwise those whose retry interval has passed.
func (d *Device) retryParked(q *QP, rqMoved bool, now time.Duration) {
	if len(q.parked) == 0 || q.attr.State != uapi.QPSRTS && q.attr.State != uapi.QPSSQD {
		return
	}
	waiting := q.parked
	q.parked = q.parked[len(q.parked):] // execute may append; it writes past the old entries
	kept := waiting[:0]
	for i := range waiting {
		p := waiting[i]
		if !rqMoved && now < p.due {
			kept = append(kept, p)
			continue
		}
		if p.desc.Inline {
			p.desc.InlineBuf = p.inl[:len(p.desc.InlineBuf)]
		}
		d.execute(q, &p.desc, p.tries, now)
	}
	// Re-parked entries landed after the old ones; gather everything at the front.
	n := copy(waiting[len(kept):cap(waiting)], q.parked)
	q.parked = waiting[:len(kept)+n]
	q.checkDrained()
}
