package verbs

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/softefa/softefa/internal/engine"
)

// PD is a protection domain (struct ibv_pd).
type PD struct {
	ctx *Context
	e   *engine.PD
}

// AllocPD creates a protection domain (ibv_alloc_pd).
func (c *Context) AllocPD() (*PD, error) {
	if err := c.hold(); err != nil {
		return nil, err
	}
	e, err := c.e.AllocPD()
	if err != nil {
		c.release()
		return nil, err
	}
	return &PD{ctx: c, e: e}, nil
}

// Context returns the PD's context.
func (pd *PD) Context() *Context { return pd.ctx }

// PDN returns the PD's 16-bit number.
func (pd *PD) PDN() uint16 { return pd.e.PDN() }

// Dealloc frees the PD (ibv_dealloc_pd): EBUSY while MRs, QPs or AHs use it.
func (pd *PD) Dealloc() error {
	if err := pd.ctx.e.DeallocPD(pd.e); err != nil {
		return err
	}
	pd.ctx.release()
	return nil
}

// MR is a registered memory region (struct ibv_mr). Its addresses are IOVAs: by default the
// virtual address of the buffer's first byte, as ibv_reg_mr uses, so that Addr plus an offset
// is the address of that byte in work requests.
type MR struct {
	pd  *PD
	e   *engine.MR
	buf []byte
}

// RegMR registers buf for access by the device (ibv_reg_mr). The device keeps buf until Dereg;
// the caller must not let it go (it stays reachable through the MR). Access flags EFA lacks are
// EOPNOTSUPP; an empty buffer, or REMOTE_WRITE without LOCAL_WRITE, is EINVAL.
func (pd *PD) RegMR(buf []byte, access AccessFlags) (*MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("verbs: empty memory region: %w", syscall.EINVAL)
	}
	return pd.RegMRIOVA(buf, uint64(uintptr(unsafe.Pointer(&buf[0]))), access)
}

// RegMRIOVA registers buf at the given IOVA (ibv_reg_mr_iova): work requests address its first
// byte as iova.
func (pd *PD) RegMRIOVA(buf []byte, iova uint64, access AccessFlags) (*MR, error) {
	if err := pd.ctx.hold(); err != nil {
		return nil, err
	}
	e, err := pd.ctx.e.RegMR(pd.e, buf, iova, int(access))
	if err != nil {
		pd.ctx.release()
		return nil, err
	}
	mr := &MR{pd: pd, e: e, buf: buf}
	c := pd.ctx
	c.mrMu.Lock()
	c.mrs[mr.LKey()] = mr
	c.mrMu.Unlock()
	return mr, nil
}

// mrBytes returns the bytes an SGE names in a region of this context, for inline sends.
func (c *Context) mrBytes(sge SGE) ([]byte, bool) {
	c.mrMu.RLock()
	mr := c.mrs[sge.LKey]
	c.mrMu.RUnlock()
	if mr == nil || sge.Addr < mr.Addr() {
		return nil, false
	}
	off := sge.Addr - mr.Addr()
	if off > uint64(len(mr.buf)) || uint64(sge.Length) > uint64(len(mr.buf))-off {
		return nil, false
	}
	return mr.buf[off : off+uint64(sge.Length)], true
}

// LKey returns the 24-bit local key.
func (mr *MR) LKey() uint32 { return mr.e.LKey() }

// RKey returns the 32-bit remote key.
func (mr *MR) RKey() uint32 { return mr.e.RKey() }

// Addr returns the IOVA of the region's first byte.
func (mr *MR) Addr() uint64 { return mr.e.IOVA() }

// Len returns the region's length.
func (mr *MR) Len() int { return mr.e.Len() }

// Buf returns the registered buffer.
func (mr *MR) Buf() []byte { return mr.buf }

// PD returns the region's protection domain.
func (mr *MR) PD() *PD { return mr.pd }

// SGE returns a scatter-gather element for bytes [off, off+n) of the region.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}
}

// Dereg deregisters the region (ibv_dereg_mr). Work requests that name its keys afterwards
// complete with a protection error (local) or a remote access error (remote); an operation the
// device is carrying out when Dereg is called finishes first. Work requests still on the network
// whose local buffers lie in the region (a send or write not yet acknowledged, a read whose data
// has not all come, a receive filled in part) complete at once with a protection error, and the
// device touches the region no more.
func (mr *MR) Dereg() error {
	if err := mr.pd.ctx.e.DeregMR(mr.e); err != nil {
		return err
	}
	c := mr.pd.ctx
	c.mrMu.Lock()
	delete(c.mrs, mr.LKey())
	c.mrMu.Unlock()
	mr.pd.ctx.release()
	return nil
}

// SGE is a scatter-gather element (struct ibv_sge).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// GlobalRoute is the GRH part of an address (struct ibv_global_route). EFA uses DGID only.
type GlobalRoute struct {
	DGID         GID
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
}

// AHAttr describes an address handle (struct ibv_ah_attr). EFA needs IsGlobal with GRH.DGID.
type AHAttr struct {
	GRH         GlobalRoute
	DLID        uint16
	SL          uint8
	SrcPathBits uint8
	StaticRate  uint8
	IsGlobal    bool
	PortNum     uint8
}

// AH is an address handle (struct ibv_ah).
type AH struct {
	pd   *PD
	e    *engine.AH
	dead atomic.Bool // destroyed: the engine AH (shared by the PD's AHs for its GID) is not ours
}

// CreateAH creates an address handle for attr.GRH.DGID (ibv_create_ah). EINVAL for a nil attr,
// without a global route, for a port other than 1, or for the zero GID.
func (pd *PD) CreateAH(attr *AHAttr) (*AH, error) {
	switch {
	case pd == nil || attr == nil:
		return nil, fmt.Errorf("verbs: create AH with a nil PD or attributes: %w", syscall.EINVAL)
	case !attr.IsGlobal:
		return nil, fmt.Errorf("verbs: EFA address handles need a global route (IsGlobal): %w", syscall.EINVAL)
	case attr.PortNum != 1:
		return nil, fmt.Errorf("verbs: port %d; the device has port 1 only: %w", attr.PortNum, syscall.EINVAL)
	}
	if err := pd.ctx.hold(); err != nil {
		return nil, err
	}
	e, err := pd.ctx.e.CreateAH(pd.e, attr.GRH.DGID)
	if err != nil {
		pd.ctx.release()
		return nil, err
	}
	return &AH{pd: pd, e: e}, nil
}

// DGID returns the destination address.
func (ah *AH) DGID() GID { return GID(ah.e.GID()) }

// PD returns the AH's protection domain.
func (ah *AH) PD() *PD { return ah.pd }

// Destroy destroys the AH (ibv_destroy_ah). Work requests still naming it complete with a local
// QP operation error (EFA status INVALID_AH) unless another AH in the PD has the same GID.
// Destroying it again is EINVAL.
func (ah *AH) Destroy() error {
	if !ah.dead.CompareAndSwap(false, true) {
		return fmt.Errorf("verbs: AH already destroyed: %w", syscall.EINVAL)
	}
	if err := ah.pd.ctx.e.DestroyAH(ah.e); err != nil {
		ah.dead.Store(false)
		return err
	}
	ah.pd.ctx.release()
	return nil
}
