//go:build linux

package uverbs

import (
	"os"
	"syscall"
	"testing"

	"github.com/softefa/softefa/internal/uapi"
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

func portSpeedAttrs(port uint64) []ioctlAttrIn {
	return []ioctlAttrIn{
		{id: attrQueryPortSpeedPort, len: 8, flags: attrFMandatory, data: port},
		{id: attrQueryPortSpeedResp, len: 8, flags: attrFMandatory, data: respAddr},
	}
}

// TestIoctlQueryPortSpeed: UVERBS_METHOD_QUERY_PORT_SPEED, which rdma-core 64's
// ibv_query_port_speed issues with no write(2) fallback, answers the link speed in units of
// 100 Mb/s as efa_query_port_speed does (max_link_speed_gbps * 10) and marks it valid; port 0 or
// 2 is EINVAL, and so is the method before GET_CONTEXT.
func TestIoctlQueryPortSpeed(t *testing.T) {
	h := newHarness(t)
	wantErrno(t, h.ioctl(uverbsObjectDevice, methodQueryPortSpeed, portSpeedAttrs(1)), syscall.EINVAL)
	h.getContext()
	if err := h.ioctl(uverbsObjectDevice, methodQueryPortSpeed, portSpeedAttrs(1)); err != nil {
		t.Fatalf("QUERY_PORT_SPEED: %v", err)
	}
	b := h.mem.segs[respAddr]
	gbps := h.d.cfg.LinkSpeedGbps
	if gbps == 0 {
		t.Fatal("the device's configuration has no link speed")
	}
	if got, want := u64(b, 0), uint64(gbps)*10; got != want {
		t.Errorf("speed %d (x 100 Mb/s), want %d", got, want)
	}
	if u16(b, 2048+ioctlHdrSize+ioctlAttrSize+4)&attrFValidOutput == 0 {
		t.Error("the speed is not marked VALID_OUTPUT")
	}
	wantErrno(t, h.ioctl(uverbsObjectDevice, methodQueryPortSpeed, portSpeedAttrs(0)), syscall.EINVAL)
	wantErrno(t, h.ioctl(uverbsObjectDevice, methodQueryPortSpeed, portSpeedAttrs(2)), syscall.EINVAL)
	wantErrno(t, h.ioctl(uverbsObjectDevice, methodQueryPortSpeed, portSpeedAttrs(1)[:1]), syscall.EINVAL)
	short := portSpeedAttrs(1)
	short[1].len = 4 // room for less than the u64
	wantErrno(t, h.ioctl(uverbsObjectDevice, methodQueryPortSpeed, short), syscall.EINVAL)
}

func dmabufAttrs(pd uint32, fd int32, access uint32) []ioctlAttrIn {
	return []ioctlAttrIn{
		{id: attrRegDmabufMRHandle, flags: attrFMandatory},
		{id: attrRegDmabufMRRespLKey, len: 4, flags: attrFMandatory, data: respAddr},
		{id: attrRegDmabufMRRespRKey, len: 4, flags: attrFMandatory, data: respAddr + 16},
		{id: attrRegDmabufMRPD, flags: attrFMandatory, data: uint64(pd)},
		{id: attrRegDmabufMROffset, len: 8, flags: attrFMandatory},
		{id: attrRegDmabufMRLength, len: 8, flags: attrFMandatory, data: 4096},
		{id: attrRegDmabufMRIOVA, len: 8, flags: attrFMandatory},
		{id: attrRegDmabufMRFD, len: 4, flags: attrFMandatory, data: uint64(uint32(fd))},
		{id: attrRegDmabufMRAccess, len: 4, data: uint64(access)},
	}
}

// TestIoctlRegDmabufMR: UVERBS_METHOD_REG_DMABUF_MR fails as EFA's kernel driver does for what
// a software device cannot import: EBADF for a descriptor that is not open (UCX probes dma-buf
// support with fd -1 and takes EBADF as "supported"), EINVAL for an open file that is not a
// dma-buf; the PD and access flags are checked first, in the kernel's order (REMOTE_ATOMIC is
// EOPNOTSUPP before the descriptor is looked at, as on EFA).
func TestIoctlRegDmabufMR(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	const lw, rw, rr, atomic = 1, 2, 4, 8
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, -1, lw)), syscall.EBADF)
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, -1, 0)), syscall.EBADF)
	if h.d.cfg.Caps&uapi.CapRDMARead != 0 {
		wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, -1, lw|rr)), syscall.EBADF)
	}
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, int32(f.Fd()), lw)), syscall.EINVAL)
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, 1<<30, lw)), syscall.EBADF) // past any fd limit

	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, -1, lw|rw|rr|atomic)), syscall.EOPNOTSUPP)
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, -1, rw)), syscall.EINVAL)
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, -1, lw|1<<4)), syscall.EINVAL) // MW_BIND
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(99, -1, lw)), syscall.ENOENT)
	mr := h.regMR(pd, lw)
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(mr, -1, lw)), syscall.EINVAL)
	wrap := dmabufAttrs(pd, -1, lw)
	wrap[4].data = ^uint64(0) // offset + length wraps
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, wrap), syscall.EINVAL)
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, -1, lw)[:8]), syscall.EBADF) // access is optional
	wantErrno(t, h.ioctl(uverbsObjectMR, methodRegDmabufMR, dmabufAttrs(pd, -1, lw)[1:]), syscall.EINVAL)
	if b := h.mem.segs[respAddr]; u32(b, 0) != 0 || u32(b, 16) != 0 {
		t.Error("a failed registration wrote keys")
	}
}
