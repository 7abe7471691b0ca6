//go:build linux

package uverbs

import (
	"errors"
	"syscall"
)

// call is one decoded command: the core request and response areas and the driver's (udata),
// as ib_uverbs_write lays them out for the handler.
type call struct {
	cmd     uint32
	in      []byte // the core request (for legacy commands with a response, it starts with it)
	outAddr uint64 // where the core response goes
	outLen  int
	udIn    []byte // driver data in
	udAddr  uint64 // driver data out
	udLen   int
}

// method describes one command the way the kernel's uverbs_api_write_method does.
type method struct {
	req, resp int // core request and response sizes (min sizes checked by verify_hdr)
	udata     bool
	hasResp   bool
	run       func(f *File, c *call) error
}

var legacyMethods = map[uint32]method{
	cmdGetContext:        {getContextReq, getContextResp, true, true, (*File).getContext},
	cmdQueryDevice:       {queryDeviceReq, queryDeviceResp, false, true, (*File).queryDevice},
	cmdQueryPort:         {queryPortReq, queryPortResp, false, true, (*File).queryPort},
	cmdAllocPD:           {allocPDReq, allocPDResp, true, true, (*File).allocPD},
	cmdDeallocPD:         {deallocPDReq, 0, false, false, (*File).deallocPD},
	cmdCreateAH:          {createAHReq, createAHResp, true, true, (*File).createAH},
	cmdDestroyAH:         {destroyAHReq, 0, false, false, (*File).destroyAH},
	cmdRegMR:             {regMRReq, regMRResp, true, true, (*File).regMR},
	cmdDeregMR:           {deregMRReq, 0, false, false, (*File).deregMR},
	cmdCreateCompChannel: {compChannelReq, compChannelResp, false, true, (*File).createCompChannel},
	cmdCreateCQ:          {createCQReq, createCQResp, true, true, (*File).createCQ},
	cmdDestroyCQ:         {destroyCQReq, destroyCQResp, false, true, (*File).destroyCQ},
	cmdCreateQP:          {createQPReq, createQPResp, true, true, (*File).createQP},
	cmdQueryQP:           {queryQPReq, queryQPResp, false, true, (*File).queryQP},
	cmdModifyQP:          {modifyQPReq, 0, true, false, (*File).modifyQP},
	cmdDestroyQP:         {destroyQPReq, destroyQPResp, false, true, (*File).destroyQP},
}

var exMethods = map[uint32]method{
	cmdQueryDevice: {exQueryDeviceReq, exQueryDeviceResp, true, true, (*File).exQueryDevice},
	cmdCreateCQ:    {exCreateCQReq, exCreateCQResp, true, true, (*File).exCreateCQ},
}

// Write carries out the command in b, the whole buffer a program passed to write(2) on the
// command fd, and returns len(b) or an error wrapping the kernel's errno (a syscall.Errno, found
// with errors.As). It never panics on malformed input.
func (f *File) Write(b []byte) (int, error) {
	c, m, err := decode(b)
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return 0, syscall.EIO
	}
	if c.cmd != cmdGetContext && !f.hasCtx {
		return 0, syscall.EINVAL // ib_uverbs_get_ucontext_file: no ucontext yet
	}
	if err := m.run(f, c); err != nil {
		return 0, err
	}
	return len(b), nil
}

// decode parses the headers of b and splits it into core and driver parts (ib_uverbs_write,
// uapi_get_method, verify_hdr).
func decode(b []byte) (*call, *method, error) {
	if len(b) < hdrSize {
		return nil, nil, syscall.EINVAL
	}
	command := u32(b, 0)
	inWords, outWords := int(u16(b, 4)), int(u16(b, 6))
	if command&^(cmdFlagExtended|cmdMask) != 0 {
		return nil, nil, syscall.EINVAL
	}
	idx := command & cmdMask
	if command&cmdFlagExtended != 0 {
		m, ok := exMethods[idx]
		if !ok {
			return nil, nil, syscall.EOPNOTSUPP
		}
		return decodeEx(b, idx, inWords, outWords, &m)
	}
	m, ok := legacyMethods[idx]
	if !ok {
		return nil, nil, syscall.EOPNOTSUPP
	}
	count := len(b)
	if inWords*4 != count {
		return nil, nil, syscall.EINVAL
	}
	if count < m.req+hdrSize {
		if idx == cmdDestroyCQ && count == 16 { // rdma-core v18/v19 sent a short DESTROY_CQ
			b = padTo(b, 24)
			count = 24
		} else {
			return nil, nil, syscall.ENOSPC
		}
	}
	if outWords*4 < m.resp {
		return nil, nil, syscall.ENOSPC
	}
	buf := b[hdrSize:count]
	c := &call{cmd: idx, in: buf}
	outLen := outWords * 4
	if m.udata {
		c.in = buf[:m.req]
		c.udIn = buf[m.req:]
	}
	if m.hasResp {
		c.outAddr = u64(buf, 0)
		c.outLen = outLen
		if m.udata {
			c.outLen = m.resp
			c.udAddr = c.outAddr + uint64(m.resp)
			c.udLen = outLen - m.resp
		}
	}
	return c, &m, nil
}

