//go:build linux

package uverbs

import (
	"syscall"

	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/uapi"
)

// allocPD is ALLOC_PD (efa_alloc_pd): driver input must be zeros.
func (f *File) allocPD(c *call) error {
	if err := f.admit(kindPD); err != nil {
		return err
	}
	if _, err := c.request(allocPDReq); err != nil {
		return err
	}
	if !c.udataCleared() {
		return syscall.EINVAL
	}
	pd, err := f.d.e.AllocPD()
	if err != nil {
		return err
	}
	h := f.add(&pdObj{pd: pd})
	resp := make([]byte, allocPDResp)
	put32(resp, 0, h)
	drv := make([]byte, efaAllocPDRespSize)
	put16(drv, 4, pd.PDN())
	if err := f.respondDriver(c, drv); err == nil {
		err = f.respond(c, resp)
		if err == nil {
			return nil
		}
	}
	f.remove(h)
	_ = f.d.e.DeallocPD(pd)
	return syscall.EFAULT
}

// deallocPD is DEALLOC_PD: EINVAL for an unknown handle, EBUSY while the PD has objects.
func (f *File) deallocPD(c *call) error {
	req, err := c.request(deallocPDReq)
	if err != nil {
		return err
	}
	h := u32(req, 0)
	p, ok := lookup[*pdObj](f, h)
	if !ok {
		return syscall.EINVAL
	}
	if err := f.d.e.DeallocPD(p.pd); err != nil {
		return err
	}
	f.remove(h)
	return nil
}

// createAH is CREATE_AH (efa_create_ah): the AH for attr.grh.dgid in the PD.
func (f *File) createAH(c *call) error {
	if err := f.admit(kindAH); err != nil {
		return err
	}
	req, err := c.request(createAHReq)
	if err != nil {
		return err
	}
	if req[54] != 1 { // attr.port_num: rdma_is_port_valid
		return syscall.EINVAL
	}
	p, ok := lookup[*pdObj](f, u32(req, 16))
	if !ok {
		return syscall.EINVAL
	}
	if !c.udataCleared() {
		return syscall.EINVAL
	}
	var gid [16]byte
	if req[53] != 0 { // attr.is_global: without a GRH the kernel passes the driver a zero GID
		copy(gid[:], req[24:40])
	}
	ah, err := f.d.e.CreateAH(p.pd, gid) // EINVAL for the zero GID: peers are known by GID alone
	if err != nil {
		return err
	}
	h := f.add(&ahObj{ah: ah})
	resp := make([]byte, createAHResp)
	put32(resp, 0, h)
	drv := make([]byte, efaCreateAHRespSize)
	put16(drv, 4, ah.AHN())
	if err := f.respondDriver(c, drv); err == nil {
		if err = f.respond(c, resp); err == nil {
			return nil
		}
	}
	f.remove(h)
	_ = f.d.e.DestroyAH(ah)
	return syscall.EFAULT
}

// destroyAH is DESTROY_AH.
func (f *File) destroyAH(c *call) error {
	req, err := c.request(destroyAHReq)
	if err != nil {
		return err
	}
	h := u32(req, 0)
	a, ok := lookup[*ahObj](f, h)
	if !ok {
		return syscall.EINVAL
	}
	if err := f.d.e.DestroyAH(a.ah); err != nil {
		return err
	}
	f.remove(h)
	return nil
}

// regMR is REG_MR (ib_uverbs_reg_mr, efa_reg_mr): the region [start, start+length) of the
// process, addressed by hca_va. EINVAL when start and hca_va differ within a page, for access
// flags IB does not know or REMOTE_WRITE without LOCAL_WRITE (ib_check_mr_access), for an unknown
// PD or non-zero bytes in the first 8 of driver input; the engine's checks follow (size, EOPNOTSUPP for remote access the
// device lacks); EFAULT when the range is not mapped readable, or not writable when the access
// flags let anyone write it (ib_access_writable: LOCAL_WRITE, REMOTE_WRITE, REMOTE_ATOMIC,
// MW_BIND), as ib_umem_get's pinning fails.
func (f *File) regMR(c *call) error {
	if err := f.admit(kindMR); err != nil {
		return err
	}
	req, err := c.request(regMRReq)
	if err != nil {
		return err
	}
	start, length, va := u64(req, 8), u64(req, 16), u64(req, 24)
	pdh, access := u32(req, 32), int(u32(req, 36))
	switch {
	case start%userPageSize != va%userPageSize,
		access&^uapi.AccessSupported != 0,
		access&(uapi.AccessRemoteWrite|uapi.AccessRemoteAtomic) != 0 && access&uapi.AccessLocalWrite == 0:
		return syscall.EINVAL
	}
	p, ok := lookup[*pdObj](f, pdh)
	// efa_alloc_mr checks sizeof(udata->inlen) bytes of driver input, not inlen.
	if !ok || !cleared(c.udIn[:min(len(c.udIn), 8)]) {
		return syscall.EINVAL
	}
	if length == 0 || length > f.d.cfg.MaxMRSize || start+length < start {
		return syscall.EINVAL
	}
	writable := access&(uapi.AccessLocalWrite|uapi.AccessRemoteWrite|uapi.AccessRemoteAtomic|uapi.AccessMWBind) != 0
	span, err := f.mem.Span(start, length, writable)
	if err != nil {
		return syscall.EFAULT
	}
	var mr *engine.MR
	if buf, own := span.Bytes(); own {
		mr, err = f.d.e.RegForeignMR(p.pd, buf, va, access)
	} else {
		mr, err = f.d.e.RegProcessMR(p.pd, span.Process(), span.Addr(), span.Len(), va, access)
	}
	if err != nil {
		return err
	}
	h := f.add(&mrObj{mr: mr, pdh: pdh})
	resp := make([]byte, regMRResp)
	put32(resp, 0, h)
	put32(resp, 4, mr.LKey())
	put32(resp, 8, mr.RKey())
	if err := f.respond(c, resp); err != nil {
		f.remove(h)
		_ = f.d.e.DeregMR(mr)
		return err
	}
	return nil
}

// deregMR is DEREG_MR.
func (f *File) deregMR(c *call) error {
	req, err := c.request(deregMRReq)
	if err != nil {
		return err
	}
	h := u32(req, 0)
	m, ok := lookup[*mrObj](f, h)
	if !ok {
		return syscall.EINVAL
	}
	if err := f.d.e.DeregMR(m.mr); err != nil {
		return err
	}
	f.remove(h)
	return nil
}

// createCompChannel is CREATE_COMP_CHANNEL: a new event fd for CQ completion events.
func (f *File) createCompChannel(c *call) error {
	if _, err := c.request(compChannelReq); err != nil {
		return err
	}
	ours, theirs, err := socketPair()
	if err != nil {
		return err
	}
	n, err := f.fds.Give(theirs)
	if err != nil {
		closeFDs(ours, theirs)
		return err
	}
	resp := make([]byte, compChannelResp)
	put32(resp, 0, uint32(n))
	if err := f.respond(c, resp); err != nil {
		closeFDs(ours, theirs) // (the program's copy is the program's to close, as for the kernel's failed command)
		return err
	}
	f.channels[n] = &compChannel{user: n, kept: theirs, dev: ours}
	return nil
}
