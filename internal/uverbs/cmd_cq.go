//go:build linux

package uverbs

import (
	"math/bits"
	"syscall"
	"unsafe"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/uapi"
	"golang.org/x/sys/unix"
)

// cqParams are the core fields of CREATE_CQ and EX_CREATE_CQ.
type cqParams struct {
	handle     uint64
	cqe        uint32
	vector     uint32
	channel    int32
	exCompMask uint32
	exFlags    uint32
}

// createCQ is the legacy CREATE_CQ.
func (f *File) createCQ(c *call) error {
	req, err := c.request(createCQReq)
	if err != nil {
		return err
	}
	p := cqParams{handle: u64(req, 8), cqe: u32(req, 16), vector: u32(req, 20), channel: int32(u32(req, 24))}
	h, cqe, err := f.newCQ(c, p)
	if err != nil {
		return err
	}
	resp := make([]byte, createCQResp)
	put32(resp, 0, h)
	put32(resp, 4, cqe)
	return f.finishCQ(c, h, resp)
}

// exCreateCQ is EX_CREATE_CQ: EINVAL for a comp_mask or reserved field; EOPNOTSUPP for creation
// flags (efa_create_cq).
func (f *File) exCreateCQ(c *call) error {
	req, err := c.request(exCreateCQReq)
	if err != nil {
		return err
	}
	p := cqParams{handle: u64(req, 0), cqe: u32(req, 8), vector: u32(req, 12), channel: int32(u32(req, 16)),
		exCompMask: u32(req, 20), exFlags: u32(req, 24)}
	if p.exCompMask != 0 || u32(req, 28) != 0 {
		return syscall.EINVAL
	}
	h, cqe, err := f.newCQ(c, p)
	if err != nil {
		return err
	}
	resp := make([]byte, exCreateCQResp)
	put32(resp, 0, h)
	put32(resp, 4, cqe)
	put32(resp, 12, uint32(min(c.outLen, exCreateCQResp))) // response_length
	return f.finishCQ(c, h, resp)
}

// finishCQ writes the core response, destroying the CQ when that fails.
func (f *File) finishCQ(c *call, h uint32, resp []byte) error {
	if err := f.respond(c, resp); err != nil {
		o := f.objs[h].(*cqObj)
		_ = f.d.e.DestroyCQ(o.cq)
		f.freeKeys([]uint64{o.ringKey, o.dbKey})
		f.remove(h)
		return err
	}
	return nil
}

// newCQ creates the CQ with efa_create_cq's checks, in the kernel's order: the completion vector
// (EINVAL) and channel (EBADF) (core), creation flags (EOPNOTSUPP), the entry count (EINVAL outside
// [1, max_cq_depth]), the driver command (EINVAL when shorter than num_sub_cqs, with unknown
// non-zero fields, a comp_mask, no entry size or a sub-CQ count other than the device's). The
// ring and the doorbell page are regions of the command fd; the driver response names them.
func (f *File) newCQ(c *call, p cqParams) (uint32, uint32, error) {
	if err := f.admit(kindCQ); err != nil {
		return 0, 0, err
	}
	var ch *compChannel
	if p.vector >= uint32(f.d.cfg.CompVectors) {
		return 0, 0, syscall.EINVAL
	}
	if p.channel >= 0 { // ib_uverbs_lookup_comp_file: not this context's channel is EBADF
		if ch = f.channels[p.channel]; ch == nil {
			return 0, 0, syscall.EBADF
		}
	}
	if p.exFlags != 0 {
		return 0, 0, syscall.EOPNOTSUPP
	}
	if p.cqe < 1 || p.cqe > uint32(f.d.cfg.MaxCQE) {
		return 0, 0, syscall.EINVAL
	}
	cmd, err := c.driverCmd(efaCreateCQCmdSize, efaCreateCQCmdMin)
	if err != nil {
		return 0, 0, err
	}
	entrySize, subCQs, flags := u32(cmd, 4), u16(cmd, 8), cmd[10]
	if u32(cmd, 0) != 0 || !cleared(cmd[11:16]) || entrySize == 0 || subCQs != 1 {
		return 0, 0, syscall.EINVAL
	}
	eflags := int(flags) // efa_ibv_create_cq's flags are the engine's (uapi.CQFlag*)
	if eflags&^(uapi.CQFlagWithCompletionChannel|uapi.CQFlagWithSGID|uapi.CQFlagSQ64BitReqID) != 0 {
		return 0, 0, syscall.EOPNOTSUPP
	}
	if entrySize != efaio.RxCQEExSize && (entrySize != efaio.RxCQESize || eflags&uapi.CQFlagWithSGID != 0) {
		return 0, 0, syscall.EINVAL // the device writes efa_io_rx_cdesc or efa_io_rx_cdesc_ex
	}
	// The ring has room for MaxRQSGE times the entries asked for (up to MaxCQE), and the
	// response says so, as a device may give a CQ more than it was asked for: libfabric 2.6's
	// efa-direct sizes its receive CQ in WRs (max_rq_wr / max_rq_sge) but lets as many receives
	// be outstanding as its RQ has descriptors (max_recv_wr × max_recv_sge), and a ring lapped
	// loses completions for good (docs/cabi.md, "Completion queues").
	entries := uint32(min(uint64(p.cqe)*uint64(max(f.d.cfg.MaxRQSGE, 1)), uint64(f.d.cfg.MaxCQE)))
	depth := uint32(1) << bits.Len32(entries-1)
	size := int(depth * entrySize)
	ringKey, ring, err := f.reg.Alloc(size)
	if err != nil {
		return 0, 0, err
	}
	dbKey, dbPage, err := f.reg.Alloc(userPageSize)
	if err != nil {
		f.reg.Free(ringKey)
		return 0, 0, err
	}
	o := &cqObj{handle: p.handle, ch: ch, ringKey: ringKey, dbKey: dbKey}
	owner := &cqOwner{f: f, obj: o}
	cq, err := f.d.e.CreateCQ(engine.CQInit{
		Entries: int(entries), Flags: eflags, EntrySize: int(entrySize), Owner: owner, Notify: o.notify,
		Ring: ring[:size], Doorbell: (*uint32)(unsafe.Pointer(&dbPage[0])),
		// Written as EFA hardware writes it: libefa 44 reports polls made with
		// ibv_start_poll/next_poll/end_poll nowhere, so the doorbell's consumer count can stay
		// a whole ring behind a consumer that keeps up (docs/cabi.md, "Completion queues").
		Unpaced: true,
	})
	if err != nil {
		f.freeKeys([]uint64{ringKey, dbKey})
		return 0, 0, err
	}
	o.cq = cq
	f.cqIdx++
	drv := make([]byte, efaCreateCQRespSize)
	put32(drv, 0, efaCreateCQRespDBOff)
	put64(drv, 8, ringKey)
	put64(drv, 16, uint64(roundPage(size)))
	put16(drv, 24, f.cqIdx)
	put32(drv, 28, 0) // db_off
	put64(drv, 32, dbKey)
	h := f.add(o)
	if err := f.respondDriver(c, drv); err != nil {
		_ = f.d.e.DestroyCQ(cq)
		f.freeKeys([]uint64{ringKey, dbKey})
		f.remove(h)
		return 0, 0, err
	}
	return h, uint32(cq.Depth()), nil
}

