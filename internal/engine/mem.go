package engine

import (
	"encoding/binary"
	"fmt"
	"io"
	"runtime/debug"
	"syscall"
	"unsafe"

	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/uapi"
)

// PD is a protection domain. MRs, QPs and AHs belong to one; a key checked for an access must
// belong to the PD of the QP that makes it.
type PD struct {
	d    *Device
	pdn  uint16
	refs int // MRs, QPs and AHs in this PD
	ahs  ahTable
}

// PDN returns the PD's 16-bit number.
func (pd *PD) PDN() uint16 { return pd.pdn }

// AllocPD creates a PD (ENOMEM past MaxPD).
func (d *Device) AllocPD() (*PD, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if d.nPD >= d.cfg.MaxPD {
		return nil, fmt.Errorf("engine: %d PDs allocated, the device maximum: %w", d.nPD, syscall.ENOMEM)
	}
	for {
		d.pdNext++
		if d.pdNext != 0 && d.pds[d.pdNext] == nil {
			break
		}
	}
	pd := &PD{d: d, pdn: d.pdNext}
	pd.ahs.init()
	d.pds[pd.pdn] = pd
	d.nPD++
	return pd, nil
}

// DeallocPD frees pd; EBUSY while MRs, QPs or AHs still use it.
func (d *Device) DeallocPD(pd *PD) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pds[pd.pdn] != pd {
		return fmt.Errorf("engine: PD %d is not allocated: %w", pd.pdn, syscall.EINVAL)
	}
	if pd.refs > 0 {
		return fmt.Errorf("engine: PD %d still has %d objects: %w", pd.pdn, pd.refs, syscall.EBUSY)
	}
	delete(d.pds, pd.pdn)
	d.nPD--
	return nil
}

// MR is a registered memory region: bytes addressed by IOVAs [IOVA, IOVA+len), which are the
// device's own memory (a byte slice) or a range of another process's (RegProcessMR).
type MR struct {
	pd     *PD
	mem    mem.Span
	iova   uint64
	access int
	lkey   uint32 // 24 bits: 16-bit table index, 8-bit generation
	rkey   uint32 // 32 random bits
	dead   bool
	// foreign: buf is memory the Go runtime does not own (a C program's buffer), which its owner
	// may unmap or protect while it is registered; every access probes it first (probe).
	foreign bool
}

// LKey returns the MR's 24-bit local key.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey returns the MR's 32-bit remote key.
func (mr *MR) RKey() uint32 { return mr.rkey }

// IOVA returns the address of the region's first byte.
func (mr *MR) IOVA() uint64 { return mr.iova }

// Len returns the region's length.
func (mr *MR) Len() int { return mr.mem.Len() }

// Access returns the access flags the region was registered with.
func (mr *MR) Access() int { return mr.access }

// span returns the bytes [addr, addr+n) of the region, or false if they are not all inside it.
// The arithmetic cannot overflow.
func (mr *MR) span(addr, n uint64) (mem.Span, bool) {
	if addr < mr.iova {
		return mem.Span{}, false
	}
	off, l := addr-mr.iova, uint64(mr.mem.Len())
	if off > l || n > l-off {
		return mem.Span{}, false
	}
	if b, own := mr.mem.Bytes(); own {
		return mem.Own(b[off : off+n]), true
	}
	return mr.mem.Slice(int(off), int(n)), true
}

// supportedAccess are the access flags EFA takes (efa_reg_mr); remote bits need the device cap.
const supportedAccess = uapi.AccessLocalWrite | uapi.AccessRemoteRead | uapi.AccessRemoteWrite

// RegMR registers buf in pd at address iova with the given access flags. Errors: EINVAL for an
// empty or oversized region or REMOTE_WRITE without LOCAL_WRITE; EOPNOTSUPP for access flags the
// device does not support; ENOMEM past MaxMR. Optional access bits are ignored.
func (d *Device) RegMR(pd *PD, buf []byte, iova uint64, access int) (*MR, error) {
	return d.regMR(pd, mem.Own(buf), iova, access, false)
}

// RegForeignMR is RegMR for memory the Go runtime does not own, such as a C program's buffer:
// the program may unmap or protect it while it is registered, so every access the device makes
// probes the pages first, and one that would fault fails as a bad key would (LOCAL_ERROR_INVALID_LKEY
// at the requester, REMOTE_ERROR_BAD_ADDRESS at a responder) instead of crashing the process.
func (d *Device) RegForeignMR(pd *PD, buf []byte, iova uint64, access int) (*MR, error) {
	return d.regMR(pd, mem.Own(buf), iova, access, true)
}

