package verbs

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/provider"
	"github.com/softefa/softefa/internal/uapi"
)

// QPCap are a QP's queue sizes (struct ibv_qp_cap).
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPInitAttr describes a QP for PD.CreateQP (struct ibv_qp_init_attr).
type QPInitAttr struct {
	QPContext any
	SendCQ    *CQ
	RecvCQ    *CQ
	Cap       QPCap
	QPType    QPType
	SQSigAll  bool
}

// QPInitAttrEx describes a QP for Context.CreateQPEx (struct ibv_qp_init_attr_ex). PD is read
// when CompMask has QPInitAttrPD, SendOpsFlags when it has QPInitAttrSendOpsFlags. EFA has no
// SRQ, XRC, TSO or RSS, so the fields for them are absent.
type QPInitAttrEx struct {
	QPContext    any
	SendCQ       *CQ
	RecvCQ       *CQ
	Cap          QPCap
	QPType       QPType
	SQSigAll     bool
	CompMask     QPInitAttrMask
	PD           *PD
	CreateFlags  uint32
	SendOpsFlags SendOpsFlags
}

// QP is a queue pair (struct ibv_qp). Posting is safe from several goroutines: the send queue
// and the receive queue each have a lock, held by PostSend and PostRecv, and by a QPEx session
// from WRStart to WRComplete or WRAbort.
type QP struct {
	ctx      *Context
	pd       *PD
	e        *engine.QP
	qpn      uint32
	typ      QPType
	sendCQ   *CQ
	recvCQ   *CQ
	sqSigAll bool
	cap      QPCap
	sendOps  SendOpsFlags
	drv      provider.QPAttr
	userCtx  any
	state    atomic.Int32 // recorded after each successful modify, as libefa's qp->state
	dead     atomic.Bool  // destroyed: set by Destroy with both queue locks held

	sq    sendQ
	rq    recvQ
	books atomic.Pointer[qpRef] // the queues' current books, for polling
	ex    *QPEx
}

// wq is the request-id bookkeeping of one work queue: libefa's wrid array and LIFO pool of free
// indices. A device request id is index | generation<<log2(entries), so that a completion for a
// QP that held this number before is recognised and dropped. A queue has new books after each
// move to RESET (QP.renew); the old ones stay with the completions they are owed.
type wq struct {
	wrid       []uint64
	poolMu     sync.Mutex // guards pool, used and out: posting takes indices, polling returns them
	pool       []uint16
	used       int
	out        []bool // out[i]: index i is posted and not yet completed
	cnt        uint32 // WRs the queue holds
	genMask    uint16
	shiftedGen uint16
	posted     uint32 // owned by the queue's lock
	completed  atomic.Uint32
}

func (w *wq) init(cnt uint32, gen uint16) {
	w.cnt = cnt
	w.wrid = make([]uint64, cnt)
	w.pool = make([]uint16, cnt)
	w.out = make([]bool, cnt)
	for i := range w.pool {
		w.pool[i] = uint16(i)
	}
	shift := bits.Len32(roundPow2(cnt) - 1)
	w.genMask = ^uint16(roundPow2(cnt) - 1)
	w.shiftedGen = uint16(uint32(gen)<<shift) & w.genMask
}

func (w *wq) full() bool { return w.posted-w.completed.Load() >= w.cnt }

// busy reports whether WRs are posted and not yet polled. Called with the queue's lock held.
func (w *wq) busy() bool { return w.posted != w.completed.Load() }

func (w *wq) get() uint16 {
	w.poolMu.Lock()
	idx := w.pool[w.used]
	w.used++
	w.out[idx] = true
	w.poolMu.Unlock()
	return idx
}

// put returns idx to the pool and counts the WR completed. An index that is not out (a stale or
// forged completion) changes nothing: put reports false.
func (w *wq) put(idx uint16) bool {
	w.poolMu.Lock()
	defer w.poolMu.Unlock()
	if !w.ungetLocked(idx) {
		return false
	}
	w.completed.Add(1)
	return true
}

// unget returns an index taken by get for a WR that was never posted.
func (w *wq) unget(idx uint16) bool {
	w.poolMu.Lock()
	defer w.poolMu.Unlock()
	return w.ungetLocked(idx)
}

func (w *wq) ungetLocked(idx uint16) bool {
	if int(idx) >= len(w.out) || !w.out[idx] {
		return false
	}
	w.out[idx] = false
	w.used--
	w.pool[w.used] = idx
	return true
}