// notify is the engine's completion-event hook: one ib_uverbs_comp_event_desc to the channel.
// It runs under the engine's lock and must not block.
func (o *cqObj) notify() {
	if o.ch == nil {
		return
	}
	var rec [8]byte
	put64(rec[:], 0, o.handle)
	if sendEvent(o.ch.dev, rec[:]) {
		o.compSent.Add(1)
	}
}

// destroyCQ is DESTROY_CQ: EBUSY while QPs use the CQ; the response counts the events reported.
func (f *File) destroyCQ(c *call) error {
	req, err := c.request(destroyCQReq)
	if err != nil {
		return err
	}
	h := u32(req, 8)
	o, ok := lookup[*cqObj](f, h)
	if !ok {
		return syscall.EINVAL
	}
	if err := f.d.e.DestroyCQ(o.cq); err != nil {
		return err
	}
	o.dead = true
	f.freeKeys([]uint64{o.ringKey, o.dbKey})
	f.remove(h)
	reported := o.compSent.Load()
	if o.ch != nil {
		reported -= o.ch.discard(o.handle)
	}
	resp := make([]byte, destroyCQResp)
	put32(resp, 0, reported)
	put32(resp, 4, o.asyncSent.Load()-f.discardAsync(o.handle))
	return f.respond(c, resp)
}

func roundPage(n int) int { return (n + userPageSize - 1) &^ (userPageSize - 1) }

func closeFDs(fds ...int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// discard removes the unread events of the CQ with user handle cq from the channel and returns
// how many there were (see discardEvents).
func (ch *compChannel) discard(cq uint64) uint32 {
	return discardEvents(ch.kept, ch.dev, 8, cq)
}

// discardEvents removes the unread records of size bytes whose first 8 bytes are element from
// the stream socket pair (user, dev) and returns how many there were, as the kernel drops a
// destroyed object's queued events and reports only those read (ib_uverbs_release_ucq,
// ib_uverbs_release_uevent; libibverbs' destroy waits until it has acknowledged as many as
// reported). The queue is read from the File's copy of the program's end (FDs.Give); other
// records are queued again, in order.
func discardEvents(user int, dev, size int, element uint64) uint32 {
	var buf, keep []byte
	rec := make([]byte, 4096)
	for {
		n, _, err := unix.Recvfrom(user, rec, unix.MSG_DONTWAIT)
		if n <= 0 || err != nil {
			break
		}
		buf = append(buf, rec[:n]...)
	}
	var dropped uint32
	for len(buf) >= size {
		if u64(buf, 0) == element {
			dropped++
		} else {
			keep = append(keep, buf[:size]...)
		}
		buf = buf[size:]
	}
	keep = append(keep, buf...) // a partial record (a concurrent reader) goes back as it was
	if len(keep) > 0 {
		sendEvent(dev, keep)
	}
	return dropped
}
