//go:build linux

package uverbs

import (
	"syscall"
	"unsafe"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/uapi"
)

// createQP is CREATE_QP (ib_uverbs_create_qp, efa_create_qp). Checks in the kernel's order:
// unknown PD or CQ handles, or an SRQ (EINVAL, core); caps above the device maxima (EINVAL);
// QP types other than UD and DRIVER, or an SRQ (EOPNOTSUPP); the driver command shorter than
// driver_qp_type, with unknown non-zero fields, a comp_mask or reserved bytes (EINVAL); unknown
// flags or a driver QP type other than SRD (EOPNOTSUPP). The SQ (LLQ) ring, the RQ ring and a
// doorbell page holding both doorbells are regions of the command fd.
func (f *File) createQP(c *call) error {
	if err := f.admit(kindQP); err != nil {
		return err
	}
	req, err := c.request(createQPReq)
	if err != nil {
		return err
	}
	pdo, okPD := lookup[*pdObj](f, u32(req, 16))
	scq, okS := lookup[*cqObj](f, u32(req, 20))
	rcq, okR := lookup[*cqObj](f, u32(req, 24))
	isSRQ := req[54] != 0
	if !okPD || !okS || !okR || isSRQ {
		return syscall.EINVAL // no SRQ objects exist, so an SRQ handle never resolves
	}
	cfg := &f.d.cfg
	caps := engine.QPCaps{
		MaxSendWR: int(u32(req, 32)), MaxRecvWR: int(u32(req, 36)), MaxSendSGE: int(u32(req, 40)),
		MaxRecvSGE: int(u32(req, 44)), MaxInlineData: int(u32(req, 48)),
	}
	if caps.MaxSendWR > cfg.MaxSQWR || caps.MaxRecvWR > cfg.MaxRQWR || caps.MaxSendSGE > cfg.MaxSQSGE ||
		caps.MaxRecvSGE > cfg.MaxRQSGE || caps.MaxInlineData > cfg.InlineBufSizeEx {
		return syscall.EINVAL
	}
	typ := int(req[53])
	if typ != uapi.QPTypeUD && typ != uapi.QPTypeDriver {
		return syscall.EOPNOTSUPP
	}
	cmd, err := c.driverCmd(efaCreateQPCmdSize, efaCreateQPCmdMin)
	if err != nil {
		return err
	}
	rqSize, sqSize, drvType := int(u32(cmd, 4)), int(u32(cmd, 8)), int(u32(cmd, 12))
	flags, sl := u16(cmd, 16), cmd[18]
	if u32(cmd, 0) != 0 || !cleared(cmd[19:24]) {
		return syscall.EINVAL
	}
	if flags&^(uapi.QPFlagUnsolicitedWriteRecv|uapi.QPFlagSQ64BitReqID) != 0 ||
		typ == uapi.QPTypeDriver && drvType != uapi.DriverQPTypeSRD {
		return syscall.EOPNOTSUPP
	}
	esz := efaio.TxWQESize
	if caps.MaxInlineData > cfg.InlineBufSize {
		esz = efaio.TxWQESize128
	}
	if sqSize <= 0 || sqSize%esz != 0 || rqSize < 0 || rqSize%efaio.RxDescSize != 0 ||
		sqSize > ringBytes(cfg.MaxSQWR, esz) || rqSize > ringBytes(cfg.MaxRQWR, efaio.RxDescSize*cfg.MaxRQSGE) {
		// Ring sizes come from the program (libefa: its WR count rounded up to a power of two,
		// times the entry size): the device's limits bound them, or a program could have the
		// device map gigabytes for one QP.
		return syscall.EINVAL
	}

	var keys []uint64
	fail := func(err error) error {
		f.freeKeys(keys)
		return err
	}
	sqKey, sqRing, err := f.reg.Alloc(sqSize)
	if err != nil {
		return fail(err)
	}
	keys = append(keys, sqKey)
	// The SQ and RQ doorbells live on pages of their own: the shim traps stores to the SQ's
	// (File.DoorbellPage), never to the RQ's. A receive post needs no engine step, since delivery
	// reads the RQ doorbell itself; trapping it made posting thousands of receives slow enough
	// that a sender's RNR retries filled the CQ before the program first read it (docs/cabi.md,
	// "Doorbells").
	dbKey, dbPage, err := f.reg.Alloc(userPageSize)
	if err != nil {
		return fail(err)
	}
	keys = append(keys, dbKey)
	rqDBKey, rqDBPage, err := f.reg.Alloc(userPageSize)
	if err != nil {
		return fail(err)
	}
	keys = append(keys, rqDBKey)
	in := engine.QPInit{
		Type: typ, DriverType: drvType, PD: pdo.pd, SendCQ: scq.cq, RecvCQ: rcq.cq, Caps: caps,
		SQEntries: sqSize / esz, SQEntrySize: esz, RQEntries: 1, Flags: int(flags), SL: sl, // efa_ibv_create_qp flags: the engine's own bits
		SQRing:     sqRing[:sqSize],
		SQDoorbell: (*uint32)(unsafe.Pointer(&dbPage[dbPageQPSQOffset])),
		RQDoorbell: (*uint32)(unsafe.Pointer(&rqDBPage[dbPageQPRQOffset])),
	}
	var rqKey uint64
	if rqSize > 0 {
		var rqRing []byte
		if rqKey, rqRing, err = f.reg.Alloc(rqSize); err != nil {
			return fail(err)
		}
		keys = append(keys, rqKey)
		in.RQEntries, in.RQRing = rqSize/efaio.RxDescSize, rqRing[:rqSize]
	}
	o := &qpObj{f: f, handle: u64(req, 8), typ: typ, sigAll: req[52] != 0, keys: keys, dbKey: dbKey}
	in.Owner = o
	qp, err := f.d.e.CreateQP(in)
	if err != nil {
		return fail(err)
	}
	o.qp = qp
	h := f.add(o)
	f.d.dbs.add(qp)

	resp := make([]byte, createQPResp)
	put32(resp, 0, h)
	put32(resp, 4, qp.QPN())
	put32(resp, 8, uint32(caps.MaxSendWR))
	put32(resp, 12, uint32(caps.MaxRecvWR))
	put32(resp, 16, uint32(caps.MaxSendSGE))
	put32(resp, 20, uint32(caps.MaxRecvSGE))
	put32(resp, 24, uint32(caps.MaxInlineData))
	drv := make([]byte, efaCreateQPRespSize)
	put32(drv, 4, dbPageQPRQOffset) // rq_db_offset
	put32(drv, 8, dbPageQPSQOffset) // sq_db_offset
	put32(drv, 12, 0)               // llq_desc_offset
	put64(drv, 16, rqKey)
	put64(drv, 24, uint64(roundPage(rqSize)))
	put64(drv, 32, rqDBKey) // rq_db_mmap_key
	put64(drv, 40, dbKey)   // sq_db_mmap_key
	put64(drv, 48, sqKey)   // llq_desc_mmap_key
	if err := f.respondDriver(c, drv); err == nil {
		if err = f.respond(c, resp); err == nil {
			return nil
		}
	}
	f.remove(h)
	f.d.dbs.remove(qp)
	_ = f.d.e.DestroyQP(qp)
	return fail(syscall.EFAULT)
}