func (w *wq) reqID(idx uint16) uint16 { return idx | w.shiftedGen }

func (w *wq) index(reqID uint16) (uint16, bool) {
	idx := reqID &^ w.genMask
	return idx, reqID&w.genMask == w.shiftedGen && uint32(idx) < w.cnt
}

func (w *wq) reset() {
	w.poolMu.Lock()
	w.used = 0
	for i := range w.pool {
		w.pool[i] = uint16(i)
	}
	clear(w.out)
	w.poolMu.Unlock()
	w.posted = 0
	w.completed.Store(0)
}

type sendQ struct {
	*wq                 // replaced by a move to RESET
	mu       sync.Mutex // guards wq (the pointer and wq.posted) and everything below
	ring     []byte
	esz      int
	mask     uint32
	db       *uint32
	pc       uint16 // WQEs written, modulo 2^16
	phase    uint8  // phase bit of the WQE at pc
	rung     uint16 // pc at the last doorbell
	maxBatch int
	reqID64  bool
	sess     session
}

type recvQ struct {
	*wq               // replaced by a move to RESET
	mu     sync.Mutex // guards wq (the pointer and wq.posted) and everything below
	ring   []byte
	mask   uint32 // descriptors - 1
	db     *uint32
	pc     uint16 // descriptors written, modulo 2^16
	maxSGE int
}

// CreateQP creates a UD QP in pd (ibv_create_qp) and writes the rounded queue sizes back into
// attr.Cap. Other QP types are EOPNOTSUPP; SRD QPs come from package efadv.
func (pd *PD) CreateQP(attr *QPInitAttr) (*QP, error) {
	if pd == nil || attr == nil {
		return nil, fmt.Errorf("verbs: create QP with a nil PD or attributes: %w", syscall.EINVAL)
	}
	ex := pd.exAttr(attr)
	qp, err := pd.ctx.createQP(&ex, nil)
	attr.Cap = ex.Cap
	return qp, err
}

// createDriverQP is PD.CreateQP with EFA's driver attributes, for efadv_create_driver_qp.
func (pd *PD) createDriverQP(attr *QPInitAttr, drv *provider.QPAttr) (*QP, error) {
	if pd == nil || attr == nil {
		return nil, fmt.Errorf("verbs: create QP with a nil PD or attributes: %w", syscall.EINVAL)
	}
	ex := pd.exAttr(attr)
	qp, err := pd.ctx.createQP(&ex, drv)
	attr.Cap = ex.Cap
	return qp, err
}

func (pd *PD) exAttr(a *QPInitAttr) QPInitAttrEx {
	return QPInitAttrEx{
		QPContext: a.QPContext, SendCQ: a.SendCQ, RecvCQ: a.RecvCQ, Cap: a.Cap, QPType: a.QPType,
		SQSigAll: a.SQSigAll, CompMask: QPInitAttrPD, PD: pd,
	}
}

// CreateQPEx creates a UD QP (ibv_create_qp_ex) and writes the rounded queue sizes back into
// attr.Cap. With QPInitAttrSendOpsFlags the QP offers the QPEx iterator for those opcodes.
func (c *Context) CreateQPEx(attr *QPInitAttrEx) (*QP, error) { return c.createQP(attr, nil) }

