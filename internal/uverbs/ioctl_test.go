//go:build linux

package uverbs

import (
	"syscall"
	"testing"
)

const ioctlAddr = respAddr + 2048 // the ioctl header and attributes, inside the response buffer

// ioctlReq lays out an ioctl header and attributes at ioctlAddr; outputs go to respAddr+16*i.
type ioctlAttrIn struct {
	id, len, flags uint16
	data           uint64
}

func (h *harness) ioctl(object, method uint16, attrs []ioctlAttrIn) error {
	h.t.Helper()
	b := h.mem.segs[respAddr]
	clear(b)
	putIoctl(b[2048:], object, method, attrs)
	return h.f.Ioctl(rdmaVerbsIoctl, ioctlAddr)
}

// putIoctl writes an ioctl header for object and method with attrs at the start of b (which has
// room for them) and returns those bytes.
func putIoctl(b []byte, object, method uint16, attrs []ioctlAttrIn) []byte {
	n := ioctlHdrSize + len(attrs)*ioctlAttrSize
	put16(b, 0, uint16(n))
	put16(b, 2, object)
	put16(b, 4, method)
	put16(b, 6, uint16(len(attrs)))
	for i, a := range attrs {
		at := b[ioctlHdrSize+i*ioctlAttrSize:]
		put16(at, 0, a.id)
		put16(at, 2, a.len)
		put16(at, 4, a.flags)
		put64(at, 8, a.data)
	}
	return b[:n]
}

func (h *harness) regMR(pd uint32, access uint32) uint32 {
	core := withResp(regMRReq)
	put64(core, 8, bufAddr)
	put64(core, 16, 4096)
	put64(core, 24, bufAddr)
	put32(core, 32, pd)
	put32(core, 36, access)
	return u32(h.must(cmd(cmdRegMR, 3, core, nil)), 0)
}

func mrQueryAttrs(handle uint64) []ioctlAttrIn {
	a := []ioctlAttrIn{{id: efaAttrQueryMRHandle, flags: attrFMandatory, data: handle}}
	for i := range 4 {
		a = append(a, ioctlAttrIn{id: efaAttrQueryMRValidity + uint16(i), len: 2, flags: attrFMandatory, data: respAddr + uint64(16*i)})
	}
	return a
}

// TestIoctlMRQuery: EFA_IB_METHOD_MR_QUERY answers validity by the MR's access flags and marks
// its outputs valid; a bad handle, a missing or unknown mandatory attribute and a bad header
// fail with the kernel's errnos; other methods are EPROTONOSUPPORT, other ioctls ENOTTY.
func TestIoctlMRQuery(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	for _, c := range []struct {
		access uint32
		want   uint16
	}{
		{1, efaQueryMRValidRecvICID},
		{1 | 2 | 4, efaQueryMRValidRecvICID | efaQueryMRValidRDMAReadICID | efaQueryMRValidRDMARecvICID},
		{4, efaQueryMRValidRDMAReadICID},
	} {
		mr := h.regMR(pd, c.access)
		if err := h.ioctl(uverbsObjectMR, efaMethodMRQuery, mrQueryAttrs(uint64(mr))); err != nil {
			t.Fatalf("MR_QUERY access %#x: %v", c.access, err)
		}
		b := h.mem.segs[respAddr]
		if got := u16(b, 0); got != c.want {
			t.Errorf("access %#x: validity %#x, want %#x", c.access, got, c.want)
		}
		for i := range 5 {
			if i > 0 && u16(b, 2048+ioctlHdrSize+i*ioctlAttrSize+4)&attrFValidOutput == 0 {
				t.Errorf("output %d not marked VALID_OUTPUT", i)
			}
		}
	}
	wantErrno(t, h.ioctl(uverbsObjectMR, efaMethodMRQuery, mrQueryAttrs(99)), syscall.ENOENT)
	wantErrno(t, h.ioctl(uverbsObjectMR, efaMethodMRQuery, mrQueryAttrs(uint64(pd))), syscall.EINVAL)
	wantErrno(t, h.ioctl(uverbsObjectMR, efaMethodMRQuery, mrQueryAttrs(0)[:4]), syscall.EINVAL)
	extra := append(mrQueryAttrs(1), ioctlAttrIn{id: 0x1010, flags: attrFMandatory})
	wantErrno(t, h.ioctl(uverbsObjectMR, efaMethodMRQuery, extra), syscall.EPROTONOSUPPORT)
	short := mrQueryAttrs(1)
	short[1].len = 1
	wantErrno(t, h.ioctl(uverbsObjectMR, efaMethodMRQuery, short), syscall.EINVAL)
	badFlags := mrQueryAttrs(1)
	badFlags[2].flags = 4
	wantErrno(t, h.ioctl(uverbsObjectMR, efaMethodMRQuery, badFlags), syscall.EINVAL)
	wantErrno(t, h.ioctl(0, 1, nil), syscall.EPROTONOSUPPORT) // a core method softefa leaves to write(2)
	wantErrno(t, h.f.Ioctl(0x5401, ioctlAddr), syscall.ENOTTY)
	put64(h.mem.segs[respAddr], 2048+8, 1) // reserved1
	wantErrno(t, h.f.Ioctl(rdmaVerbsIoctl, ioctlAddr), syscall.EPROTONOSUPPORT)
	put16(h.mem.segs[respAddr], 2048, 25) // a length that is not the header plus attributes
	wantErrno(t, h.f.Ioctl(rdmaVerbsIoctl, ioctlAddr), syscall.EINVAL)
	wantErrno(t, h.f.Ioctl(rdmaVerbsIoctl, 0x900000), syscall.EFAULT)
}