// queryMask is what efa_query_qp answers; any other bit is EOPNOTSUPP.
const queryMask = uapi.QPAttrState | uapi.QPAttrPKeyIndex | uapi.QPAttrPort | uapi.QPAttrQKey |
	uapi.QPAttrSQPSN | uapi.QPAttrCap | uapi.QPAttrRNRRetry

// queryQP is QUERY_QP.
func (f *File) queryQP(c *call) error {
	req, err := c.request(queryQPReq)
	if err != nil {
		return err
	}
	o, ok := lookup[*qpObj](f, u32(req, 8))
	if !ok {
		return syscall.EINVAL
	}
	if u32(req, 12)&^queryMask != 0 {
		return syscall.EOPNOTSUPP
	}
	a, caps := f.d.e.QueryQP(o.qp)
	b := make([]byte, queryQPResp)
	put32(b, 64, uint32(caps.MaxSendWR))
	put32(b, 68, uint32(caps.MaxRecvWR))
	put32(b, 72, uint32(caps.MaxSendSGE))
	put32(b, 76, uint32(caps.MaxRecvSGE))
	put32(b, 80, uint32(caps.MaxInlineData))
	put32(b, 84, a.QKey)
	put32(b, 92, a.SQPSN)
	put16(b, 104, a.PKeyIndex)
	b[108] = uint8(a.State)
	b[109] = uint8(a.State) // cur_qp_state
	if a.SQDraining {
		b[112] = 1
	}
	b[116] = 1 // port_num
	b[119] = a.RNRRetry
	if o.sigAll {
		b[122] = 1
	}
	return f.respond(c, b)
}

// modifyQP is MODIFY_QP: the core rejects mask bits past the legacy set (EOPNOTSUPP), states
// beyond ERR and invalid ports (EINVAL); EFA rejects driver input (EINVAL); the engine applies
// efa_modify_qp's checks.
func (f *File) modifyQP(c *call) error {
	req, err := c.request(modifyQPReq)
	if err != nil {
		return err
	}
	mask := int(u32(req, 68))
	a := engine.QPAttr{
		QKey: u32(req, 72), SQPSN: u32(req, 80), PKeyIndex: u16(req, 92), State: int(req[96]),
		CurState: int(req[97]), EnSQDAsyncNotify: req[100] != 0, Port: req[104], RNRRetry: req[107],
	}
	switch {
	case mask&^uapi.QPAttrLegacyMask != 0:
		return syscall.EOPNOTSUPP
	case mask&uapi.QPAttrPort != 0 && a.Port != 1,
		mask&uapi.QPAttrCurState != 0 && a.CurState > uapi.QPSErr,
		mask&uapi.QPAttrState != 0 && a.State > uapi.QPSErr:
		return syscall.EINVAL
	}
	o, ok := lookup[*qpObj](f, u32(req, 64))
	if !ok || !c.udataCleared() {
		return syscall.EINVAL
	}
	return f.d.e.ModifyQP(o.qp, &a, mask)
}

// destroyQP is DESTROY_QP; the response counts the async events reported for the QP.
func (f *File) destroyQP(c *call) error {
	req, err := c.request(destroyQPReq)
	if err != nil {
		return err
	}
	h := u32(req, 8)
	o, ok := lookup[*qpObj](f, h)
	if !ok {
		return syscall.EINVAL
	}
	if err := f.d.e.DestroyQP(o.qp); err != nil {
		return err
	}
	o.dead = true
	f.d.dbs.remove(o.qp)
	f.freeKeys(o.keys)
	f.remove(h)
	resp := make([]byte, destroyQPResp)
	put32(resp, 0, o.asyncSent.Load()-f.discardAsync(o.handle))
	return f.respond(c, resp)
}

// ringBytes is the largest ring of entries of esz bytes a program may ask for when the device
// allows maxWR work requests: maxWR rounded up to a power of two, as libefa rounds.
func ringBytes(maxWR, esz int) int {
	n := 1
	for n < maxWR {
		n <<= 1
	}
	return n * esz
}
