package engine

import (
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/srd"
	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/internal/wire"
)

// The device and its transport (package srd) meet here: requests go down as srd.Requests with a
// sendWR as their owner, and the transport calls the device back through host (srd.Host).

// sendWR is a send WR on the network: the owner of its transport request. It is in its QP's out
// list until the outcome comes (host.Done) or the QP is flushed (cancel).
type sendWR struct {
	q      *QP
	w      efaio.TxDesc
	tries  int
	length uint64
	idx    int      // position in q.out
	m      *srd.Msg // the transport's request
	// inl holds an inline WR's data, which w.InlineBuf and the request's source point at: the
	// SQ slot it came from may be written again before the WR completes (libefa reuses a slot
	// once fewer than a ring's worth of WRs are outstanding, and SRD completes out of order),
	// and a retransmission or an RNR retry must send the bytes that were posted.
	inl [efaio.TxWQESize128]byte
}

// statusPending is execute's "the WR is on the network": not an EFA status.
const statusPending efaio.Status = 0xff

// sendRemote starts a request to another device, at now: q's WR completes when the peer answers
// (or the transport gives up).
func (d *Device) sendRemote(q *QP, w *efaio.TxDesc, m *message, tries int, now time.Duration) efaio.Status {
	sw := d.newSendWR()
	sw.q, sw.w, sw.tries, sw.length = q, *w, tries, m.length
	if w.Inline {
		sw.w.InlineBuf = sw.inl[:copy(sw.inl[:], w.InlineBuf)]
		m.src[0] = mem.Own(sw.w.InlineBuf)
	}
	r := m.request()
	switch m.op {
	case efaio.OpRDMAWrite:
		r.Op = wire.OpWrite
	case efaio.OpRDMARead:
		r.Op = wire.OpReadReq
	}
	sw.idx = len(q.out)
	q.out = append(q.out, sw) // before Request: the transport's Done finds it there
	q.publishOut()
	msg, st := d.srd.Request(now, m.dstGID, &r, sw)
	if st != efaio.StatusOK {
		q.dropOut(sw)
		d.freeWRs = append(d.freeWRs, sw)
		return st
	}
	sw.m = msg // (Request only queues: the request cannot have ended already)
	return statusPending
}

// sendUD sends a UD message as one datagram, at now; the WR succeeds once it is sent.
func (d *Device) sendUD(m *message, now time.Duration) efaio.Status {
	r := m.request()
	return d.srd.UD(now, m.dstGID, &r)
}

// request is m as the transport takes it (a SEND; the caller sets other operations).
func (m *message) request() srd.Request {
	return srd.Request{Op: wire.OpSend, SrcQPN: m.srcQPN, DstQPN: m.dstQPN, QKey: m.qkey, Imm: m.imm,
		HasImm: m.hasImm, RKey: m.rkey, RAddr: m.raddr, Src: m.src, NSrc: m.nsrc, Length: m.length, Sink: m.sink}
}

func (d *Device) newSendWR() *sendWR {
	if n := len(d.freeWRs); n > 0 {
		sw := d.freeWRs[n-1]
		d.freeWRs = d.freeWRs[:n-1]
		return sw
	}
	return new(sendWR)
}

// cancel takes a WR being flushed off the network: the transport stops waiting for its answer.
func (d *Device) cancel(sw *sendWR) {
	sw.q.dropOut(sw)
	if sw.m != nil {
		d.srd.Cancel(sw.m)
	}
	*sw = sendWR{}
	d.freeWRs = append(d.freeWRs, sw)
}

// stopSendingFrom ends the WRs on the network whose local buffers lie in mr, which is being
// deregistered: each completes with LOCAL_INVALID_LKEY, and the transport forgets its memory (a
// segment still to go, or to go again, goes as an ABORT; read data still to come places nothing),
// so that the device never reads or writes a region the application may have reused.
func (d *Device) stopSendingFrom(mr *MR) {
	for _, q := range d.qpList {
		if q.pd != mr.pd {
			continue
		}
		for i := 0; i < len(q.out); {
			sw := q.out[i]
			if !sw.usesLKey(mr.lkey) {
				i++
				continue
			}
			q.completeSend(&sw.w, efaio.StatusLocalInvalidLKey)
			d.cancel(sw) // moves the last into i
		}
		q.checkDrained()
	}
}

// usesLKey reports whether a buffer of sw's WR is in the region with lkey.
func (sw *sendWR) usesLKey(lkey uint32) bool {
	if sw.w.Inline {
		return false
	}
	for _, b := range sw.w.SGL[:min(int(sw.w.Length), efaio.TxNumBufs)] {
		if b.Length > 0 && b.LKey == lkey {
			return true
		}
	}
	return false
}

// dropOut removes sw from q's list of WRs on the network.
func (q *QP) dropOut(sw *sendWR) {
	last := len(q.out) - 1
	q.out[sw.idx] = q.out[last]
	q.out[sw.idx].idx = sw.idx
	q.out[last] = nil
	q.out = q.out[:last]
	q.publishOut()
	sw.q = nil
}

// publishOut stores len(q.out) in q.outN, up to 2: AwaitRecv asks only whether it is 0, 1 or
// more. The store is made only when that moved, as it is a locked instruction on amd64: a
// stream, with more than one WR out all along, makes none.
func (q *QP) publishOut() {
	if n := int32(min(len(q.out), 2)); q.outN.Load() != n {
		q.outN.Store(n)
	}
}

// host is the device as its transport sees it (srd.Host).
type host Device

