package engine

import (
	"encoding/binary"
	"sync/atomic"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
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
	src    [efaio.TxNumBufs][]byte // SEND and WRITE payload, in order
	nsrc   int
	length uint64 // payload bytes (SEND, WRITE) or bytes to read (READ)
	raddr  uint64 // RDMA: remote address
	rkey   uint32 // RDMA: remote key
	sink   []byte // READ: where the data goes (same-device requester)
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

// respond carries out m at this device and returns the status the requester completes with. SRD
// failures are per-message statuses that leave both QPs as they are; a UD message that cannot be
// delivered is dropped and its sender still succeeds.
func (d *Device) respond(m *message) efaio.Status {
	t := d.qps[uint32(m.dstQPN)]
	ud := m.typ == uapi.QPTypeUD
	if t == nil || t.typ != m.typ || !canReceive(t.attr.State) || t.attr.QKey != m.qkey {
		return d.drop(ud, efaio.StatusRemoteBadDestQPN)
	}
	switch m.op {
	case efaio.OpSend:
		return d.respondSend(t, m, ud)
	case efaio.OpRDMAWrite:
		return d.respondWrite(t, m)
	case efaio.OpRDMARead:
		src, ok := d.remoteSpan(t.pd, m.rkey, m.raddr, m.length, uapi.AccessRemoteRead)
		if !ok {
			return efaio.StatusRemoteBadAddress
		}
		copy(m.sink, src)
		d.counts.RDMAReadRespBytes.Add(m.length)
		return efaio.StatusOK
	}
	return efaio.StatusRemoteBadStatus
}

func (d *Device) drop(ud bool, s efaio.Status) efaio.Status {
	d.counts.RxDrops.Add(1)
	if ud {
		return efaio.StatusOK
	}
	return s
}

func (d *Device) respondSend(t *QP, m *message, ud bool) efaio.Status {
	var wr recvWR
	if !t.rq.next(&wr, t.d.cfg.MaxRQSGE) {
		return d.drop(ud, efaio.StatusRemoteRNR)
	}
	need := m.length
	if ud {
		need += GRHSize
	}
	var dst [config.MaxRQSGELimit][]byte
	var room uint64
	for i := range wr.ndesc {
		if wr.bad {
			break
		}
		f := &wr.desc[i]
		if f.Length == 0 {
			continue // an empty buffer touches no memory: nothing to check
		}
		b, ok := d.localSpan(t.pd, f.LKey, f.Addr, uint64(f.Length), uapi.AccessLocalWrite)
		if !ok {
			t.rq.ci += uint16(wr.ndesc)
			t.completeRecv(&efaio.Completion{ReqID: wr.reqID, Status: efaio.StatusLocalInvalidLKey})
			return d.drop(ud, efaio.StatusRemoteBadStatus)
		}
		dst[i] = b
		room += uint64(len(b))
	}
	if wr.bad {
		t.rq.ci += uint16(wr.ndesc)
		t.completeRecv(&efaio.Completion{ReqID: wr.reqID, Status: efaio.StatusLocalQPInternalError})
		return d.drop(ud, efaio.StatusRemoteBadStatus)
	}
	if room < need {
		if ud { // UD consumes the WR and reports the short buffer to the receiver
			t.rq.ci += uint16(wr.ndesc)
			t.completeRecv(&efaio.Completion{ReqID: wr.reqID, Status: efaio.StatusLocalBadLength})
			return d.drop(ud, efaio.StatusOK)
		}
		return efaio.StatusRemoteBadLength // the receive WR stays posted
	}
	sinks := dst[:wr.ndesc]
	if ud {
		var grh [GRHSize]byte
		writeGRH(grh[:], m)
		sinks = scatter(sinks, [][]byte{grh[:]}, 1)
	}
	scatter(sinks, m.src[:], m.nsrc)
	t.rq.ci += uint16(wr.ndesc)
	d.counts.RecvWRs.Add(1)
	d.counts.RecvBytes.Add(m.length)
	t.completeRecv(&efaio.Completion{
		ReqID: wr.reqID, Op: efaio.OpSend, HasImm: m.hasImm, Imm: m.imm,
		Length: uint32(need), SrcQPN: m.srcQPN,
	}, m.srcGID)
	return efaio.StatusOK
}

func (d *Device) respondWrite(t *QP, m *message) efaio.Status {
	dst, ok := d.remoteSpan(t.pd, m.rkey, m.raddr, m.length, uapi.AccessRemoteWrite)
	if !ok {
		return efaio.StatusRemoteBadAddress
	}
	unsolicited := t.flags&uapi.QPFlagUnsolicitedWriteRecv != 0
	var wr recvWR
	if m.hasImm && !unsolicited && !t.rq.next(&wr, t.d.cfg.MaxRQSGE) {
		return efaio.StatusRemoteRNR
	}
	scatter([][]byte{dst}, m.src[:], m.nsrc)
	d.counts.RDMAWriteRecvBytes.Add(m.length)
	if !m.hasImm {
		return efaio.StatusOK
	}
	c := efaio.Completion{
		Op: efaio.OpRDMAWrite, HasImm: true, Imm: m.imm, Length: uint32(m.length), SrcQPN: m.srcQPN,
		Unsolicited: unsolicited,
	}
	if !unsolicited {
		t.rq.ci += uint16(wr.ndesc)
		c.ReqID = wr.reqID
		d.counts.RecvWRs.Add(1)
	}
	t.completeRecv(&c, m.srcGID)
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

// scatter copies the first n buffers of src, in order, across dst and returns what is left of
// dst. The caller has checked that dst has room.
func scatter(dst [][]byte, src [][]byte, n int) [][]byte {
	for _, s := range src[:n] {
		for len(s) > 0 && len(dst) > 0 {
			c := copy(dst[0], s)
			s = s[c:]
			dst[0] = dst[0][c:]
			if len(dst[0]) == 0 {
				dst = dst[1:]
			}
		}
	}
	return dst
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