func decodeEx(b []byte, idx uint32, inWords, outWords int, m *method) (*call, *method, error) {
	if len(b) < hdrSize+exHdrSize {
		return nil, nil, syscall.EINVAL
	}
	resp := u64(b, 8)
	provIn, provOut := int(u16(b, 16)), int(u16(b, 18))
	reserved := u32(b, 20)
	count := len(b) - hdrSize - exHdrSize
	switch {
	case (inWords+provIn)*8 != count:
		return nil, nil, syscall.EINVAL
	case inWords*8 < m.req:
		return nil, nil, syscall.ENOSPC
	case reserved != 0:
		return nil, nil, syscall.EINVAL
	case resp != 0 && outWords == 0 && provOut == 0:
		return nil, nil, syscall.EINVAL
	case resp != 0 && outWords*8 < m.resp:
		return nil, nil, syscall.ENOSPC
	case resp == 0 && (outWords != 0 || provOut != 0):
		return nil, nil, syscall.EINVAL
	}
	buf := b[hdrSize+exHdrSize:]
	c := &call{
		cmd: idx, in: buf[:inWords*8], outAddr: resp, outLen: outWords * 8,
		udIn: buf[inWords*8:], udAddr: resp + uint64(outWords*8), udLen: provOut * 8,
	}
	return c, m, nil
}

// request returns the core request zero-padded to n bytes, or EOPNOTSUPP when the caller sent a
// longer request with non-zero bytes past n (uverbs_request).
func (c *call) request(n int) ([]byte, error) {
	if len(c.in) > n && !cleared(c.in[n:]) {
		return nil, syscall.EOPNOTSUPP
	}
	return padTo(c.in, n), nil
}

// respond copies resp to the core response area, zero-filling what the caller gave beyond it
// (uverbs_response).
func (f *File) respond(c *call, resp []byte) error {
	n := min(c.outLen, len(resp))
	if err := f.mem.Write(c.outAddr, resp[:n]); err != nil {
		return syscall.EFAULT
	}
	if c.outLen > n {
		if err := f.mem.Write(c.outAddr+uint64(n), make([]byte, c.outLen-n)); err != nil {
			return syscall.EFAULT
		}
	}
	return nil
}

// respondDriver copies as much of the driver response as the caller has room for
// (ib_copy_to_udata(udata, &resp, min(sizeof(resp), udata->outlen))).
func (f *File) respondDriver(c *call, resp []byte) error {
	n := min(c.udLen, len(resp))
	if n == 0 {
		return nil
	}
	if err := f.mem.Write(c.udAddr, resp[:n]); err != nil {
		return syscall.EFAULT
	}
	return nil
}

// udataCleared reports whether the driver input is all zeros (ib_is_udata_cleared).
func (c *call) udataCleared() bool { return cleared(c.udIn) }

// driverCmd copies the driver request into a struct of size n (ib_copy_from_udata of
// min(n, inlen)); it fails with EINVAL when the caller sent less than minLen bytes or more than n
// with non-zero bytes past n, as EFA's handlers check.
func (c *call) driverCmd(n, minLen int) ([]byte, error) {
	if len(c.udIn) < minLen {
		return nil, syscall.EINVAL
	}
	if len(c.udIn) > n && !cleared(c.udIn[n:]) {
		return nil, syscall.EINVAL
	}
	return padTo(c.udIn[:min(n, len(c.udIn))], n), nil
}

// Errno returns the errno carried by err (EIO for an error without one).
func Errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}