// createQP is libefa's create_qp: its checks in its order, then the queue sizing, then the
// device's create command. drv is nil for ibv_create_qp(_ex), the EFA part for efadv's.
func (c *Context) createQP(attr *QPInitAttrEx, drv *provider.QPAttr) (*QP, error) {
	if c == nil || attr == nil {
		return nil, fmt.Errorf("verbs: create QP with a nil context or attributes: %w", syscall.EINVAL)
	}
	cfg := &c.cfg
	var d provider.QPAttr
	if drv != nil {
		d = *drv
	}
	if err := c.checkQP(attr, drv); err != nil {
		return nil, err
	}
	wqeSize := efaio.TxWQESize
	if attr.Cap.MaxInlineData > efaio.TxInlineMax || d.Flags&uapi.DVQPFlagInlineWrite != 0 {
		wqeSize = efaio.TxWQESize128
	}
	recvSGE := max(attr.Cap.MaxRecvSGE, 1)
	switch {
	case attr.Cap.MaxSendSGE > uint32(cfg.MaxSQSGE):
		return nil, fmt.Errorf("verbs: max_send_sge %d over %d: %w", attr.Cap.MaxSendSGE, cfg.MaxSQSGE, syscall.EINVAL)
	case attr.Cap.MaxRecvSGE > uint32(cfg.MaxRQSGE):
		return nil, fmt.Errorf("verbs: max_recv_sge %d over %d: %w", attr.Cap.MaxRecvSGE, cfg.MaxRQSGE, syscall.EINVAL)
	case attr.Cap.MaxSendWR > rounddownPow2(uint32(cfg.MaxLLQSize/wqeSize)):
		return nil, fmt.Errorf("verbs: max_send_wr %d over %d with %d-byte WQEs: %w",
			attr.Cap.MaxSendWR, rounddownPow2(uint32(cfg.MaxLLQSize/wqeSize)), wqeSize, syscall.EINVAL)
	case attr.Cap.MaxRecvWR > uint32(cfg.MaxRQWR)/recvSGE:
		return nil, fmt.Errorf("verbs: max_recv_wr %d over %d with %d SGEs: %w",
			attr.Cap.MaxRecvWR, uint32(cfg.MaxRQWR)/recvSGE, recvSGE, syscall.EINVAL)
	case attr.Cap.MaxInlineData > uint32(cfg.InlineBufSizeEx):
		return nil, fmt.Errorf("verbs: max_inline_data %d over %d: %w", attr.Cap.MaxInlineData, cfg.InlineBufSizeEx, syscall.EINVAL)
	}
	sqCnt := roundPow2(max(attr.Cap.MaxSendWR, uint32(cfg.MinSQWR)))
	rqDesc := roundPow2(recvSGE * max(attr.Cap.MaxRecvWR, 1))
	rqCnt := rqDesc / recvSGE
	maxBatch := 65535
	if cfg.MaxTxBatch > 0 {
		maxBatch = cfg.MaxTxBatch * 64 / wqeSize
	}
	if cfg.MinSQWR > 0 {
		maxBatch = min(maxBatch, int(sqCnt)-1)
	}
	attr.Cap.MaxSendWR, attr.Cap.MaxRecvWR = sqCnt, rqCnt

	if err := c.hold(); err != nil {
		return nil, err
	}
	qp := &QP{
		ctx: c, pd: attr.PD, typ: attr.QPType, sendCQ: attr.SendCQ, recvCQ: attr.RecvCQ,
		sqSigAll: attr.SQSigAll, cap: attr.Cap, drv: d, userCtx: attr.QPContext,
	}
	if attr.CompMask&QPInitAttrSendOpsFlags != 0 {
		qp.sendOps = attr.SendOpsFlags
	}
	in := engine.QPInit{
		Type: int(attr.QPType), DriverType: int(d.DriverQPType), PD: attr.PD.e,
		SendCQ: attr.SendCQ.e, RecvCQ: attr.RecvCQ.e,
		Caps: engine.QPCaps{
			MaxSendWR: int(sqCnt), MaxRecvWR: int(rqCnt), MaxSendSGE: int(attr.Cap.MaxSendSGE),
			MaxRecvSGE: int(attr.Cap.MaxRecvSGE), MaxInlineData: int(attr.Cap.MaxInlineData),
		},
		SQEntries: int(sqCnt), SQEntrySize: wqeSize, RQEntries: int(rqDesc), SL: d.SL, Owner: qp,
	}
	if d.Flags&uapi.DVQPFlagUnsolicitedWriteRecv != 0 {
		in.Flags |= uapi.QPFlagUnsolicitedWriteRecv
	}
	if cfg.RequestID64 {
		in.Flags |= uapi.QPFlagSQ64BitReqID
	}
	e, err := c.e.CreateQP(in)
	if err != nil {
		c.release()
		return nil, err
	}
	qp.e, qp.qpn = e, e.QPN()
	qp.sq = sendQ{ring: e.SQRing(), esz: wqeSize, mask: sqCnt - 1, db: e.SQDoorbell(), maxBatch: max(maxBatch, 1),
		reqID64: cfg.RequestID64}
	qp.sq.sess.idx = make([]uint16, 0, sqCnt)
	qp.rq = recvQ{ring: e.RQRing(), mask: rqDesc - 1, db: e.RQDoorbell(), maxSGE: int(recvSGE)}
	qp.newBooks(sqCnt, rqCnt)
	if qp.sendOps != 0 {
		qp.ex = &QPEx{qp: qp}
	}
	c.qps[qp.qpn].Store(qp)
	return qp, nil
}

