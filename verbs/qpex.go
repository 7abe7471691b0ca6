package verbs

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/uapi"
)

// QPEx is the extended send interface of a QP (struct ibv_qp_ex): a session of work requests
// built one call at a time. WRStart takes the send-queue lock; each opcode call (WRSend,
// WRRDMAWrite, ...) starts a WR with the WRID and WRFlags set just before it; setters fill it;
// WRComplete posts the session and rings the doorbell every max_batch WQEs and at the end, or,
// if any call failed, rolls the whole session back and returns the first error. WRAbort rolls
// back. Only the opcodes given in SendOpsFlags at creation are available; others fail the
// session with EOPNOTSUPP.
type QPEx struct {
	qp      *QP
	WRID    uint64
	WRFlags SendFlags
}

// session is the state of a QPEx session, guarded by the send-queue lock it holds.
type session struct {
	// active: WRStart to WRComplete or WRAbort, while the session holds the send queue's lock.
	// Atomic, so that Modify and Destroy can refuse at once (lockQueues) instead of waiting for
	// that lock, for ever when the session is their caller's own.
	active atomic.Bool
	err    error
	pc     uint16 // rollback point
	phase  uint8
	posted uint32
	idx    []uint16 // pool indices taken, to give back on rollback

	open bool // a WR is being built into slot
	cur  efaio.TxDesc
	slot efaio.TxWQE
	inl  [efaio.TxInlineMax128]byte
}

var errNoSession = errors.New("verbs: QPEx call outside WRStart/WRComplete")

// ToQPEx returns the QP's extended send interface (ibv_qp_to_qp_ex). A QP created without
// send-ops flags (by CreateQP, or by CreateQPEx without QPInitAttrSendOpsFlags) has none:
// EOPNOTSUPP, where libibverbs returns NULL.
func (qp *QP) ToQPEx() (*QPEx, error) {
	if qp.ex == nil {
		return nil, fmt.Errorf("verbs: QP %d created without send-ops flags has no QPEx: %w", qp.qpn, syscall.EOPNOTSUPP)
	}
	return qp.ex, nil
}

// QP returns the QP.
func (x *QPEx) QP() *QP { return x.qp }

// WRStart begins a session (ibv_wr_start). On a destroyed QP the session fails: WRComplete
// returns EINVAL. WRStart waits while another goroutine's session is open (as ibv_wr_start spins
// on the SQ lock); a goroutine must not call it again before its own WRComplete or WRAbort.
// While a session is open, Modify and Destroy of the QP fail with EBUSY.
func (x *QPEx) WRStart() {
	sq := &x.qp.sq
	sq.mu.Lock()
	s := &sq.sess
	s.active.Store(true)
	s.err, s.open = nil, false
	s.pc, s.phase, s.posted = sq.pc, sq.phase, sq.posted
	s.idx = s.idx[:0]
	if x.qp.dead.Load() {
		s.err = x.qp.errDead("QPEx session")
	}
}

// WRComplete posts the session (ibv_wr_complete), or rolls it back and returns the first error.
func (x *QPEx) WRComplete() error {
	sq := &x.qp.sq
	s := &sq.sess
	if !s.active.Load() {
		return fmt.Errorf("%w: %w", errNoSession, syscall.EINVAL)
	}
	s.active.Store(false)
	if err := s.err; err != nil {
		x.rollback()
		sq.mu.Unlock()
		return err
	}
	x.finish()
	rung := sq.rung != sq.pc
	for sq.rung != sq.pc {
		n := min(int(sq.pc-sq.rung), sq.maxBatch)
		sq.rung += uint16(n)
		atomic.StoreUint32(sq.db, uint32(sq.rung))
	}
	sq.mu.Unlock()
	if rung {
		x.qp.ctx.e.Ring(x.qp.e) // after letting go: Ring may do the device's work on this goroutine
	}
	return nil
}

// WRAbort discards the session (ibv_wr_abort).
func (x *QPEx) WRAbort() {
	sq := &x.qp.sq
	if !sq.sess.active.Load() {
		return
	}
	sq.sess.active.Store(false)
	x.rollback()
	sq.mu.Unlock()
}

func (x *QPEx) rollback() {
	sq := &x.qp.sq
	s := &sq.sess
	sq.pc, sq.phase, sq.posted = s.pc, s.phase, s.posted
	for i := len(s.idx) - 1; i >= 0; i-- {
		sq.unget(s.idx[i])
	}
	s.idx = s.idx[:0]
	s.open = false
}