// Done finishes a WR the transport has an outcome for at now: it completes, or after RNR waits
// to be tried again as a new request.
func (h *host) Done(now time.Duration, owner any, st efaio.Status, mayRetry bool) {
	d := (*Device)(h)
	sw := owner.(*sendWR)
	if q := sw.q; q != nil {
		q.dropOut(sw)
		if mayRetry && st == efaio.StatusRemoteRNR && (q.attr.RNRRetry == uapi.RNRRetryInfinite || sw.tries < int(q.attr.RNRRetry)) &&
			(q.attr.State == uapi.QPSRTS || q.attr.State == uapi.QPSSQD) {
			q.parked = append(q.parked, parked(&sw.w, sw.tries+1, now+d.cfg.RNRInterval))
			d.parkedSends.Store(true)
		} else {
			msg := message{length: sw.length}
			d.count(q, &sw.w, &msg, st)
			q.completeSend(&sw.w, st)
		}
		q.checkDrained() // (SQD: this may have been the last WR in flight)
	}
	*sw = sendWR{}
	d.freeWRs = append(d.freeWRs, sw)
}

// Receive places a SEND or RDMA write segment from src: the whole message at once if it came in
// one frame, otherwise into what accept reserved for it with its first segment.
func (h *host) Receive(src [16]byte, f *wire.Data, prev srd.Inbound) (srd.Inbound, efaio.Status, bool) {
	d := (*Device)(h)
	op := efaio.OpSend
	if f.Op == wire.OpWrite {
		op = efaio.OpRDMAWrite
	}
	if prev == nil && f.Whole() {
		m := d.message(src, f, op, uapi.QPTypeDriver)
		m.src[0], m.nsrc = mem.Own(f.Payload), 1
		return nil, d.respond(&m), true
	}
	in, _ := prev.(*inbound)
	if in == nil {
		in = d.newInbound()
		m := d.message(src, f, op, uapi.QPTypeDriver)
		if d.accept(&m, in) == efaio.StatusOK && !in.dropped {
			in.idx = len(d.receiving)
			d.receiving = append(d.receiving, in)
		}
		in.d = d
	} else if in.m.op != op || uint64(f.Length) != in.m.length || uint64(f.Offset)+uint64(len(f.Payload)) > in.m.length {
		// Not a segment of the message its first segment began (another operation or length, or
		// bytes past its end): nothing of it lands, and the message fails now, as a whole; a
		// receive WR it took completes as for an aborted message.
		if in.hasWR {
			in.t.completeRecv(&efaio.Completion{ReqID: in.wr.reqID, Status: efaio.StatusRemoteAbort})
			in.hasWR = false
		}
		in.status = efaio.StatusRemoteBadStatus
		in.got = in.m.length
	}
	d.place(in, uint64(f.Offset), f.Payload)
	if in.got < in.m.length {
		return in, efaio.StatusOK, false
	}
	d.unlist(in)
	st := d.finish(in)
	d.freeIn = append(d.freeIn, in)
	return nil, st, true
}

// Read checks an RDMA read request from src and returns the memory it reads, and its MR.
func (h *host) Read(src [16]byte, f *wire.Data) (mem.Span, any, efaio.Status) {
	d := (*Device)(h)
	m := d.message(src, f, efaio.OpRDMARead, uapi.QPTypeDriver)
	var in inbound
	if st := d.accept(&m, &in); st != efaio.StatusOK {
		return mem.Span{}, nil, st
	}
	mr := d.mrs.byRKey[m.rkey]
	b, _ := d.remoteSpan(in.t.pd, m.rkey, m.raddr, m.length, uapi.AccessRemoteRead)
	d.counts.RDMAReadRespBytes.Add(m.length)
	return b, mr, efaio.StatusOK
}

// Live reports whether the MR a read's data comes from (Read) is still registered.
func (h *host) Live(region any) bool {
	mr, ok := region.(*MR)
	return ok && !mr.dead
}

// UD delivers a UD message from src.
func (h *host) UD(src [16]byte, f *wire.Data) {
	d := (*Device)(h)
	m := d.message(src, f, efaio.OpSend, uapi.QPTypeUD)
	m.src[0], m.nsrc = mem.Own(f.Payload), 1
	d.respond(&m)
}

// Gather appends bytes [off, off+n) of src, under a fault guard once the device has had a foreign
// region (copyMem).
func (h *host) Gather(b []byte, src []mem.Span, off uint64, n int) ([]byte, bool) {
	if !h.foreign {
		return mem.Append(b, src, off, n)
	}
	ok := false
	return b, catchFault(func() { b, ok = mem.Append(b, src, off, n) }) && ok
}

// Copy copies read data into application memory at byte off of dst (writeMem).
func (h *host) Copy(dst mem.Span, off int, src []byte) bool {
	return (*Device)(h).writeMem(dst.Slice(off, len(src)), src)
}

// Abort ends a message that arrived in part: its receive WR, if it took one, completes with
// REMOTE_ABORT.
func (in *inbound) Abort() {
	in.d.unlist(in)
	if in.hasWR {
		in.t.completeRecv(&efaio.Completion{ReqID: in.wr.reqID, Status: efaio.StatusRemoteAbort})
	}
	in.d.freeIn = append(in.d.freeIn, in)
}

// message builds the responder's view of a request frame from src.
func (d *Device) message(src [16]byte, f *wire.Data, op efaio.OpType, typ int) message {
	return message{
		op: op, typ: typ, hasImm: f.Flags&wire.FlagImm != 0, imm: f.Imm, qkey: f.QKey,
		srcGID: src, dstGID: d.gid, srcQPN: f.SrcQPN, dstQPN: f.DstQPN, length: uint64(f.Length),
		raddr: f.RAddr, rkey: f.RKey,
	}
}

func (d *Device) newInbound() *inbound {
	if n := len(d.freeIn); n > 0 {
		in := d.freeIn[n-1]
		d.freeIn = d.freeIn[:n-1]
		return in
	}
	return new(inbound)
}