// checkQP applies libefa's create_qp checks in their order (rdma-core providers/efa/verbs.c:
// efa_check_qp_attr, then efa_check_qp_limits, with the device's inline and depth limits).
func (c *Context) checkQP(attr *QPInitAttrEx, drv *provider.QPAttr) error {
	caps := c.cfg.Caps
	switch {
	case drv == nil && attr.QPType != QPTUD:
		return fmt.Errorf("verbs: QP type %d: only UD without efadv: %w", attr.QPType, syscall.EOPNOTSUPP)
	case drv != nil && attr.QPType == QPTDriver && drv.DriverQPType != uapi.DriverQPTypeSRD:
		return fmt.Errorf("verbs: driver QP type %d: %w", drv.DriverQPType, syscall.EOPNOTSUPP)
	case drv != nil && attr.QPType != QPTDriver && attr.QPType != QPTUD:
		return fmt.Errorf("verbs: QP type %d: %w", attr.QPType, syscall.EOPNOTSUPP)
	}
	if drv != nil {
		f := drv.Flags
		switch {
		case f&^(uapi.DVQPFlagUnsolicitedWriteRecv|uapi.DVQPFlagInlineWrite) != 0,
			f&uapi.DVQPFlagInlineWrite != 0 && caps&uapi.CapRDMAWrite == 0,
			f&uapi.DVQPFlagUnsolicitedWriteRecv != 0 && caps&uapi.CapUnsolicitedWriteRecv == 0:
			return fmt.Errorf("verbs: EFA QP flags %#x: %w", f, syscall.EOPNOTSUPP)
		}
	}
	switch {
	case attr.CompMask&^(QPInitAttrPD|QPInitAttrSendOpsFlags) != 0:
		return fmt.Errorf("verbs: QP comp_mask %#x: %w", attr.CompMask, syscall.EOPNOTSUPP)
	case attr.CompMask&QPInitAttrPD == 0 || attr.PD == nil:
		return fmt.Errorf("verbs: QP without a PD: %w", syscall.EINVAL)
	}
	if attr.CompMask&QPInitAttrSendOpsFlags != 0 {
		allowed := SendOpsSend | SendOpsSendWithImm
		if attr.QPType == QPTDriver {
			if caps&uapi.CapRDMARead != 0 {
				allowed |= SendOpsRDMARead
			}
			if caps&uapi.CapRDMAWrite != 0 {
				allowed |= SendOpsRDMAWrite | SendOpsRDMAWriteWithImm
			}
		}
		if attr.SendOpsFlags&^allowed != 0 {
			return fmt.Errorf("verbs: send_ops_flags %#x not offered by this QP type and device: %w",
				attr.SendOpsFlags&^allowed, syscall.EOPNOTSUPP)
		}
	}
	switch {
	case drv != nil && drv.WRFlags&^uapi.DVWRExWithProcessingHints != 0:
		return fmt.Errorf("verbs: EFA wr_flags %#x: %w", drv.WRFlags, syscall.EOPNOTSUPP)
	case attr.SendCQ == nil || attr.RecvCQ == nil:
		return fmt.Errorf("verbs: QP needs a send CQ and a receive CQ: %w", syscall.EINVAL)
	case attr.SendCQ.ctx != c || attr.RecvCQ.ctx != c || attr.PD.ctx != c:
		return fmt.Errorf("verbs: QP with a PD or CQ of another context: %w", syscall.EINVAL)
	case attr.CreateFlags != 0:
		return fmt.Errorf("verbs: QP create_flags %#x: %w", attr.CreateFlags, syscall.EOPNOTSUPP)
	}
	return nil
}

// QPN returns the QP number (ibv_qp.qp_num), below 65536 as EFA descriptors require.
func (qp *QP) QPN() uint32 { return qp.qpn }

// Type returns the QP type.
func (qp *QP) Type() QPType { return qp.typ }

// State returns the state recorded after the last successful Modify (ibv_qp.state).
func (qp *QP) State() QPState { return QPState(qp.state.Load()) }

// Context returns the QP's context.
func (qp *QP) Context() *Context { return qp.ctx }

// PD returns the QP's protection domain.
func (qp *QP) PD() *PD { return qp.pd }

// UserContext returns the qp_context given at creation.
func (qp *QP) UserContext() any { return qp.userCtx }