// fail records the session's first error.
func (x *QPEx) fail(err error) {
	if s := &x.qp.sq.sess; s.err == nil {
		s.err = err
	}
}

// usable reports whether a call may go on: a session is active without an error.
func (x *QPEx) usable() bool {
	s := &x.qp.sq.sess
	if !s.active.Load() {
		return false
	}
	return s.err == nil
}

// finish encodes the WR being built into its slot.
func (x *QPEx) finish() {
	s := &x.qp.sq.sess
	if s.open {
		s.slot.Encode(&s.cur)
		s.open = false
	}
}

// begin starts a WR of op: the opcode must be in the QP's send-ops flags, then libefa's post
// validation applies.
func (x *QPEx) begin(op efaio.OpType, need SendOpsFlags, hasImm bool, imm uint32) {
	if !x.usable() {
		return
	}
	qp := x.qp
	x.finish()
	if qp.sendOps&need == 0 {
		x.fail(fmt.Errorf("verbs: opcode not in the QP's send_ops_flags %#x: %w", qp.sendOps, syscall.EOPNOTSUPP))
		return
	}
	if err := qp.validateSend(x.WRFlags); err != nil {
		x.fail(err)
		return
	}
	s := &qp.sq.sess
	s.cur = efaio.TxDesc{Op: op, HasImm: hasImm, Imm: imm}
	s.slot = qp.claimSlot(&s.cur, x.WRID)
	s.open = true
}

// WRSend starts a SEND (ibv_wr_send).
func (x *QPEx) WRSend() { x.begin(efaio.OpSend, SendOpsSend, false, 0) }

// WRSendImm starts a SEND with immediate data, in host order (ibv_wr_send_imm).
func (x *QPEx) WRSendImm(imm uint32) { x.begin(efaio.OpSend, SendOpsSendWithImm, true, imm) }

// WRRDMARead starts an RDMA read of the remote region at raddr (ibv_wr_rdma_read).
func (x *QPEx) WRRDMARead(rkey uint32, raddr uint64) {
	x.begin(efaio.OpRDMARead, SendOpsRDMARead, false, 0)
	x.setRemote(rkey, raddr)
}

// WRRDMAWrite starts an RDMA write to the remote region at raddr (ibv_wr_rdma_write).
func (x *QPEx) WRRDMAWrite(rkey uint32, raddr uint64) {
	x.begin(efaio.OpRDMAWrite, SendOpsRDMAWrite, false, 0)
	x.setRemote(rkey, raddr)
}

// WRRDMAWriteImm starts an RDMA write with immediate data (ibv_wr_rdma_write_imm); the receiver
// gets a completion, consuming a receive WR unless its QP has UNSOLICITED_WRITE_RECV.
func (x *QPEx) WRRDMAWriteImm(rkey uint32, raddr uint64, imm uint32) {
	x.begin(efaio.OpRDMAWrite, SendOpsRDMAWriteWithImm, true, imm)
	x.setRemote(rkey, raddr)
}

func (x *QPEx) setRemote(rkey uint32, raddr uint64) {
	if x.usable() {
		c := &x.qp.sq.sess.cur
		c.Remote.RKey, c.Remote.Addr = rkey, raddr
	}
}

// current returns the WR being built, or nil (and records an error) if there is none.
func (x *QPEx) current() *efaio.TxDesc {
	if !x.usable() {
		return nil
	}
	s := &x.qp.sq.sess
	if !s.open {
		x.fail(fmt.Errorf("verbs: WR setter before an opcode call: %w", syscall.EINVAL))
		return nil
	}
	return &s.cur
}

// WRSetUDAddr sets the destination (ibv_wr_set_ud_addr): the AH, the remote QP number and qkey.
// A nil AH or one of another PD than the QP's fails the session with EINVAL.
func (x *QPEx) WRSetUDAddr(ah *AH, remoteQPN, remoteQKey uint32) {
	c := x.current()
	if c == nil {
		return
	}
	if ah == nil {
		x.fail(fmt.Errorf("verbs: nil AH: %w", syscall.EINVAL))
		return
	}
	if ah.pd != x.qp.pd { // the device looks the AH number up in the QP's PD
		x.fail(fmt.Errorf("verbs: AH of another PD: %w", syscall.EINVAL))
		return
	}
	c.AHN, c.DestQPN, c.QKey = ah.e.AHN(), uint16(remoteQPN), remoteQKey
}