// RegProcessMR is RegMR for n bytes at addr in another process p (a program the device serves):
// the device reads and writes them with process_vm_readv/writev (package mem). Every page must
// be mapped readable, and writable for an access that lets anyone write, when the region is
// registered (EFAULT otherwise; ESRCH once p is gone, EPERM where the device may not reach p);
// later an access that finds the memory gone, or a
// write that finds it read-only, fails its work request as a bad key would (RegForeignMR), and
// every access fails once p has exited.
func (d *Device) RegProcessMR(pd *PD, p *mem.Process, addr uint64, n int, iova uint64, access int) (*MR, error) {
	if n > 0 && uint64(n) <= d.cfg.MaxMRSize && addr+uint64(n) >= addr {
		write := access&(uapi.AccessLocalWrite|uapi.AccessRemoteWrite) != 0
		if err := p.Check(addr, n, write); err != nil {
			return nil, fmt.Errorf("engine: registering %d bytes at %#x: %w", n, addr, err)
		}
	}
	return d.regMR(pd, mem.In(p, addr, n), iova, access, false)
}

func (d *Device) regMR(pd *PD, m mem.Span, iova uint64, access int, foreign bool) (*MR, error) {
	access &^= uapi.AccessOptionalMask
	n := uint64(m.Len())
	switch {
	case n == 0:
		return nil, fmt.Errorf("engine: empty memory region: %w", syscall.EINVAL)
	case n > d.cfg.MaxMRSize:
		return nil, fmt.Errorf("engine: region of %d bytes over max_mr_size %d: %w", n, d.cfg.MaxMRSize, syscall.EINVAL)
	case iova+n < iova:
		return nil, fmt.Errorf("engine: region at %#x of %d bytes wraps the address space: %w", iova, n, syscall.EINVAL)
	case access&^supportedAccess != 0,
		access&uapi.AccessRemoteRead != 0 && d.cfg.Caps&uapi.CapRDMARead == 0,
		access&uapi.AccessRemoteWrite != 0 && d.cfg.Caps&uapi.CapRDMAWrite == 0:
		return nil, fmt.Errorf("engine: access flags %#x not supported: %w", access, syscall.EOPNOTSUPP)
	case access&uapi.AccessRemoteWrite != 0 && access&uapi.AccessLocalWrite == 0:
		return nil, fmt.Errorf("engine: REMOTE_WRITE needs LOCAL_WRITE: %w", syscall.EINVAL)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pds[pd.pdn] != pd {
		return nil, fmt.Errorf("engine: PD %d is not allocated: %w", pd.pdn, syscall.EINVAL)
	}
	mr := &MR{pd: pd, mem: m, iova: iova, access: access, foreign: foreign}
	if err := d.mrs.insert(mr); err != nil {
		return nil, err
	}
	if foreign {
		d.foreign = true
	}
	pd.refs++
	return mr, nil
}

// DeregMR removes mr. Work requests that name its keys afterwards fail their key check; an
// operation the engine is carrying out finishes first, since both hold the device lock. Work
// requests on the network whose local buffers lie in mr (a SEND or write not yet acknowledged, a
// read whose data has not all come) and receives placed into it in part complete at once with
// LOCAL_INVALID_LKEY: the device touches the region no more.
func (d *Device) DeregMR(mr *MR) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if mr.dead {
		return fmt.Errorf("engine: MR already deregistered: %w", syscall.EINVAL)
	}
	d.mrs.remove(mr)
	mr.dead = true
	d.stopReceivingInto(mr)
	d.stopSendingFrom(mr)
	mr.pd.refs--
	return nil
}

// localSpan checks a local SGE: the lkey names a live region of pd with every access bit in need,
// and [addr, addr+n) lies inside it.
func (d *Device) localSpan(pd *PD, lkey uint32, addr, n uint64, need int) (mem.Span, bool) {
	mr := d.mrs.byLKey(lkey)
	if mr == nil || mr.pd != pd || mr.access&need != need {
		return mem.Span{}, false
	}
	return mr.probedSpan(addr, n, need&uapi.AccessLocalWrite != 0)
}

// remoteSpan checks a remote access: the rkey names a live region of pd that grants need, and
// [addr, addr+n) lies inside it.
func (d *Device) remoteSpan(pd *PD, rkey uint32, addr, n uint64, need int) (mem.Span, bool) {
	mr := d.mrs.byRKey[rkey]
	if mr == nil || mr.pd != pd || mr.access&need == 0 {
		return mem.Span{}, false
	}
	return mr.probedSpan(addr, n, need&uapi.AccessRemoteWrite != 0)
}

// catchFault runs f with memory faults turned into panics, and reports false if one came.
// Other panics go on.
func catchFault(f func()) (ok bool) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			if _, fault := r.(interface{ Addr() uintptr }); !fault {
				panic(r)
			}
			ok = false
		}
	}()
	f()
	return true
}