// QPAttr holds the attributes of Modify and Query (struct ibv_qp_attr). An EFA QP takes state,
// current state, EnSQDAsyncNotify, pkey index (0), port (1), qkey, SQ PSN and RNR retry; the
// other fields exist so that a mask naming them gets EFA's answer (EOPNOTSUPP).
type QPAttr struct {
	QPState          QPState
	CurQPState       QPState
	PathMTU          MTU
	QKey             uint32
	RQPSN            uint32
	SQPSN            uint32
	DestQPNum        uint32
	QPAccessFlags    AccessFlags
	Cap              QPCap
	AHAttr           AHAttr
	PKeyIndex        uint16
	EnSQDAsyncNotify bool
	SQDraining       bool
	PortNum          uint8
	Timeout          uint8
	RetryCnt         uint8
	RNRRetry         uint8
	MinRNRTimer      uint8
}

// Modify changes the QP's state and attributes (ibv_modify_qp) under EFA's state table for SRD
// QPs and IB's for UD QPs: EOPNOTSUPP for attributes EFA lacks, a port other than 1 or a pkey
// index other than 0; EINVAL for a transition or attribute set the table refuses. Moving to
// RESET empties both queues without completions (those already in a CQ are polled with their
// own wr_ids, as WRs of the QP's life before the reset); moving to ERR completes every
// outstanding WR with WCWRFlushErr. A nil attr or a destroyed QP is EINVAL; an open QPEx
// session (WRStart without WRComplete or WRAbort) is EBUSY.
func (qp *QP) Modify(attr *QPAttr, mask QPAttrMask) error {
	if attr == nil {
		return fmt.Errorf("verbs: modify QP with nil attributes: %w", syscall.EINVAL)
	}
	a := engine.QPAttr{
		State: int(attr.QPState), CurState: int(attr.CurQPState), EnSQDAsyncNotify: attr.EnSQDAsyncNotify,
		PKeyIndex: attr.PKeyIndex, Port: attr.PortNum, QKey: attr.QKey, SQPSN: attr.SQPSN,
		RNRRetry: attr.RNRRetry,
	}
	if err := qp.lockQueues("modify"); err != nil {
		return err
	}
	defer qp.unlockQueues()
	if err := qp.ctx.e.ModifyQP(qp.e, &a, int(mask)); err != nil {
		return err
	}
	if mask&QPAttrState == 0 {
		return nil
	}
	qp.state.Store(int32(attr.QPState))
	if attr.QPState == QPSReset {
		qp.sq.pc, qp.sq.rung = 0, 0
		qp.rq.pc = 0
		qp.renew()
	}
	return nil
}

// renew empties the request-id books after a move to RESET, with both queue locks held. WRs
// posted and not yet polled may have completions in the CQs, which the device wrote before the
// reset (it writes none after): then the old books are buried in the CQs, fenced at what the
// device has written, and the queues get new ones. Those entries then complete their own WRs and
// count against the old books, not against WRs posted after the reset, which may have the same
// request id (the same index of a 16-bit id, any 64-bit wr_id).
func (qp *QP) renew() {
	if !qp.sq.busy() && !qp.rq.busy() {
		qp.sq.reset()
		qp.rq.reset()
		return
	}
	qp.sendCQ.bury(qp, qp.sendCQ.produced(), false)
	qp.recvCQ.bury(qp, qp.recvCQ.produced(), false)
	qp.newBooks(qp.sq.cnt, qp.rq.cnt) // after the graves: polling reads the books before them (CQ.next)
}

// newBooks gives the queues empty request-id books for sq and rq WRs and publishes them for
// polling.
func (qp *QP) newBooks(sq, rq uint32) {
	qp.sq.wq, qp.rq.wq = new(wq), new(wq)
	qp.sq.init(sq, qp.e.Gen())
	qp.rq.init(rq, qp.e.Gen())
	qp.books.Store(&qpRef{sq: qp.sq.wq, rq: qp.rq.wq, reqID64: qp.sq.reqID64, ud: qp.typ == QPTUD})
}

// queryMask is what efa_query_qp answers; anything else is EOPNOTSUPP.
const queryMask = QPAttrState | QPAttrPKeyIndex | QPAttrPort | QPAttrQKey | QPAttrSQPSN | QPAttrCap | QPAttrRNRRetry

