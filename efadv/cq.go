package efadv

import (
	"fmt"
	"syscall"

	"github.com/softefa/softefa/verbs"
)

// CQInitAttr is struct efadv_cq_init_attr without the external-memory descriptor, which this
// device does not offer (no CQ_WITH_EXT_MEM_DMABUF cap).
type CQInitAttr struct {
	CompMask uint64
	WCFlags  WCExFlags
	Flags    CQInitFlags
}

// CreateCQ creates an extended CQ with EFA's completion fields (efadv_create_cq): WCExWithSGID
// (needs the CQ_WITH_SGID cap) and WCExWithIsUnsolicited (needs UNSOLICITED_WRITE_RECV); other
// wc_flags are EOPNOTSUPP, a non-zero CompMask EINVAL. Unknown Flags bits are ignored, as in
// libefa, but CQInitFlagsExtMemDMABuf is EOPNOTSUPP: the device has no such memory.
func CreateCQ(ctx *verbs.Context, attr *verbs.CQInitAttrEx, efa *CQInitAttr) (*verbs.CQ, error) {
	return CreateCQLen(ctx, attr, efa, SizeofCQInitAttr)
}

// CreateCQLen is CreateCQ with libefa's inlen rule: inlen must be over 8; fields beyond inlen
// read as zero.
func CreateCQLen(ctx *verbs.Context, attr *verbs.CQInitAttrEx, efa *CQInitAttr, inlen int) (*verbs.CQ, error) {
	if inlen <= 8 {
		return nil, errInlen("create_cq", inlen, 8)
	}
	if ctx == nil || attr == nil || efa == nil {
		return nil, errNil("create_cq", "context or attributes")
	}
	if efa.CompMask != 0 {
		return nil, fmt.Errorf("efadv: comp_mask %#x: %w", efa.CompMask, syscall.EINVAL)
	}
	var wcFlags WCExFlags
	var flags CQInitFlags
	if inlen > 8 {
		wcFlags = efa.WCFlags
	}
	if inlen > 16 {
		flags = efa.Flags
	}
	caps := deviceCaps(ctx)
	var supported WCExFlags
	if caps&DeviceAttrCapsCQWithSGID != 0 {
		supported |= WCExWithSGID
	}
	if caps&DeviceAttrCapsUnsolicitedWriteRecv != 0 {
		supported |= WCExWithIsUnsolicited
	}
	if wcFlags&^supported != 0 {
		return nil, fmt.Errorf("efadv: wc_flags %#x not supported: %w", wcFlags&^supported, syscall.EOPNOTSUPP)
	}
	if flags&CQInitFlagsExtMemDMABuf != 0 {
		return nil, fmt.Errorf("efadv: CQ on external dmabuf memory: %w", syscall.EOPNOTSUPP)
	}
	return createCQ(ctx, attr, wcFlags&WCExWithSGID != 0, wcFlags&WCExWithIsUnsolicited != 0)
}

// CQ is the EFA part of an extended CQ (struct efadv_cq), from CQFromIBVCQEx.
type CQ struct {
	CompMask uint64
	cq       *verbs.CQ
}

// CQFromIBVCQEx returns the EFA part of an extended CQ (efadv_cq_from_ibv_cq_ex).
func CQFromIBVCQEx(cq *verbs.CQ) *CQ { return &CQ{cq: cq} }

// WCReadSGID returns the source GID of the current receive completion (efadv_wc_read_sgid) when
// the receiving PD has no AH for the sender; ENOENT when it has one, EOPNOTSUPP when the CQ was
// created without WCExWithSGID (where libefa's NULL function pointer would crash).
func WCReadSGID(c *CQ) (verbs.GID, error) { return readSGID(c.cq) }

// WCIsUnsolicited reports whether the current receive completion is an RDMA write with immediate
// that consumed no receive WR (efadv_wc_is_unsolicited). False on a CQ created without
// WCExWithIsUnsolicited.
func WCIsUnsolicited(c *CQ) bool { return isUnsolicited(c.cq) }

// CQAttr is struct efadv_cq_attr: the CQ's ring of 32-byte completion entries and its doorbell.
type CQAttr struct {
	CompMask   uint64
	Buffer     []byte
	EntrySize  uint32
	NumEntries uint32
	Doorbell   *uint32
}

// QueryCQ returns the CQ's ring (efadv_query_cq). A program may read completions itself: an
// entry is valid when its phase bit (bit 0 of byte 3; load bytes 0..3 atomically) equals the
// expected phase, which starts at 1 and flips at each wrap. It must store its running count of
// consumed entries into the doorbell's low 16 bits, or the device will find the ring full.
func QueryCQ(cq *verbs.CQ) (CQAttr, error) { return QueryCQLen(cq, SizeofCQAttr) }

// QueryCQLen is QueryCQ with libefa's inlen rules: inlen must be over 20; the doorbell is
// reported past 24.
func QueryCQLen(cq *verbs.CQ, inlen int) (CQAttr, error) {
	if inlen <= 20 {
		return CQAttr{}, errInlen("query_cq", inlen, 20)
	}
	if cq == nil {
		return CQAttr{}, errNil("query_cq", "CQ")
	}
	buf, esz, n, db := cqRing(cq)
	a := CQAttr{Buffer: buf, EntrySize: uint32(esz), NumEntries: uint32(n)}
	if inlen > 24 {
		a.Doorbell = db
	}
	return a, nil
}
