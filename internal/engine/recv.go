package engine

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/uapi"
)

// GRHSize is the space a UD receive buffer gives the Global Route Header in front of the payload.
const GRHSize = 40

// message is one operation arriving at a responder QP: what a requester on this device or a
// peer over the network asks of it.
type message struct {
	op     efaio.OpType
	typ    int // QP type of the sender: UD and SRD QPs talk only to their own kind
	hasImm bool
	imm    uint32
	qkey   uint32
	srcGID [16]byte
	dstGID [16]byte
	srcQPN uint16
	dstQPN uint16
	src    [efaio.TxNumBufs]mem.Span // SEND and WRITE payload, in order
	nsrc   int
	length uint64   // payload bytes (SEND, WRITE) or bytes to read (READ)
	raddr  uint64   // RDMA: remote address
	rkey   uint32   // RDMA: remote key
	sink   mem.Span // READ: where the data goes (same-device requester)
}

// recvWR is a receive WR parsed from an RQ: its descriptors, or the number of descriptors of a
// malformed one.
type recvWR struct {
	reqID uint16
	ndesc int
	bad   bool
	desc  [config.MaxRQSGELimit]efaio.RxDescFields
}

// next parses the receive WR at the head of the RQ without consuming it. It returns false when
// no whole WR has been posted. A WR is malformed (bad set, ndesc descriptors long) when its first
// descriptor lacks the first bit, a later one has it, a reserved bit is set, or no last bit comes
// within maxSGE descriptors.
func (r *recvQueue) next(wr *recvWR, maxSGE int) bool {
	avail := uint16(atomic.LoadUint32(r.db)) - r.ci
	if avail == 0 || uint32(avail) > r.cnt {
		return false
	}
	wr.bad, wr.ndesc = false, 0
	for i := range min(int(avail), maxSGE) {
		off := int(uint32(r.ci+uint16(i))&(r.cnt-1)) * efaio.RxDescSize
		f := &wr.desc[i]
		err := efaio.RxDesc(r.ring[off : off+efaio.RxDescSize]).Decode(f)
		wr.ndesc = i + 1
		if i == 0 {
			wr.reqID = f.ReqID
		}
		if err != nil || f.First != (i == 0) {
			wr.bad = true
			return true
		}
		if f.Last {
			return true
		}
	}
	if wr.ndesc == maxSGE {
		wr.bad = true // no last bit within the QP's SGE limit
		return true
	}
	return false // the rest of the WR has not been posted yet
}

// canReceive reports whether a QP in state s processes incoming messages (rdmavt's
// RVT_PROCESS_RECV_OK: RTR, RTS, SQD, SQE).
func canReceive(s int) bool {
	return s == uapi.QPSRTR || s == uapi.QPSRTS || s == uapi.QPSSQD || s == uapi.QPSSQE
}

// inbound is a message being received by a responder QP: what accept reserved for it (the
// receive WR and its buffers, or the target region) and the status so far. A same-device message
// arrives whole; one from the network arrives as segments in any order, each placed once.
type inbound struct {
	d       *Device // whose free list it goes back to (Abort)
	t       *QP
	m       message // the message's header fields (src and sink unused)
	status  efaio.Status
	dropped bool // a UD message that cannot be delivered: dropped, the sender succeeds
	hasWR   bool
	wr      recvWR
	dst     [config.MaxRQSGELimit]mem.Span // SEND: the receive buffers, after the GRH for UD
	ndst    int
	got     uint64 // payload bytes placed
	idx     int    // its place in d.receiving, -1 when not listed there
}

// unlist takes in off the device's list of messages received in part, if it is on it.
func (d *Device) unlist(in *inbound) {
	if in.idx < 0 {
		return
	}
	last := len(d.receiving) - 1
	d.receiving[in.idx] = d.receiving[last]
	d.receiving[in.idx].idx = in.idx
	d.receiving[last] = nil
	d.receiving = d.receiving[:last]
	in.idx = -1
}

// stopReceiving ends the messages q is receiving in part, as its QP is flushed (flushed: the
// receive WR one of them took completes with FLUSHED, as the WRs still posted do), reset or
// destroyed (no completion): their remaining segments place nothing, and the requests that sent
// them fail. Without this, segments arriving later were placed into the receive buffers (which
// the application may have deregistered and unmapped since) and completed into the QP's CQ.
func (d *Device) stopReceiving(q *QP, flushed bool) {
	d.endReceiving(func(in *inbound) bool { return in.t == q }, flushed, efaio.StatusFlushed, efaio.StatusRemoteBadDestQPN)
}