// Query returns the QP's attributes (ibv_query_qp): state, qkey, SQ PSN, RNR retry, port 1, pkey
// index 0, SQ draining, and the queue sizes as rounded at creation. A mask beyond those is
// EOPNOTSUPP; a destroyed QP is EINVAL.
func (qp *QP) Query(mask QPAttrMask) (QPAttr, QPInitAttr, error) {
	if qp.dead.Load() {
		return QPAttr{}, QPInitAttr{}, qp.errDead("query")
	}
	if mask&^queryMask != 0 {
		return QPAttr{}, QPInitAttr{}, fmt.Errorf("verbs: query mask %#x: %w", mask&^queryMask, syscall.EOPNOTSUPP)
	}
	a, _ := qp.ctx.e.QueryQP(qp.e)
	attr := QPAttr{
		QPState: QPState(a.State), CurQPState: QPState(a.State), QKey: a.QKey, SQPSN: a.SQPSN,
		PKeyIndex: a.PKeyIndex, PortNum: 1, RNRRetry: a.RNRRetry, SQDraining: a.SQDraining,
		EnSQDAsyncNotify: a.EnSQDAsyncNotify, Cap: qp.cap,
	}
	init := QPInitAttr{QPContext: qp.userCtx, SendCQ: qp.sendCQ, RecvCQ: qp.recvCQ, Cap: qp.cap,
		QPType: qp.typ, SQSigAll: qp.sqSigAll}
	return attr, init, nil
}

// Destroy destroys the QP (ibv_destroy_qp) in any state. Work requests still outstanding get no
// completion: the device writes flush entries for them, and polling drops those and any other
// entry the QP left unpolled (EINVAL, CQ.BadCompletions), as libefa does, so that a QP given the
// number later never sees them under its own. Poll before destroying to see them. It takes both
// queue locks (waiting for a post under way); with a QPEx session open it fails with EBUSY and
// changes nothing (end the session first). Afterwards every post, QPEx session, Modify, Query
// and a second Destroy are EINVAL.
func (qp *QP) Destroy() error {
	if err := qp.lockQueues("destroy"); err != nil {
		return err
	}
	defer qp.unlockQueues()
	if err := qp.ctx.e.DestroyQP(qp.e); err != nil {
		return err
	}
	qp.dead.Store(true)
	// The entries it left, with the flush completions the device just wrote, are marked in the
	// CQs' graves to be dropped; the number is free for the next QP, and nothing of this one
	// stays reachable from the context.
	sendFence, recvFence := qp.e.Fences()
	qp.sendCQ.bury(qp, sendFence, true)
	qp.recvCQ.bury(qp, recvFence, true)
	qp.ctx.qps[qp.qpn].CompareAndSwap(qp, nil)
	qp.ctx.release()
	return nil
}

// lockQueues takes both queue locks, the send queue's first (the order Modify and Destroy
// share), for op; on a destroyed QP it takes none and returns EINVAL.
//
// With a QPEx session open it takes none and returns EBUSY: the session holds the send queue's
// lock until WRComplete or WRAbort, and a caller that opened it itself would wait for ever.
func (qp *QP) lockQueues(op string) error {
	if qp.sq.sess.active.Load() {
		return fmt.Errorf("verbs: %s of QP %d while a QPEx session is open (WRStart without WRComplete or WRAbort): %w",
			op, qp.qpn, syscall.EBUSY)
	}
	qp.sq.mu.Lock()
	qp.rq.mu.Lock()
	if qp.dead.Load() {
		qp.unlockQueues()
		return qp.errDead(op)
	}
	return nil
}

func (qp *QP) unlockQueues() {
	qp.rq.mu.Unlock()
	qp.sq.mu.Unlock()
}

// errDead is the error of an operation on a destroyed QP: EINVAL, as libibverbs gives for a
// handle the kernel no longer knows.
func (qp *QP) errDead(op string) error {
	return fmt.Errorf("verbs: %s on destroyed QP %d: %w", op, qp.qpn, syscall.EINVAL)
}

func roundPow2(n uint32) uint32 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len32(n-1)
}

func rounddownPow2(n uint32) uint32 {
	if n == 0 {
		return 0
	}
	return 1 << (bits.Len32(n) - 1)
}

// QPCounters are one QP's counters. RecvWRs counts the receive WRs an RDMA write with immediate
// took as well as those of SENDs; RecvBytes only the latter's bytes.
type QPCounters struct {
	SendWRs, SendBytes, RecvWRs, RecvBytes                   uint64
	RDMAReadWRs, RDMAReadBytes, RDMAWriteWRs, RDMAWriteBytes uint64
	WRErrors                                                 uint64
}

// Counters returns a snapshot of the QP's counters.
func (qp *QP) Counters() QPCounters { return QPCounters(qp.e.Counters()) }
