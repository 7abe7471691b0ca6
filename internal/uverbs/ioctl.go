//go:build linux

package uverbs

import (
	"slices"
	"syscall"

	"github.com/softefa/softefa/internal/uapi"
)

// ioctlAttr is one struct ib_uverbs_attr of a request.
type ioctlAttr struct {
	id, len, flags, reserved uint16
	data                     uint64 // the value itself when len <= 8 for an input, else a pointer
	index                    int    // its place in the request, to set VALID_OUTPUT there
}

// Ioctl carries out ioctl(fd, cmd, arg) on the command fd: the uverbs ioctl interface
// (ib_uverbs_ioctl), whose request header and attribute array are at arg in the program's
// memory. The methods the kernel's core and the EFA driver have and softefa implements are
// answered (EFA's MR_QUERY, which efadv_query_mr issues; the core's QUERY_PORT_SPEED and
// REG_DMABUF_MR, which have no write(2) form); every other method is
// EPROTONOSUPPORT, as the kernel answers a method it does not know, and libibverbs then uses the
// write(2) command instead where there is one (docs/cabi.md, "The ioctl interface"). An ioctl
// other than RDMA_VERBS_IOCTL is ENOTTY.
func (f *File) Ioctl(cmd uint32, arg uint64) error {
	if cmd != rdmaVerbsIoctl {
		return syscall.ENOTTY
	}
	hdr := make([]byte, ioctlHdrSize)
	if err := f.mem.Read(arg, hdr); err != nil {
		return syscall.EFAULT
	}
	length, object, methodID, n := int(u16(hdr, 0)), u16(hdr, 2), u16(hdr, 4), int(u16(hdr, 6))
	if length > userPageSize || length != ioctlHdrSize+n*ioctlAttrSize {
		return syscall.EINVAL
	}
	if u64(hdr, 8) != 0 || u32(hdr, 20) != 0 { // reserved1, reserved2
		return syscall.EPROTONOSUPPORT
	}
	raw := make([]byte, n*ioctlAttrSize)
	if err := f.mem.Read(arg+ioctlHdrSize, raw); err != nil {
		return syscall.EFAULT
	}
	attrs := make(map[uint16]ioctlAttr, n)
	for i := range n {
		a := raw[i*ioctlAttrSize:]
		at := ioctlAttr{id: u16(a, 0), len: u16(a, 2), flags: u16(a, 4), reserved: u16(a, 6), data: u64(a, 8), index: i}
		if at.flags&^(attrFMandatory|attrFValidOutput) != 0 {
			return syscall.EINVAL
		}
		if _, dup := attrs[at.id]; dup {
			return syscall.EINVAL
		}
		attrs[at.id] = at
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return syscall.EIO
	}
	var method func(uint64, map[uint16]ioctlAttr) error
	switch {
	case object == uverbsObjectMR && methodID == efaMethodMRQuery:
		method = f.queryMR
	case object == uverbsObjectMR && methodID == methodRegDmabufMR:
		method = f.regDmabufMR
	case object == uverbsObjectDevice && methodID == methodQueryPortSpeed:
		method = f.queryPortSpeed
	default:
		return syscall.EPROTONOSUPPORT // uapi_get_method: no such method
	}
	if !f.hasCtx {
		return syscall.EINVAL // ib_uverbs_get_ucontext
	}
	return method(arg, attrs)
}

// checkAttrs applies the method's attribute spec (uverbs_process_attr): an attribute the method
// does not know is EPROTONOSUPPORT when marked mandatory and ignored otherwise; a known one must
// have a zero reserved field and at least minLen bytes; every one in spec must be present but
// those named in optional.
func checkAttrs(attrs map[uint16]ioctlAttr, spec map[uint16]int, optional ...uint16) error {
	for id, a := range attrs {
		minLen, known := spec[id]
		if !known {
			if a.flags&attrFMandatory != 0 {
				return syscall.EPROTONOSUPPORT
			}
			continue
		}
		if a.reserved != 0 || int(a.len) < minLen {
			return syscall.EINVAL
		}
	}
	for id := range spec {
		if _, ok := attrs[id]; !ok && !slices.Contains(optional, id) {
			return syscall.EINVAL
		}
	}
	return nil
}

// output copies v to a PTR_OUT attribute (as much as it has room for) and marks it
// VALID_OUTPUT in the program's attribute array (uverbs_copy_to, uverbs_set_output).
func (f *File) output(arg uint64, a ioctlAttr, v []byte) error {
	if err := f.mem.Write(a.data, v[:min(len(v), int(a.len))]); err != nil {
		return syscall.EFAULT
	}
	var fl [2]byte
	put16(fl[:], 0, a.flags|attrFValidOutput)
	if err := f.mem.Write(arg+ioctlHdrSize+uint64(a.index*ioctlAttrSize)+4, fl[:]); err != nil {
		return syscall.EFAULT
	}
	return nil
}

// queryMR is EFA_IB_METHOD_MR_QUERY (efa_mr_query): which interconnects serve the MR for
// receives, RDMA READ and RDMA WRITE. A software device has one, id 0, valid for each use the
// MR's access flags allow: local write (receives into it), remote read, remote write. ENOENT for
// a handle that names nothing, EINVAL for one that names another kind of object.
func (f *File) queryMR(arg uint64, attrs map[uint16]ioctlAttr) error {
	if err := checkAttrs(attrs, map[uint16]int{
		efaAttrQueryMRHandle: 0, efaAttrQueryMRValidity: 2, efaAttrQueryMRRecvICID: 2,
		efaAttrQueryMRReadICID: 2, efaAttrQueryMRRecvRDMAID: 2,
	}); err != nil {
		return err
	}
	h := attrs[efaAttrQueryMRHandle].data
	o, ok := f.objs[uint32(h)]
	if !ok || h>>32 != 0 {
		return syscall.ENOENT
	}
	m, ok := o.(*mrObj)
	if !ok {
		return syscall.EINVAL
	}
	var validity uint16
	access := m.mr.Access()
	if access&uapi.AccessLocalWrite != 0 {
		validity |= efaQueryMRValidRecvICID
	}
	if access&uapi.AccessRemoteRead != 0 {
		validity |= efaQueryMRValidRDMAReadICID
	}
	if access&uapi.AccessRemoteWrite != 0 {
		validity |= efaQueryMRValidRDMARecvICID
	}
	var v [2]byte
	put16(v[:], 0, validity)
	if err := f.output(arg, attrs[efaAttrQueryMRValidity], v[:]); err != nil {
		return err
	}
	zero := []byte{0, 0} // interconnect 0
	for _, id := range []uint16{efaAttrQueryMRRecvICID, efaAttrQueryMRReadICID, efaAttrQueryMRRecvRDMAID} {
		if err := f.output(arg, attrs[id], zero); err != nil {
			return err
		}
	}
	return nil
}