// copyMem is mem.Copy, guarded once the device has had a foreign region. Called with d.mu held.
func (d *Device) copyMem(dst, src mem.Span) bool {
	if !d.foreign {
		return mem.Copy(dst, src)
	}
	ok := false
	return catchFault(func() { ok = mem.Copy(dst, src) }) && ok
}

// writeMem writes src into dst at its start, guarded as copyMem is.
func (d *Device) writeMem(dst mem.Span, src []byte) bool {
	if !d.foreign {
		return dst.WriteAt(src, 0)
	}
	ok := false
	return catchFault(func() { ok = dst.WriteAt(src, 0) }) && ok
}

// probedSpan is span, and for a foreign region also a probe of the bytes for reading (and for
// writing, if write).
func (mr *MR) probedSpan(addr, n uint64, write bool) (mem.Span, bool) {
	s, ok := mr.span(addr, n)
	if b, own := s.Bytes(); ok && own && mr.foreign && !probe(b, write) {
		return mem.Span{}, false
	}
	return s, ok
}

// probe touches a byte of b in every page it spans (a read, and for write a store of the value
// read) with memory faults turned into panics for the moment, and reports whether every page
// allowed it. Only bytes of b are touched, and none changes.
func probe(b []byte, write bool) bool {
	if len(b) == 0 {
		return true
	}
	const page = 4096
	return catchFault(func() {
		base := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
		for off := 0; off < len(b); {
			touch(&b[off], write)
			a := base + uintptr(off)
			off += int((a &^ (page - 1)) + page - a) // the first byte of the next page
		}
		touch(&b[len(b)-1], write)
	})
}

// probeSink keeps touch's load from being optimized away; nothing reads it.
//
//lint:ignore U1000 written, never read, on purpose
var probeSink byte

// touch reads *p and, for write, stores the value back. Not instrumented by the race detector:
// its runtime would meet the fault in C code, where it cannot become a panic; the memory is not
// the Go heap's, which the detector does not watch anyway.
//
//go:norace
//go:noinline
func touch(p *byte, write bool) {
	v := *p
	probeSink = v // a store between the load and the store back, which then cannot be elided
	if write {
		*p = v
	}
}

// retiredKeys is how many recently freed rkeys are kept out of reuse.
const retiredKeys = 4096

// mrTable maps lkeys and rkeys to regions. An lkey is index<<8 | generation, with index ≥ 1 so
// that no lkey is 0; the generation advances each time an index is reused, so a stale lkey does
// not name the new region. An rkey is 32 random bits, unique among live regions and the last
// retiredKeys freed ones.
type mrTable struct {
	byIndex []*MR
	gen     []uint8
	next    int
	n       int
	byRKey  map[uint32]*MR
	retired [retiredKeys]uint32
	retPos  int
	retSet  map[uint32]struct{}
	rng     io.Reader // where rkeys come from
}

func (t *mrTable) init(max int, rng io.Reader) {
	t.rng = rng
	t.byIndex = make([]*MR, max+1)
	t.gen = make([]uint8, max+1)
	t.byRKey = make(map[uint32]*MR)
	t.retSet = make(map[uint32]struct{})
}

func (t *mrTable) insert(mr *MR) error {
	max := len(t.byIndex) - 1
	if t.n >= max {
		return fmt.Errorf("engine: %d memory regions registered, the device maximum: %w", t.n, syscall.ENOMEM)
	}
	idx := t.next
	for {
		idx++
		if idx > max {
			idx = 1
		}
		if t.byIndex[idx] == nil {
			break
		}
	}
	t.next = idx
	t.gen[idx]++
	mr.lkey = uint32(idx)<<8 | uint32(t.gen[idx])
	for {
		var b [4]byte
		_, _ = io.ReadFull(t.rng, b[:]) // crypto/rand never fails (Go ≥ 1.24)
		k := binary.LittleEndian.Uint32(b[:])
		if _, old := t.retSet[k]; k == 0 || old || t.byRKey[k] != nil {
			continue
		}
		mr.rkey = k
		break
	}
	t.byIndex[idx] = mr
	t.byRKey[mr.rkey] = mr
	t.n++
	return nil
}

func (t *mrTable) remove(mr *MR) {
	t.byIndex[mr.lkey>>8] = nil
	delete(t.byRKey, mr.rkey)
	if old := t.retired[t.retPos]; old != 0 {
		delete(t.retSet, old)
	}
	t.retired[t.retPos] = mr.rkey
	t.retSet[mr.rkey] = struct{}{}
	t.retPos = (t.retPos + 1) % retiredKeys
	t.n--
}

func (t *mrTable) byLKey(lkey uint32) *MR {
	idx := lkey >> 8
	if idx == 0 || idx >= uint32(len(t.byIndex)) {
		return nil
	}
	if mr := t.byIndex[idx]; mr != nil && mr.lkey == lkey {
		return mr
	}
	return nil
}
