//go:build linux

package uverbs

import (
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softefa/softefa/internal/uapi"
)

// The core's ioctl methods that have no write(2) form, answered as the kernel's core and the EFA
// driver answer them (drivers/infiniband/core/uverbs_std_types_device.c and _mr.c, efa_verbs.c).

// defaultLinkSpeedGbps is what the EFA driver reports for a device whose firmware gives no link
// speed (EFA_DEFAULT_LINK_SPEED_GBPS).
const defaultLinkSpeedGbps = 100

// queryPortSpeed is UVERBS_METHOD_QUERY_PORT_SPEED (efa_query_port_speed): the port's link speed
// in units of 100 Mb/s, the device's link speed in Gb/s times 10. EINVAL for a port other than 1
// (rdma_is_port_valid) or a port number that does not fit a u32 (uverbs_get_const).
func (f *File) queryPortSpeed(arg uint64, attrs map[uint16]ioctlAttr) error {
	if err := checkAttrs(attrs, map[uint16]int{attrQueryPortSpeedPort: 0, attrQueryPortSpeedResp: 8}); err != nil {
		return err
	}
	if attrs[attrQueryPortSpeedPort].data != 1 {
		return syscall.EINVAL
	}
	gbps := f.d.cfg.LinkSpeedGbps
	if gbps <= 0 {
		gbps = defaultLinkSpeedGbps
	}
	var v [8]byte
	put64(v[:], 0, uint64(gbps)*10)
	return f.output(arg, attrs[attrQueryPortSpeedResp], v[:])
}

// regDmabufAccess are the access flags UVERBS_METHOD_REG_DMABUF_MR takes at all
// (uverbs_get_flags32); others are EINVAL before the driver sees them.
const regDmabufAccess = uapi.AccessLocalWrite | uapi.AccessRemoteRead | uapi.AccessRemoteWrite |
	uapi.AccessRemoteAtomic | uapi.AccessRelaxedOrder

// regDmabufMR is UVERBS_METHOD_REG_DMABUF_MR (ib_uverbs_reg_dmabuf_mr, efa_reg_user_mr_dmabuf),
// which ibv_reg_dmabuf_mr issues. softefa imports no dma-buf, but it fails as the kernel does, in
// the kernel's order, so that a program probing for dma-buf support (UCX registers fd -1 and
// takes EBADF to mean that the driver has the method) learns what it would on EFA:
//   - the PD handle: ENOENT when it names nothing, EINVAL when it names another kind of object;
//   - access flags outside LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC and
//     RELAXED_ORDERING, or REMOTE_WRITE or REMOTE_ATOMIC without LOCAL_WRITE: EINVAL
//     (ib_check_mr_access);
//   - access the device does not support (efa_alloc_mr: REMOTE_ATOMIC always, REMOTE_READ or
//     REMOTE_WRITE without the RDMA_READ or RDMA_WRITE cap; RELAXED_ORDERING is optional and
//     ignored): EOPNOTSUPP;
//   - offset + length wrapping: EINVAL (ib_umem_dmabuf_get);
//   - then the descriptor (dma_buf_get): EBADF when it is not open, EINVAL when it is open but
//     not a dma-buf, and EOPNOTSUPP for a real dma-buf, which a software device cannot map.
func (f *File) regDmabufMR(arg uint64, attrs map[uint16]ioctlAttr) error {
	if err := checkAttrs(attrs, map[uint16]int{
		attrRegDmabufMRHandle: 0, attrRegDmabufMRPD: 0, attrRegDmabufMROffset: 8,
		attrRegDmabufMRLength: 8, attrRegDmabufMRIOVA: 8, attrRegDmabufMRFD: 4,
		attrRegDmabufMRAccess: 4, attrRegDmabufMRRespLKey: 4, attrRegDmabufMRRespRKey: 4,
	}, attrRegDmabufMRAccess); err != nil {
		return err
	}
	pdh := attrs[attrRegDmabufMRPD].data
	o, ok := f.objs[uint32(pdh)]
	if !ok || pdh>>32 != 0 {
		return syscall.ENOENT
	}
	if _, ok := o.(*pdObj); !ok {
		return syscall.EINVAL
	}
	access := int(attrs[attrRegDmabufMRAccess].data) // 0 when absent
	if attrs[attrRegDmabufMRAccess].data>>32 != 0 || access&^regDmabufAccess != 0 ||
		access&(uapi.AccessRemoteWrite|uapi.AccessRemoteAtomic) != 0 && access&uapi.AccessLocalWrite == 0 {
		return syscall.EINVAL
	}
	caps := f.d.cfg.Caps
	access &^= uapi.AccessOptionalMask
	if access&uapi.AccessRemoteAtomic != 0 ||
		access&uapi.AccessRemoteRead != 0 && caps&uapi.CapRDMARead == 0 ||
		access&uapi.AccessRemoteWrite != 0 && caps&uapi.CapRDMAWrite == 0 {
		return syscall.EOPNOTSUPP
	}
	offset, length := attrs[attrRegDmabufMROffset].data, attrs[attrRegDmabufMRLength].data
	if offset+length < offset {
		return syscall.EINVAL
	}
	return dmabufErr(int(int32(attrs[attrRegDmabufMRFD].data)))
}

// dmabufErr is what dma_buf_get(fd) leaves a software device with: EBADF for a descriptor that
// is not open in the process, EINVAL for one that is not a dma-buf, EOPNOTSUPP for a dma-buf.
// The engine runs in the program's process, so its descriptors are the program's.
func dmabufErr(fd int) error {
	if fd < 0 {
		return syscall.EBADF
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
		return syscall.EBADF
	}
	// A dma-buf's file is named "/dmabuf:NAME" since Linux 5.15 ("anon_inode:dmabuf" before).
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err == nil && (strings.HasPrefix(target, "/dmabuf:") || target == "anon_inode:dmabuf") {
		return syscall.EOPNOTSUPP
	}
	return syscall.EINVAL
}