// stopReceivingInto ends the SENDs received in part into buffers of mr, which is being
// deregistered: their receive WRs complete with LOCAL_INVALID_LKEY, as if the region had been
// gone when they were taken, and their requests fail. (RDMA writes look their region up again
// for every segment.)
func (d *Device) stopReceivingInto(mr *MR) {
	d.endReceiving(func(in *inbound) bool {
		return in.m.op == efaio.OpSend && in.hasWR && in.t.pd == mr.pd && in.usesLKey(mr.lkey)
	}, true, efaio.StatusLocalInvalidLKey, efaio.StatusRemoteBadStatus)
}

// endReceiving ends the messages received in part that match: the receive WR one took
// completes with wrStatus if complete is set, its remaining segments place nothing, and its
// request fails with status.
func (d *Device) endReceiving(match func(*inbound) bool, complete bool, wrStatus, status efaio.Status) {
	for i := 0; i < len(d.receiving); {
		in := d.receiving[i]
		if !match(in) {
			i++
			continue
		}
		if in.hasWR && complete {
			in.t.completeRecv(&efaio.Completion{ReqID: in.wr.reqID, Status: wrStatus})
		}
		in.hasWR = false
		in.status = status
		d.unlist(in) // moves the last into i
	}
}

// usesLKey reports whether a buffer of in's receive WR is in the region with lkey.
func (in *inbound) usesLKey(lkey uint32) bool {
	for _, f := range in.wr.desc[:in.wr.ndesc] {
		if f.Length > 0 && f.LKey == lkey {
			return true
		}
	}
	return false
}

// respond carries out a message that came whole (a same-device one, or one datagram from the
// network) at once, under the device lock, and returns the requester's status.
func (d *Device) respond(m *message) efaio.Status {
	in := &d.whole // (a kilobyte: zeroed on the stack for every message, it cost 1.5% of one)
	if st := d.accept(m, in); st != efaio.StatusOK || in.dropped {
		return d.finish(in)
	}
	if m.op == efaio.OpRDMARead {
		src, _ := d.remoteSpan(in.t.pd, m.rkey, m.raddr, m.length, uapi.AccessRemoteRead)
		if !d.copyMem(m.sink, src) {
			return efaio.StatusLocalInvalidLKey
		}
		d.counts.RDMAReadRespBytes.Add(m.length)
		return efaio.StatusOK
	}
	var off uint64
	for _, s := range m.src[:m.nsrc] {
		d.placeSpan(in, off, s)
		off += uint64(s.Len())
	}
	return d.finish(in)
}

// accept checks a message against its destination before any of its data lands: the QP exists,
// is of the sender's type, receives in its state and has the message's qkey; then a SEND takes
// the receive WR at the head of the RQ and checks its buffers, an RDMA write or read checks the
// whole remote range, and a write with immediate takes a receive WR unless the QP has
// UNSOLICITED_WRITE_RECV. It returns the status the message fails with, or OK. SRD failures are
// per-message statuses that leave both QPs as they are; a UD message that cannot be delivered is
// marked dropped.
func (d *Device) accept(m *message, in *inbound) efaio.Status {
	// Field by field, not a whole new inbound: its receive descriptors and buffers (most of
	// its kilobyte) are read only up to their counts, which start at 0 (zeroing and copying
	// all of it was 4% of a 64-byte message's cost).
	in.t, in.m, in.status, in.dropped, in.hasWR, in.ndst, in.got, in.idx = nil, *m, 0, false, false, 0, 0, -1
	in.wr.reqID, in.wr.ndesc, in.wr.bad = 0, 0, false
	in.m.src, in.m.nsrc, in.m.sink = [efaio.TxNumBufs]mem.Span{}, 0, mem.Span{}
	t := d.qps[uint32(m.dstQPN)]
	ud := m.typ == uapi.QPTypeUD
	if t == nil || t.typ != m.typ || !canReceive(t.attr.State) || t.attr.QKey != m.qkey {
		return in.fail(ud, efaio.StatusRemoteBadDestQPN)
	}
	in.t = t
	switch m.op {
	case efaio.OpSend:
		return d.acceptSend(in, ud)
	case efaio.OpRDMAWrite:
		if _, ok := d.remoteSpan(t.pd, m.rkey, m.raddr, m.length, uapi.AccessRemoteWrite); !ok {
			return in.fail(false, efaio.StatusRemoteBadAddress)
		}
		if m.hasImm && t.flags&uapi.QPFlagUnsolicitedWriteRecv == 0 {
			if !t.rq.next(&in.wr, d.cfg.MaxRQSGE) {
				return in.fail(false, efaio.StatusRemoteRNR)
			}
			t.rq.ci += uint16(in.wr.ndesc)
			if in.wr.bad { // a malformed receive WR fails as it would for a SEND
				t.completeRecv(&efaio.Completion{ReqID: in.wr.reqID, Status: efaio.StatusLocalQPInternalError})
				return in.fail(false, efaio.StatusRemoteBadStatus)
			}
			in.hasWR = true
		}
	case efaio.OpRDMARead:
		if _, ok := d.remoteSpan(t.pd, m.rkey, m.raddr, m.length, uapi.AccessRemoteRead); !ok {
			return in.fail(false, efaio.StatusRemoteBadAddress)
		}
	default:
		return in.fail(ud, efaio.StatusRemoteBadStatus)
	}
	return efaio.StatusOK
}