// WRSetSGE sets one local buffer (ibv_wr_set_sge).
func (x *QPEx) WRSetSGE(lkey uint32, addr uint64, length uint32) {
	c := x.current()
	if c == nil {
		return
	}
	c.Inline, c.InlineBuf = false, nil
	c.Length = 1
	c.SGL[0] = efaio.BufDesc{Length: length, LKey: lkey, Addr: addr}
	if c.Op != efaio.OpSend {
		c.Remote.Length = length
	}
}

// WRSetSGEList sets the local buffers (ibv_wr_set_sge_list): at most max_send_sge for a SEND and
// one for RDMA, else EINVAL.
func (x *QPEx) WRSetSGEList(sges []SGE) {
	c := x.current()
	if c == nil {
		return
	}
	limit := int(x.qp.cap.MaxSendSGE)
	if c.Op != efaio.OpSend {
		limit = min(x.qp.ctx.cfg.MaxSGERD, efaio.TxNumRDMABufs)
	}
	if len(sges) > limit {
		x.fail(fmt.Errorf("verbs: %d SGEs over the limit %d: %w", len(sges), limit, syscall.EINVAL))
		return
	}
	c.Inline, c.InlineBuf = false, nil
	c.Length = uint16(len(sges))
	var total uint32
	for i, sge := range sges {
		c.SGL[i] = efaio.BufDesc{Length: sge.Length, LKey: sge.LKey, Addr: sge.Addr}
		total += sge.Length
	}
	if c.Op != efaio.OpSend {
		c.Remote.Length = total
	}
}

// WRSetInlineData copies data into the WQE (ibv_wr_set_inline_data). Allowed for SEND up to
// max_inline_data, and for RDMA write on a QP with 128-byte WQEs and INLINE_WRITE; else EINVAL.
func (x *QPEx) WRSetInlineData(data []byte) {
	x.setInline(func(buf []byte) int { return copy(buf, data) }, len(data))
}

// WRSetInlineDataList copies the concatenation of bufs into the WQE (ibv_wr_set_inline_data_list).
func (x *QPEx) WRSetInlineDataList(bufs [][]byte) {
	n := 0
	for _, b := range bufs {
		n += len(b)
	}
	x.setInline(func(buf []byte) int {
		k := 0
		for _, b := range bufs {
			k += copy(buf[k:], b)
		}
		return k
	}, n)
}

func (x *QPEx) setInline(fill func([]byte) int, n int) {
	c := x.current()
	if c == nil {
		return
	}
	qp := x.qp
	switch {
	case c.Op == efaio.OpRDMARead,
		c.Op == efaio.OpRDMAWrite && (qp.sq.esz != efaio.TxWQESize128 || qp.drv.Flags&uapi.DVQPFlagInlineWrite == 0):
		x.fail(fmt.Errorf("verbs: inline data not supported for %v on this QP: %w", c.Op, syscall.EINVAL))
		return
	case n > int(qp.cap.MaxInlineData):
		x.fail(fmt.Errorf("verbs: %d bytes of inline data over max_inline_data %d: %w", n, qp.cap.MaxInlineData, syscall.EINVAL))
		return
	}
	s := &qp.sq.sess
	fill(s.inl[:n])
	c.Inline, c.InlineBuf, c.Length = true, s.inl[:n], uint16(n)
	if c.Op == efaio.OpRDMAWrite {
		c.Remote.Length = uint32(n)
	}
}

// setProcessingHints sets the current WR's processing hints (efadv_wr_set_processing_hints); the
// QP must have been created with EFADV_WR_EX_WITH_PROCESSING_HINTS, else the session fails with
// EOPNOTSUPP. Ignored once the session has an error.
func (x *QPEx) setProcessingHints(hints uint32) {
	c := x.current()
	if c == nil {
		return
	}
	if x.qp.drv.WRFlags&uapi.DVWRExWithProcessingHints == 0 {
		x.fail(fmt.Errorf("verbs: QP created without processing hints: %w", syscall.EOPNOTSUPP))
		return
	}
	c.Hints = uint8(hints) & efaio.ProcessingHintBurstPPSSensitive
}
