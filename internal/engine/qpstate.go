package engine

import (
	"fmt"
	"syscall"

	"github.com/softefa/softefa/internal/uapi"
)

// transition is one cell of a QP state table: whether the move is allowed and which attributes
// it requires and may take (besides STATE).
type transition struct {
	valid    bool
	req, opt int
}

const nStates = uapi.QPSErr + 1

// udTable is the IB core's table for UD QPs (ib_modify_qp_is_ok, qp_state_table).
var udTable = buildTable(false)

// srdTable is EFA's srd_qp_state_table: the UD table plus RNR_RETRY at RTR→RTS.
var srdTable = buildTable(true)

func buildTable(srd bool) [nStates][nStates]transition {
	const (
		reset, init, rtr, rts, sqd, sqe, errS = uapi.QPSReset, uapi.QPSInit, uapi.QPSRTR,
			uapi.QPSRTS, uapi.QPSSQD, uapi.QPSSQE, uapi.QPSErr
		pkey, port, qkey, cur = uapi.QPAttrPKeyIndex, uapi.QPAttrPort, uapi.QPAttrQKey, uapi.QPAttrCurState
	)
	var t [nStates][nStates]transition
	ok := transition{valid: true}
	for s := range nStates {
		if s != reset {
			t[s][reset], t[s][errS] = ok, ok
		}
	}
	t[reset][reset] = ok
	t[reset][init] = transition{true, pkey | port | qkey, 0}
	t[init][init] = transition{true, 0, pkey | port | qkey}
	t[init][rtr] = transition{true, 0, pkey | qkey}
	rtrRTS := transition{true, uapi.QPAttrSQPSN, cur | qkey}
	if srd {
		rtrRTS.opt |= uapi.QPAttrRNRRetry
	}
	t[rtr][rts] = rtrRTS
	t[rts][rts] = transition{true, 0, cur | qkey}
	t[rts][sqd] = transition{true, 0, uapi.QPAttrEnSQDAsyncNotify}
	t[sqd][rts] = transition{true, 0, cur | qkey}
	t[sqd][sqd] = transition{true, 0, pkey | qkey}
	t[sqe][rts] = transition{true, 0, cur | qkey}
	return t
}

// supportedModifyMask is the attribute mask efa_modify_qp takes; anything else is EOPNOTSUPP.
const supportedModifyMask = uapi.QPAttrState | uapi.QPAttrCurState | uapi.QPAttrEnSQDAsyncNotify |
	uapi.QPAttrPKeyIndex | uapi.QPAttrPort | uapi.QPAttrQKey | uapi.QPAttrSQPSN | uapi.QPAttrRNRRetry

// QPAttr carries the attributes of ibv_modify_qp and ibv_query_qp that an EFA QP has.
type QPAttr struct {
	State            int
	CurState         int
	EnSQDAsyncNotify bool
	PKeyIndex        uint16
	Port             uint8
	QKey             uint32
	SQPSN            uint32
	RNRRetry         uint8
	SQDraining       bool
}

// checkModify applies efa_modify_qp_validate and ib_modify_qp_is_ok: the supported mask, the
// state table's required and optional attributes, the port and pkey index, in that order.
func checkModify(typ, state int, a *QPAttr, mask int) (next int, err error) {
	if mask&^supportedModifyMask != 0 {
		return 0, fmt.Errorf("engine: modify mask %#x has attributes EFA QPs lack: %w",
			mask&^supportedModifyMask, syscall.EOPNOTSUPP)
	}
	cur := state
	if mask&uapi.QPAttrCurState != 0 {
		cur = a.CurState
		if cur != uapi.QPSRTR && cur != uapi.QPSRTS && cur != uapi.QPSSQD && cur != uapi.QPSSQE {
			return 0, fmt.Errorf("engine: CUR_STATE %d given outside RTR, RTS, SQD and SQE: %w", cur, syscall.EINVAL)
		}
	}
	next = cur
	if mask&uapi.QPAttrState != 0 {
		next = a.State
	}
	if cur < 0 || cur >= nStates || next < 0 || next >= nStates {
		return 0, fmt.Errorf("engine: QP state %d→%d unknown: %w", cur, next, syscall.EINVAL)
	}
	table := &udTable
	if typ == uapi.QPTypeDriver {
		table = &srdTable
	}
	tr := table[cur][next]
	switch {
	case !tr.valid:
		return 0, fmt.Errorf("engine: QP state %s→%s not allowed: %w", stateName(cur), stateName(next), syscall.EINVAL)
	case mask&tr.req != tr.req:
		return 0, fmt.Errorf("engine: %s→%s requires attributes %#x, mask has %#x: %w",
			stateName(cur), stateName(next), tr.req, mask, syscall.EINVAL)
	case mask&^(tr.req|tr.opt|uapi.QPAttrState) != 0:
		return 0, fmt.Errorf("engine: %s→%s does not take attributes %#x: %w",
			stateName(cur), stateName(next), mask&^(tr.req|tr.opt|uapi.QPAttrState), syscall.EINVAL)
	case mask&uapi.QPAttrPort != 0 && a.Port != 1:
		return 0, fmt.Errorf("engine: port %d; the device has port 1 only: %w", a.Port, syscall.EOPNOTSUPP)
	case mask&uapi.QPAttrPKeyIndex != 0 && a.PKeyIndex != 0:
		return 0, fmt.Errorf("engine: pkey index %d; the device has index 0 only: %w", a.PKeyIndex, syscall.EOPNOTSUPP)
	case mask&uapi.QPAttrRNRRetry != 0 && a.RNRRetry > uapi.RNRRetryInfinite:
		return 0, fmt.Errorf("engine: rnr_retry %d over 7: %w", a.RNRRetry, syscall.EINVAL)
	}
	return next, nil
}

func stateName(s int) string {
	names := [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN"}
	if s >= 0 && s < len(names) {
		return names[s]
	}
	return fmt.Sprintf("state(%d)", s)
}
