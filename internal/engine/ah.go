package engine

import (
	"fmt"
	"syscall"

	"github.com/softefa/softefa/efaio"
)

// AH is an address handle: a destination GID with a 16-bit number in its PD. Creating an AH for
// a GID the PD already has one for returns the same AH with one more reference, as EFA's device
// keys AHs by address; the number is freed when the last reference goes.
type AH struct {
	pd   *PD
	ahn  uint16
	gid  [16]byte
	refs int
}

// AHN returns the AH's number, the value a WQE carries and efadv_query_ah reports.
func (ah *AH) AHN() uint16 { return ah.ahn }

// GID returns the destination address.
func (ah *AH) GID() [16]byte { return ah.gid }

// ahTable holds a PD's AHs. Numbers are handed out cyclically so that a destroyed AH's number is
// not reused at once (a WR that still names it fails with INVALID_AH); 0xffff is never used, as
// RX CQEs use it for "unknown".
type ahTable struct {
	byNum map[uint16]*AH
	byGID map[[16]byte]*AH
	next  uint16
}

func (t *ahTable) init() {
	t.byNum = make(map[uint16]*AH)
	t.byGID = make(map[[16]byte]*AH)
}

// CreateAH creates (or references) the AH for gid in pd. EINVAL for the zero GID, ENOMEM past
// MaxAH.
func (d *Device) CreateAH(pd *PD, gid [16]byte) (*AH, error) {
	if gid == ([16]byte{}) {
		return nil, fmt.Errorf("engine: AH for the zero GID: %w", syscall.EINVAL)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pds[pd.pdn] != pd {
		return nil, fmt.Errorf("engine: PD %d is not allocated: %w", pd.pdn, syscall.EINVAL)
	}
	t := &pd.ahs
	if ah := t.byGID[gid]; ah != nil {
		ah.refs++
		return ah, nil
	}
	if d.nAH >= d.cfg.MaxAH || len(t.byNum) >= efaio.UnknownAH {
		return nil, fmt.Errorf("engine: %d AHs, the device maximum: %w", d.nAH, syscall.ENOMEM)
	}
	n := t.next
	for {
		n++
		if n != efaio.UnknownAH && t.byNum[n] == nil {
			break
		}
	}
	t.next = n
	ah := &AH{pd: pd, ahn: n, gid: gid, refs: 1}
	t.byNum[n] = ah
	t.byGID[gid] = ah
	d.nAH++
	pd.refs++
	return ah, nil
}

// DestroyAH drops one reference to ah; the last one frees its number. Work requests that name
// the number afterwards complete with INVALID_AH.
func (d *Device) DestroyAH(ah *AH) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if ah.refs <= 0 {
		return fmt.Errorf("engine: AH %d already destroyed: %w", ah.ahn, syscall.EINVAL)
	}
	ah.refs--
	if ah.refs > 0 {
		return nil
	}
	delete(ah.pd.ahs.byNum, ah.ahn)
	delete(ah.pd.ahs.byGID, ah.gid)
	d.nAH--
	ah.pd.refs--
	return nil
}

// ahnFor returns the number of pd's AH for gid, or UnknownAH.
func (pd *PD) ahnFor(gid [16]byte) uint16 {
	if ah := pd.ahs.byGID[gid]; ah != nil {
		return ah.ahn
	}
	return efaio.UnknownAH
}