func (in *inbound) fail(ud bool, st efaio.Status) efaio.Status {
	in.status = st
	in.dropped = ud
	return st
}

func (d *Device) acceptSend(in *inbound, ud bool) efaio.Status {
	t, m := in.t, &in.m
	wr := &in.wr
	if !t.rq.next(wr, d.cfg.MaxRQSGE) {
		return in.fail(ud, efaio.StatusRemoteRNR)
	}
	need := m.length
	if ud {
		need += GRHSize
	}
	if wr.bad {
		t.rq.ci += uint16(wr.ndesc)
		t.completeRecv(&efaio.Completion{ReqID: wr.reqID, Status: efaio.StatusLocalQPInternalError})
		return in.fail(ud, efaio.StatusRemoteBadStatus)
	}
	var room uint64
	for i := range wr.ndesc {
		f := &wr.desc[i]
		if f.Length == 0 {
			continue // an empty buffer touches no memory: nothing to check
		}
		b, ok := d.localSpan(t.pd, f.LKey, f.Addr, uint64(f.Length), uapi.AccessLocalWrite)
		if !ok {
			t.rq.ci += uint16(wr.ndesc)
			t.completeRecv(&efaio.Completion{ReqID: wr.reqID, Status: efaio.StatusLocalInvalidLKey})
			return in.fail(ud, efaio.StatusRemoteBadStatus)
		}
		in.dst[in.ndst] = b
		in.ndst++
		room += uint64(b.Len())
	}
	if room < need {
		if ud { // UD consumes the WR and reports the short buffer to the receiver
			t.rq.ci += uint16(wr.ndesc)
			t.completeRecv(&efaio.Completion{ReqID: wr.reqID, Status: efaio.StatusLocalBadLength})
			return in.fail(true, efaio.StatusOK)
		}
		return in.fail(false, efaio.StatusRemoteBadLength) // the receive WR stays posted
	}
	t.rq.ci += uint16(wr.ndesc)
	in.hasWR = true
	if ud {
		var grh [GRHSize]byte
		writeGRH(grh[:], m)
		rest, ok := d.scatterMem(in.dst[:in.ndst], grh[:])
		in.ndst = copy(in.dst[:], rest)
		if !ok { // the receive buffer faulted: the WR fails as for a bad key, the message is dropped
			in.hasWR = false
			t.completeRecv(&efaio.Completion{ReqID: wr.reqID, Status: efaio.StatusLocalInvalidLKey})
			return in.fail(true, efaio.StatusOK)
		}
	}
	return efaio.StatusOK
}

// place copies one segment of an accepted message: payload bytes [off, off+len(data)). Each
// segment is placed once; a segment that no longer has a place (the region was deregistered)
// fails the message.
func (d *Device) place(in *inbound, off uint64, data []byte) {
	in.got += uint64(len(data))
	if in.status != efaio.StatusOK || len(data) == 0 {
		return
	}
	switch in.m.op {
	case efaio.OpSend:
		if !d.writeAcross(in.dst[:in.ndst], off, data) {
			// The receive buffer (or, same device, the source) faulted: the receive WR fails as
			// a bad local key would have, the sender gets a bad status.
			if in.hasWR {
				in.t.completeRecv(&efaio.Completion{ReqID: in.wr.reqID, Status: efaio.StatusLocalInvalidLKey})
				in.hasWR = false
			}
			in.status = efaio.StatusRemoteBadStatus
		}
	case efaio.OpRDMAWrite:
		b, ok := d.remoteSpan(in.t.pd, in.m.rkey, in.m.raddr+off, uint64(len(data)), uapi.AccessRemoteWrite)
		if !ok {
			in.status = efaio.StatusRemoteBadAddress
			return
		}
		if !d.writeMem(b, data) {
			in.status = efaio.StatusRemoteBadAddress
		}
	}
}

