//go:build linux

package uverbs

import (
	"encoding/binary"
	"syscall"

	"github.com/softefa/softefa/internal/uapi"
	"golang.org/x/sys/unix"
)

// getContext is GET_CONTEXT (ib_uverbs_get_context, efa_alloc_ucontext): it creates the async
// event fd and answers EFA's device parameters. EINVAL for a second context on the File;
// EOPNOTSUPP when the library does not acknowledge TX batching or the minimum SQ size the device
// uses (efa_user_comp_handshake).
func (f *File) getContext(c *call) error {
	if _, err := c.request(getContextReq); err != nil {
		return err
	}
	if f.hasCtx {
		return syscall.EINVAL
	}
	cmd := padTo(c.udIn[:min(len(c.udIn), efaAllocUcontextCmdSize)], efaAllocUcontextCmdSize)
	cfg := &f.d.cfg
	mask := u32(cmd, 0)
	if cfg.MaxTxBatch != 0 && mask&efaAllocUcontextCmdTxBatch == 0 ||
		cfg.MinSQWR != 0 && mask&efaAllocUcontextCmdMinSQWR == 0 {
		return syscall.EOPNOTSUPP
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
	resp := make([]byte, getContextResp)
	put32(resp, 0, uint32(n))
	put32(resp, 4, uint32(f.d.cfg.CompVectors))
	drv := make([]byte, efaAllocUcontextRespSize)
	put32(drv, 4, efaCmdsSuppUdataQueryDevice|efaCmdsSuppUdataCreateAH)
	put16(drv, 8, 1) // sub_cqs_per_cq
	put16(drv, 10, uint16(cfg.InlineBufSize))
	put32(drv, 12, uint32(cfg.MaxLLQSize))
	put16(drv, 16, uint16(cfg.MaxTxBatch))
	put16(drv, 18, uint16(cfg.MinSQWR))
	put16(drv, 20, uint16(cfg.InlineBufSizeEx)) // inline_buf_size_ex (reserved in v44)
	if err := f.respondDriver(c, drv); err != nil {
		unix.Close(ours)
		unix.Close(theirs)
		return err
	}
	if err := f.respond(c, resp); err != nil {
		unix.Close(ours)
		unix.Close(theirs)
		return err
	}
	f.async, f.asyncFD0 = ours, theirs
	f.hasCtx = true
	return nil
}

// deviceAttr encodes struct ib_uverbs_query_device_resp (efa_query_device).
func (f *File) deviceAttr() []byte {
	cfg := &f.d.cfg
	b := make([]byte, queryDeviceResp)
	// fw_ver: libefa prints its first four bytes as "a.b.c.d"; 0.0.0.0 as package verbs reports.
	binary.BigEndian.PutUint64(b[8:], f.d.guid)  // node_guid (__be64)
	binary.BigEndian.PutUint64(b[16:], f.d.guid) // sys_image_guid
	put64(b, 24, cfg.MaxMRSize)
	put64(b, 32, userPageSize) // page_size_cap
	put32(b, 40, 0x1d0f)       // vendor_id: Amazon
	put32(b, 44, cfg.VendorPartID)
	put32(b, 48, cfg.HWVer)
	put32(b, 52, uint32(cfg.MaxQP))
	put32(b, 56, uint32(min(cfg.MaxSQWR, cfg.MaxRQWR))) // max_qp_wr
	put32(b, 60, 0)                                     // device_cap_flags
	put32(b, 64, uint32(min(cfg.MaxSQSGE, cfg.MaxRQSGE)))
	put32(b, 68, uint32(cfg.MaxSGERD))
	put32(b, 72, uint32(cfg.MaxCQ))
	put32(b, 76, uint32(cfg.MaxCQE))
	put32(b, 80, uint32(cfg.MaxMR))
	put32(b, 84, uint32(cfg.MaxPD))
	put32(b, 144, uint32(cfg.MaxAH))
	put16(b, 168, 1) // max_pkeys
	b[171] = 1       // phys_port_cnt
	return b
}

// queryDevice is QUERY_DEVICE.
func (f *File) queryDevice(c *call) error {
	if _, err := c.request(queryDeviceReq); err != nil {
		return err
	}
	return f.respond(c, f.deviceAttr())
}

// exQueryDevice is EX_QUERY_DEVICE with EFA's efa_ibv_ex_query_device_resp (ib_uverbs_ex_query_device).
func (f *File) exQueryDevice(c *call) error {
	req, err := c.request(exQueryDeviceReq)
	if err != nil {
		return err
	}
	if u32(req, 0) != 0 || u32(req, 4) != 0 { // comp_mask, reserved
		return syscall.EINVAL
	}
	if !c.udataCleared() {
		return syscall.EINVAL
	}
	cfg := &f.d.cfg
	resp := make([]byte, exQueryDeviceFull)
	copy(resp, f.deviceAttr())
	put32(resp, queryDeviceResp+4, uint32(min(c.outLen, exQueryDeviceFull))) // response_length
	caps := uint32(efaCapCQNotifications)
	for _, m := range [...][2]uint32{
		{uapi.CapRDMARead, efaCapRDMARead}, {uapi.CapRNRRetry, efaCapRNRRetry},
		{uapi.CapCQWithSGID, efaCapCQWithSGID}, {uapi.CapRDMAWrite, efaCapRDMAWrite},
		{uapi.CapUnsolicitedWriteRecv, efaCapUnsolicitedWriteRecv},
	} {
		if cfg.Caps&m[0] != 0 {
			caps |= m[1]
		}
	}
	if cfg.RequestID64 {
		caps |= efaCapSQ64BitReqID
	}
	drv := make([]byte, efaExQueryDeviceRespSize)
	put32(drv, 4, uint32(cfg.MaxSQWR))
	put32(drv, 8, uint32(cfg.MaxRQWR))
	put16(drv, 12, uint16(cfg.MaxSQSGE))
	put16(drv, 14, uint16(cfg.MaxRQSGE))
	put32(drv, 16, cfg.MaxRDMASize)
	put32(drv, 20, caps)
	if err := f.respondDriver(c, drv); err != nil {
		return err
	}
	return f.respond(c, resp)
}

// queryPort is QUERY_PORT (efa_query_port): port 1 only, ACTIVE, max_msg_sz the MTU.
func (f *File) queryPort(c *call) error {
	req, err := c.request(queryPortReq)
	if err != nil {
		return err
	}
	if req[8] != 1 {
		return syscall.EINVAL
	}
	cfg := &f.d.cfg
	width, speed := uint8(2), uint8(32) // 4X EDR
	if cfg.LinkSpeedGbps >= 400 {
		width, speed = 16, 64 // 8X HDR
	}
	b := make([]byte, queryPortResp)
	put32(b, 4, uint32(cfg.MTU)) // max_msg_sz
	put32(b, 16, 1)              // gid_tbl_len
	put16(b, 20, 1)              // pkey_tbl_len
	b[26] = uapi.PortActive
	b[27], b[28] = mtuEnum(cfg.MTU), mtuEnum(cfg.MTU)
	b[29] = 1 // lmc
	b[30] = 1 // max_vl_num
	b[34], b[35] = width, speed
	b[36] = uapi.PhysStateLinkUp
	return f.respond(c, b)
}

// mtuEnum is ib_mtu_int_to_enum.
func mtuEnum(n int) uint8 {
	switch {
	case n >= 4096:
		return uapi.MTU4096
	case n >= 2048:
		return 4
	case n >= 1024:
		return 3
	case n >= 512:
		return 2
	}
	return 1
}