// placeSpan is place for a same-device message's source, which may be another process's memory:
// that is read into the device's bounce buffer a piece at a time. A source that cannot be read
// fails the message as a receive buffer that faults does.
func (d *Device) placeSpan(in *inbound, off uint64, s mem.Span) {
	if b, own := s.Bytes(); own {
		d.place(in, off, b)
		return
	}
	if d.bounce == nil {
		d.bounce = make([]byte, bounceSize)
	}
	for done := 0; done < s.Len(); {
		k := min(len(d.bounce), s.Len()-done)
		if !s.ReadAt(d.bounce[:k], done) {
			in.got += uint64(s.Len() - done)
			if in.status == efaio.StatusOK {
				if in.hasWR {
					in.t.completeRecv(&efaio.Completion{ReqID: in.wr.reqID, Status: efaio.StatusLocalInvalidLKey})
					in.hasWR = false
				}
				in.status = efaio.StatusRemoteBadStatus
			}
			return
		}
		d.place(in, off+uint64(done), d.bounce[:k])
		done += k
	}
}

// bounceSize is the size of the buffer same-device messages from another process's memory are
// copied through.
const bounceSize = 64 << 10

// writeAcross is mem.WriteAcross, guarded as copyMem is.
func (d *Device) writeAcross(dst []mem.Span, off uint64, data []byte) bool {
	if !d.foreign {
		return mem.WriteAcross(dst, off, data)
	}
	ok := false
	return catchFault(func() { ok = mem.WriteAcross(dst, off, data) }) && ok
}

// scatterMem is mem.Scatter, guarded as copyMem is.
func (d *Device) scatterMem(dst []mem.Span, data []byte) (rest []mem.Span, ok bool) {
	if !d.foreign {
		return mem.Scatter(dst, data)
	}
	if !catchFault(func() { rest, ok = mem.Scatter(dst, data) }) {
		return nil, false
	}
	return rest, ok
}

// finish completes an accepted message once all its payload is placed: the receive completion
// for a SEND or a write with immediate, the counters, and the requester's status.
func (d *Device) finish(in *inbound) efaio.Status {
	m := &in.m
	if in.dropped {
		d.counts.RxDrops.Add(1)
		return efaio.StatusOK
	}
	if in.status != efaio.StatusOK {
		d.counts.RxDrops.Add(1)
		if in.hasWR { // the message took a receive WR and then failed: the WR completes in error
			in.t.completeRecv(&efaio.Completion{ReqID: in.wr.reqID, Status: in.status})
		}
		return in.status
	}
	switch {
	case m.op == efaio.OpSend:
		length := m.length
		if m.typ == uapi.QPTypeUD {
			length += GRHSize
		}
		in.t.completeRecv(&efaio.Completion{
			ReqID: in.wr.reqID, Op: efaio.OpSend, HasImm: m.hasImm, Imm: m.imm,
			Length: uint32(length), SrcQPN: m.srcQPN,
		}, m.srcGID)
		// Counted after the entry is written: a thread waiting for the count (AwaitRecv, on
		// another goroutine than the one receiving) finds the entry when it sees the count move.
		in.t.countRecv(m.length)
	case m.op == efaio.OpRDMAWrite:
		d.counts.RDMAWriteRecvBytes.Add(m.length)
		if m.hasImm {
			c := efaio.Completion{
				Op: efaio.OpRDMAWrite, HasImm: true, Imm: m.imm, Length: uint32(m.length), SrcQPN: m.srcQPN,
				Unsolicited: !in.hasWR,
			}
			if in.hasWR {
				c.ReqID = in.wr.reqID
			}
			in.t.completeRecv(&c, m.srcGID)
			if in.hasWR {
				in.t.countRecv(0) // (a receive WR completed: its bytes count as written, above)
			}
		}
	}
	return efaio.StatusOK
}

// completeRecv writes a receive completion for t. The AH number is the receiving PD's AH for the
// sender's GID, or UnknownAH; then, if the CQ asked for it, the source GID rides in the entry.
func (t *QP) completeRecv(c *efaio.Completion, srcGID ...[16]byte) {
	c.QType = efaio.QTypeRecv
	c.QPN = uint16(t.qpn)
	c.AHN = efaio.UnknownAH
	if len(srcGID) > 0 {
		c.AHN = t.pd.ahnFor(srcGID[0])
		if c.AHN == efaio.UnknownAH && t.recvCQ.flags&uapi.CQFlagWithSGID != 0 {
			c.SrcAddr = srcGID[0]
		}
	}
	t.recvCQ.post(c)
}

// writeGRH fills the 40-byte IPv6-style Global Route Header of a UD receive: version 6, payload
// length, next header 0x1b (IBA), hop limit, source and destination GIDs.
func writeGRH(b []byte, m *message) {
	clear(b)
	b[0] = 6 << 4
	binary.BigEndian.PutUint16(b[4:], uint16(m.length))
	b[6] = 0x1b
	b[7] = 1
	copy(b[8:24], m.srcGID[:])
	copy(b[24:40], m.dstGID[:])
}
