//go:build linux

package uverbs

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/uapi"
	"golang.org/x/sys/unix"
)

// fakeMem is a Memory of a few segments at made-up addresses. Bytes for writing refuses a range
// in the segment at readOnly (when set), as the kernel refuses to pin a read-only mapping for
// writing.
type fakeMem struct {
	segs     map[uint64][]byte
	readOnly uint64
}

func (m *fakeMem) find(addr, n uint64) ([]byte, error) {
	for base, b := range m.segs {
		if addr >= base && addr-base <= uint64(len(b)) && n <= uint64(len(b))-(addr-base) {
			return b[addr-base : addr-base+n], nil
		}
	}
	return nil, syscall.EFAULT
}

func (m *fakeMem) Read(addr uint64, b []byte) error {
	s, err := m.find(addr, uint64(len(b)))
	if err == nil {
		copy(b, s)
	}
	return err
}

func (m *fakeMem) Write(addr uint64, b []byte) error {
	s, err := m.find(addr, uint64(len(b)))
	if err == nil {
		copy(s, b)
	}
	return err
}

func (m *fakeMem) Span(addr, n uint64, write bool) (mem.Span, error) {
	if ro := m.segs[m.readOnly]; write && ro != nil && addr >= m.readOnly && addr-m.readOnly < uint64(len(ro)) {
		return mem.Span{}, syscall.EFAULT
	}
	b, err := m.find(addr, n)
	return mem.Own(b), err
}

// heapRegions is a Regions over Go memory, for tests that do not need a real memfd.
type heapRegions struct {
	next uint64
	live map[uint64][]byte
}

func (r *heapRegions) Alloc(size int) (uint64, []byte, error) {
	if r.live == nil {
		r.live = make(map[uint64][]byte)
	}
	n := roundPage(size)
	w := make([]uint64, n/8)
	b := unsafeBytes(w)
	k := r.next
	r.next += uint64(n)
	r.live[k] = b
	return k, b, nil
}

func (r *heapRegions) Free(key uint64) { delete(r.live, key) }

const (
	respAddr = 0x10000 // a 4 KiB response buffer
	bufAddr  = 0x20000 // a 64 KiB "user buffer" for memory regions
	roAddr   = 0x40000 // a 4 KiB read-only page (TestPDAndMR)
)

type harness struct {
	t   *testing.T
	e   *engine.Device
	d   *Device
	f   *File
	mem *fakeMem
	reg *heapRegions
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	e, err := engine.NewDevice(config.Device{})
	if err != nil {
		t.Fatal(err)
	}
	mem := &fakeMem{segs: map[uint64][]byte{respAddr: make([]byte, 4096), bufAddr: make([]byte, 65536)}}
	h := &harness{t: t, e: e, d: NewDevice(e), mem: mem, reg: &heapRegions{}}
	h.f = h.d.Open(mem, h.reg, nil)
	t.Cleanup(func() {
		h.f.Close()
		h.d.Close()
		e.Close()
	})
	return h
}

// cmd builds a legacy command: header, core request (with the response address first when
// resp > 0) and driver data.
func cmd(command uint32, outWords int, core, drv []byte) []byte {
	b := make([]byte, hdrSize, hdrSize+len(core)+len(drv))
	b = append(b, core...)
	b = append(b, drv...)
	put32(b, 0, command)
	put16(b, 4, uint16(len(b)/4))
	put16(b, 6, uint16(outWords))
	return b
}

// withResp returns a core request of n bytes whose first 8 bytes point at respAddr.
func withResp(n int) []byte {
	b := make([]byte, n)
	put64(b, 0, respAddr)
	return b
}

func (h *harness) do(b []byte) error {
	h.t.Helper()
	clear(h.mem.segs[respAddr])
	n, err := h.f.Write(b)
	if err == nil && n != len(b) {
		h.t.Fatalf("Write returned %d for %d bytes", n, len(b))
	}
	return err
}

func (h *harness) must(b []byte) []byte {
	h.t.Helper()
	if err := h.do(b); err != nil {
		h.t.Fatalf("command %d: %v", u32(b, 0), err)
	}
	return h.mem.segs[respAddr]
}

func wantErrno(t *testing.T, err error, want syscall.Errno) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("got %v, want %v", err, want)
	}
}

func (h *harness) getContext() {
	drv := make([]byte, 8)
	put32(drv, 0, efaAllocUcontextCmdTxBatch|efaAllocUcontextCmdMinSQWR)
	r := h.must(cmd(cmdGetContext, (8+24)/4, withResp(8), drv))
	if u32(r, 4) != uint32(h.d.cfg.CompVectors) || int32(u32(r, 0)) < 0 { // num_comp_vectors
		h.t.Fatalf("GET_CONTEXT core response % x", r[:8])
	}
	syscall.Close(int(u32(r, 0)))
}

func (h *harness) allocPD() uint32 {
	r := h.must(cmd(cmdAllocPD, (4+8)/4, withResp(8), nil))
	return u32(r, 0)
}

// regMRCmd is a REG_MR command without driver data.
func regMRCmd(start, length, va uint64, pd, access uint32) []byte {
	core := withResp(regMRReq)
	put64(core, 8, start)
	put64(core, 16, length)
	put64(core, 24, va)
	put32(core, 32, pd)
	put32(core, 36, access)
	return cmd(cmdRegMR, 3, core, nil)
}

// createCQCmd is a CREATE_CQ command's core and EFA driver data: entries, no channel, one sub-CQ.
func createCQCmd(entries int, entrySize uint32, flags byte) (core, drv []byte) {
	core = withResp(createCQReq)
	put64(core, 8, 0xc0ffee)
	put32(core, 16, uint32(entries))
	put32(core, 24, ^uint32(0)) // no channel
	drv = make([]byte, 16)
	put32(drv, 4, entrySize)
	put16(drv, 8, 1)
	drv[10] = flags
	return core, drv
}

func (h *harness) createCQ(entries int, entrySize uint32, flags byte) (handle uint32, resp []byte) {
	core, drv := createCQCmd(entries, entrySize, flags)
	r := h.must(cmd(cmdCreateCQ, (8+40)/4, core, drv))
	return u32(r, 0), append([]byte(nil), r[:48]...)
}

func (h *harness) createQP(pd, cq uint32, typ byte, sqBytes, rqBytes uint32) (handle uint32, resp []byte) {
	core := withResp(createQPReq)
	put32(core, 16, pd)
	put32(core, 20, cq)
	put32(core, 24, cq)
	put32(core, 32, 16) // max_send_wr
	put32(core, 36, 16) // max_recv_wr
	put32(core, 40, 1)
	put32(core, 44, 1)
	core[53] = typ
	drv := make([]byte, 16)
	put32(drv, 4, rqBytes)
	put32(drv, 8, sqBytes)
	r := h.must(cmd(cmdCreateQP, (32+64)/4, core, drv))
	return u32(r, 0), append([]byte(nil), r[:96]...)
}

func TestHeaderErrors(t *testing.T) {
	h := newHarness(t)
	wantErrno(t, h.do([]byte{1, 2, 3}), syscall.EINVAL)
	wantErrno(t, h.do(cmd(cmdQueryDevice, 44, withResp(8), nil)), syscall.EINVAL) // no context yet
	h.getContext()
	bad := cmd(cmdQueryDevice, 44, withResp(8), nil)
	put16(bad, 4, 5) // in_words does not match the write size
	wantErrno(t, h.do(bad), syscall.EINVAL)
	wantErrno(t, h.do(cmd(cmdQueryDevice, 43, withResp(8), nil)), syscall.ENOSPC) // response too small
	wantErrno(t, h.do(cmd(cmdQueryPort, 10, withResp(8), nil)), syscall.ENOSPC)   // request too small
	wantErrno(t, h.do(cmd(21, 10, withResp(8), nil)), syscall.EOPNOTSUPP)         // POLL_CQ
	wantErrno(t, h.do(cmd(0x100|cmdQueryDevice, 44, withResp(8), nil)), syscall.EINVAL)
	long := append(withResp(8), 0, 0, 0, 0, 1, 0, 0, 0) // non-zero bytes past the request
	wantErrno(t, h.do(cmd(cmdQueryDevice, 44, long, nil)), syscall.EOPNOTSUPP)
	wantErrno(t, h.do(cmd(cmdGetContext, 8, withResp(8), make([]byte, 8))), syscall.EINVAL) // second context
	unmapped := withResp(8)
	put64(unmapped, 0, 0xdead0000)
	wantErrno(t, h.do(cmd(cmdQueryDevice, 44, unmapped, nil)), syscall.EFAULT)
}

func TestGetContextHandshake(t *testing.T) {
	h := newHarness(t)
	wantErrno(t, h.do(cmd(cmdGetContext, 8, withResp(8), make([]byte, 8))), syscall.EOPNOTSUPP)
	drv := make([]byte, 8)
	put32(drv, 0, efaAllocUcontextCmdTxBatch|efaAllocUcontextCmdMinSQWR)
	if err := h.do(cmd(cmdGetContext, 8, withResp(8), drv)); err != nil {
		t.Fatal(err)
	}
	r := h.mem.segs[respAddr]
	fd := int(u32(r, 0))
	defer syscall.Close(fd)
	drvResp := r[8:32]
	if u32(drvResp, 4) != efaCmdsSuppUdataQueryDevice|efaCmdsSuppUdataCreateAH || u16(drvResp, 8) != 1 ||
		u16(drvResp, 10) != 32 || u32(drvResp, 12) != 256<<10 || u16(drvResp, 16) != 16 || u16(drvResp, 18) != 16 ||
		u16(drvResp, 20) != 80 {
		t.Fatalf("efa_ibv_alloc_ucontext_resp % x", drvResp)
	}
}

func TestQueries(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	r := h.must(cmd(cmdQueryDevice, 44, withResp(8), nil))
	if u32(r, 40) != 0x1d0f || u32(r, 44) != 0xefa2 || r[171] != 1 || u16(r, 168) != 1 {
		t.Fatalf("query device: vendor %#x part %#x ports %d", u32(r, 40), u32(r, 44), r[171])
	}
	port := withResp(16)
	port[8] = 1
	r = h.must(cmd(cmdQueryPort, 10, port, nil))
	if u32(r, 4) != 8192 || r[26] != uapi.PortActive || r[27] != uapi.MTU4096 || u32(r, 16) != 1 {
		t.Fatalf("query port % x", r[:40])
	}
	port[8] = 2
	wantErrno(t, h.do(cmd(cmdQueryPort, 10, port, nil)), syscall.EINVAL)

	ex := make([]byte, hdrSize+exHdrSize+8)
	put32(ex, 0, cmdFlagExtended|cmdQueryDevice)
	put16(ex, 4, 1)  // in_words (8-byte units)
	put16(ex, 6, 38) // out_words
	put64(ex, 8, respAddr)
	put16(ex, 18, 3) // provider_out_words
	r = h.must(ex)
	if u32(r, 40) != 0x1d0f || u32(r, 180) != 304 {
		t.Fatalf("ex query device: vendor %#x response_length %d", u32(r, 40), u32(r, 180))
	}
	drv := r[304:]
	if u32(drv, 4) != 4096 || u32(drv, 8) != 8192 || u16(drv, 12) != 2 ||
		u32(drv, 20) != 0x6f { // RDMA_READ, RNR_RETRY, CQ_NOTIFICATIONS, CQ_WITH_SGID, RDMA_WRITE (1<<5), UNSOLICITED_WRITE_RECV (1<<6)
		t.Fatalf("efa_ibv_ex_query_device_resp % x", drv[:24])
	}
	put32(ex, hdrSize+exHdrSize, 1) // comp_mask
	wantErrno(t, h.do(ex), syscall.EINVAL)
	put32(ex, hdrSize+exHdrSize, 0)
	put32(ex, 20, 1) // cmd_hdr_reserved
	wantErrno(t, h.do(ex), syscall.EINVAL)
	put32(ex, 20, 0)
	put16(ex, 6, 2) // out_words below the core response
	wantErrno(t, h.do(ex), syscall.ENOSPC)
}

func TestPDAndMR(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	if pd != 0 {
		t.Fatalf("first handle %d, want 0", pd)
	}
	wantErrno(t, h.do(cmd(cmdAllocPD, 3, withResp(8), []byte{1, 0, 0, 0, 0, 0, 0, 0})), syscall.EINVAL)

	reg := func(start, length, va uint64, pd uint32, access uint32) error {
		return h.do(regMRCmd(start, length, va, pd, access))
	}
	wantErrno(t, reg(bufAddr, 4096, bufAddr+1, pd, 1), syscall.EINVAL)   // page offsets differ
	wantErrno(t, reg(bufAddr, 4096, bufAddr, pd, 2), syscall.EINVAL)     // REMOTE_WRITE without LOCAL_WRITE
	wantErrno(t, reg(bufAddr, 4096, bufAddr, pd+7, 1), syscall.EINVAL)   // unknown PD
	wantErrno(t, reg(bufAddr, 0, bufAddr, pd, 1), syscall.EINVAL)        // empty
	wantErrno(t, reg(0x900000, 4096, 0x900000, pd, 1), syscall.EFAULT)   // not mapped
	wantErrno(t, reg(bufAddr, 4096, bufAddr, pd, 1<<12), syscall.EINVAL) // unknown access bit
	h.mem.segs[roAddr], h.mem.readOnly = make([]byte, 4096), roAddr
	for _, access := range []uint32{1, 1 | 2, 1 | 4} { // LOCAL_WRITE, with REMOTE_WRITE or REMOTE_READ
		wantErrno(t, reg(roAddr, 4096, roAddr, pd, access), syscall.EFAULT) // cannot be pinned for writing
	}
	for _, access := range []uint32{0, 4} { // local read only; REMOTE_READ
		if err := reg(roAddr, 4096, roAddr, pd, access); err != nil {
			t.Fatalf("read-only page, access %#x: %v", access, err)
		}
		dereg := make([]byte, 4)
		put32(dereg, 0, u32(h.mem.segs[respAddr], 0))
		h.must(cmd(cmdDeregMR, 0, dereg, nil))
	}
	regDrv := func(drv []byte) error {
		core := withResp(regMRReq)
		put64(core, 8, bufAddr)
		put64(core, 16, 4096)
		put64(core, 24, bufAddr)
		put32(core, 32, pd)
		put32(core, 36, 1)
		return h.do(cmd(cmdRegMR, 3, core, drv))
	}
	wantErrno(t, regDrv([]byte{0, 0, 0, 0, 0, 0, 0, 1}), syscall.EINVAL) // the first 8 bytes are checked
	if err := regDrv([]byte{0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatalf("non-zero driver input past 8 bytes: %v (efa_alloc_mr does not look there)", err)
	}
	dereg0 := make([]byte, 4)
	put32(dereg0, 0, u32(h.mem.segs[respAddr], 0))
	h.must(cmd(cmdDeregMR, 0, dereg0, nil))
	if err := reg(bufAddr, 4096, bufAddr, pd, 1|4); err != nil {
		t.Fatal(err)
	}
	r := h.mem.segs[respAddr]
	mr, lkey := u32(r, 0), u32(r, 4)
	if lkey == 0 || u32(r, 8) == 0 {
		t.Fatalf("REG_MR keys % x", r[:12])
	}
	dealloc := make([]byte, 4)
	put32(dealloc, 0, pd)
	wantErrno(t, h.do(cmd(cmdDeallocPD, 0, dealloc, nil)), syscall.EBUSY)
	dereg := make([]byte, 4)
	put32(dereg, 0, mr)
	h.must(cmd(cmdDeregMR, 0, dereg, nil))
	wantErrno(t, h.do(cmd(cmdDeregMR, 0, dereg, nil)), syscall.EINVAL)
	h.must(cmd(cmdDeallocPD, 0, dealloc, nil))
	wantErrno(t, h.do(cmd(cmdDeallocPD, 0, dealloc, nil)), syscall.EINVAL)
}

func TestAH(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	core := withResp(createAHReq)
	put32(core, 16, pd)
	core[24] = 0xfe
	core[54] = 1
	// Without is_global (no GRH) the GID is not passed on, and an AH without one is refused:
	// perftest without -x asks for such an AH (docs/cabi.md).
	wantErrno(t, h.do(cmd(cmdCreateAH, (4+8)/4, core, nil)), syscall.EINVAL)
	core[53] = 1
	r := h.must(cmd(cmdCreateAH, (4+8)/4, core, nil))
	ah, ahn := u32(r, 0), u16(r, 8)
	if ahn == 0 || ahn == 0xffff {
		t.Fatalf("efa_address_handle %#x", ahn)
	}
	core[54] = 2
	wantErrno(t, h.do(cmd(cmdCreateAH, 3, core, nil)), syscall.EINVAL)
	core[54] = 1
	if err := h.do(cmd(cmdCreateAH, 3, core, make([]byte, 8))); err != nil {
		t.Fatalf("zero driver data: %v", err)
	}
	wantErrno(t, h.do(cmd(cmdCreateAH, 3, core, []byte{0, 0, 0, 0, 0, 0, 0, 1})), syscall.EINVAL)
	d := make([]byte, 4)
	put32(d, 0, ah)
	h.must(cmd(cmdDestroyAH, 0, d, nil))
}

func TestCQAndQP(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	cq, r := h.createCQ(64, 32, uapi.CQFlagWithSGID)
	drv := r[8:]
	// MaxRQSGE (2) times the entries asked for: 128 of 32 bytes.
	if u32(r, 4) != 128 || u32(drv, 0) != efaCreateCQRespDBOff || u64(drv, 16) != 4096 {
		t.Fatalf("CREATE_CQ response % x", r[:48])
	}
	if ring := h.reg.live[u64(drv, 8)]; len(ring) != 4096 || h.reg.live[u64(drv, 32)] == nil {
		t.Fatal("CQ regions missing")
	}
	cq16, r := h.createCQ(100, 16, 0)
	if u32(r, 4) != 256 || u64(r[8:], 16) != 4096 {
		t.Fatalf("16-byte CQ response % x", r[:48])
	}
	// Bad driver data: sub-CQs, entry size, flags, unknown trailing fields.
	bad := func(mut func(core, drv []byte)) error {
		core, drv := createCQCmd(8, 32, 0)
		mut(core, drv)
		return h.do(cmd(cmdCreateCQ, 12, core, drv))
	}
	wantErrno(t, bad(func(_, d []byte) { put16(d, 8, 2) }), syscall.EINVAL)
	wantErrno(t, bad(func(_, d []byte) { put32(d, 4, 0) }), syscall.EINVAL)
	wantErrno(t, bad(func(_, d []byte) { put32(d, 0, 1) }), syscall.EINVAL)
	wantErrno(t, bad(func(_, d []byte) { d[10] = 0x80 }), syscall.EOPNOTSUPP)
	wantErrno(t, bad(func(_, d []byte) { d[15] = 1 }), syscall.EINVAL)
	wantErrno(t, bad(func(c, _ []byte) { put32(c, 16, 0) }), syscall.EINVAL)
	wantErrno(t, bad(func(c, _ []byte) { put32(c, 16, 1<<20) }), syscall.EINVAL)
	wantErrno(t, bad(func(c, _ []byte) { put32(c, 20, uint32(h.d.cfg.CompVectors)) }), syscall.EINVAL) // comp_vector
	wantErrno(t, bad(func(c, _ []byte) { put32(c, 24, 77) }), syscall.EBADF)                           // not a channel

	qp, r := h.createQP(pd, cq, uapi.QPTypeDriver, 16*64, 16*16)
	drv = r[32:]
	if u32(r, 4) == 0 || u32(drv, 4) != dbPageQPRQOffset || u32(drv, 8) != dbPageQPSQOffset ||
		u64(drv, 24) != 4096 || u64(drv, 32) == u64(drv, 40) || h.reg.live[u64(drv, 32)] == nil || h.reg.live[u64(drv, 40)] == nil {
		t.Fatalf("CREATE_QP response % x", r[:96])
	}
	// QP on the 16-byte CQ, UD.
	qpUD, _ := h.createQP(pd, cq16, uapi.QPTypeUD, 16*64, 16*16)
	// wantQP asks for a QP of type typ (driver type drvType) with SQ and RQ rings of sq and rq
	// bytes, and wants it refused with want.
	wantQP := func(typ byte, drvType uint32, sq, rq int, want syscall.Errno) {
		t.Helper()
		core := withResp(createQPReq)
		put32(core, 16, pd)
		put32(core, 20, cq)
		put32(core, 24, cq)
		put32(core, 32, 16)
		put32(core, 36, 16)
		put32(core, 40, 1)
		put32(core, 44, 1)
		core[53] = typ
		drv := make([]byte, 16)
		put32(drv, 4, uint32(rq))
		put32(drv, 8, uint32(sq))
		put32(drv, 12, drvType)
		wantErrno(t, h.do(cmd(cmdCreateQP, 24, core, drv)), want)
	}
	wantQP(2, 0, 1024, 0, syscall.EOPNOTSUPP)                 // RC
	wantQP(uapi.QPTypeDriver, 1, 1024, 0, syscall.EOPNOTSUPP) // not SRD
	// Ring sizes past the device's limits (the program names them) are refused: a hostile
	// program would have the device map gigabytes.
	wantRings := func(sq, rq int, want syscall.Errno) {
		t.Helper()
		wantQP(uapi.QPTypeDriver, uapi.DriverQPTypeSRD, sq, rq, want)
	}
	cfg := h.d.cfg
	wantRings(ringBytes(cfg.MaxSQWR, 64)+64, 16*16, syscall.EINVAL)
	wantRings(16*64, ringBytes(cfg.MaxRQWR, 16*cfg.MaxRQSGE)+16, syscall.EINVAL)
	wantRings(1<<31, 16*16, syscall.EINVAL)

	dcq := make([]byte, 16)
	put64(dcq, 0, respAddr)
	put32(dcq, 8, cq)
	wantErrno(t, h.do(cmd(cmdDestroyCQ, 2, dcq, nil)), syscall.EBUSY)

	// RESET→INIT→RTR→RTS, then query.
	modify := func(state byte, mask uint32) error {
		core := make([]byte, modifyQPReq)
		put32(core, 64, qp)
		put32(core, 68, mask)
		put32(core, 72, 0x11111111)
		put32(core, 80, 7)
		core[96] = state
		core[104] = 1
		core[107] = 7
		return h.do(cmd(cmdModifyQP, 0, core, nil))
	}
	const st, pkey, port, qkey, sqpsn, rnr = 1, 1 << 4, 1 << 5, 1 << 6, 1 << 16, 1 << 11
	wantErrno(t, modify(3, st), syscall.EINVAL) // RESET→RTS
	if err := modify(1, st|pkey|port|qkey); err != nil {
		t.Fatal(err)
	}
	if err := modify(2, st); err != nil {
		t.Fatal(err)
	}
	if err := modify(3, st|sqpsn|rnr); err != nil {
		t.Fatal(err)
	}
	wantErrno(t, modify(3, st|1<<21), syscall.EOPNOTSUPP)
	wantErrno(t, modify(9, st), syscall.EINVAL)
	q := withResp(queryQPReq)
	put32(q, 8, qp)
	put32(q, 12, st|qkey|sqpsn)
	r = h.must(cmd(cmdQueryQP, 32, q, nil))
	if r[108] != 3 || u32(r, 84) != 0x11111111 || u32(r, 92) != 7 || u32(r, 64) != 16 || r[116] != 1 {
		t.Fatalf("QUERY_QP % x", r[:128])
	}
	put32(q, 12, 1<<20) // DEST_QPN
	wantErrno(t, h.do(cmd(cmdQueryQP, 32, q, nil)), syscall.EOPNOTSUPP)

	for _, qh := range []uint32{qp, qpUD} {
		d := make([]byte, 16)
		put64(d, 0, respAddr)
		put32(d, 8, qh)
		h.must(cmd(cmdDestroyQP, 1, d, nil))
	}
	if len(h.reg.live) != 4 { // the two CQs' rings and doorbell pages
		t.Fatalf("%d regions live after destroying the QPs", len(h.reg.live))
	}
	h.must(cmd(cmdDestroyCQ, 2, dcq, nil))
	short := dcq[:8] // the 16-byte DESTROY_CQ of rdma-core v18/v19
	put32(short, 0, 0)
	short = append(make([]byte, 8), dcq[8:16]...)
	put64(short, 0, respAddr)
	put32(short, 8, cq16)
	if err := h.do(cmd(cmdDestroyCQ, 2, short[:8], nil)); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("16-byte DESTROY_CQ naming handle 0 again: %v", err)
	}
}

func TestCloseTearsDown(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	cq, _ := h.createCQ(8, 32, 0)
	h.createQP(pd, cq, uapi.QPTypeUD, 16*64, 16*16)
	if err := h.f.Close(); err != nil {
		t.Fatal(err)
	}
	if len(h.reg.live) != 0 {
		t.Fatalf("%d regions live after Close", len(h.reg.live))
	}
	wantErrno(t, h.do(cmd(cmdAllocPD, 3, withResp(8), nil)), syscall.EIO)
}

func TestMemfdRegions(t *testing.T) {
	m, err := NewMemfd("test")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	k1, b1, err := m.Alloc(100)
	if err != nil || k1 != 0 || len(b1) != 4096 {
		t.Fatalf("Alloc: %d %d %v", k1, len(b1), err)
	}
	k2, _, _ := m.Alloc(8192)
	k3, _, _ := m.Alloc(4096)
	if k2 != 4096 || k3 != 12288 {
		t.Fatalf("keys %d %d", k2, k3)
	}
	b1[5] = 42
	// A second mapping of the same offset, as libefa's mmap makes, sees the same memory.
	other, err := syscall.Mmap(m.FD(), int64(k1), 4096, syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(other)
	if other[5] != 42 {
		t.Fatal("the second mapping does not share memory")
	}
	m.Free(k2)
	m.Free(k1)
	if other[5] != 0 {
		t.Fatal("a freed region kept its contents")
	}
	k4, _, _ := m.Alloc(12288) // fits the merged hole [0, 12288)
	if k4 != 0 {
		t.Fatalf("reuse: key %d", k4)
	}
	if _, _, err := m.Alloc(0); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Alloc(0): %v", err)
	}
}

// TestCompChannel arms a CQ with an entry already unpolled: the event comes at once, and
// DESTROY_CQ reports only the events the program read, after discarding the unread one.
func TestCompChannel(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	r := h.must(cmd(cmdCreateCompChannel, 1, withResp(8), nil))
	chFD := int(u32(r, 0))
	defer syscall.Close(chFD)

	core := withResp(createCQReq)
	put64(core, 8, 0xabcdef)
	put32(core, 16, 8)
	put32(core, 24, uint32(chFD))
	drv := make([]byte, 16)
	put32(drv, 4, 32)
	put16(drv, 8, 1)
	drv[10] = uapi.CQFlagWithCompletionChannel
	r = h.must(cmd(cmdCreateCQ, 12, core, drv))
	cqh := u32(r, 0)
	dbKey := u64(r[8:], 32)
	db := (*uint32)(unsafePointer(h.reg.live[dbKey]))

	// Flush a receive into the CQ: a UD QP with one posted receive, moved to ERR.
	pd := h.allocPD()
	qp, qr := h.createQP(pd, cqh, uapi.QPTypeUD, 16*64, 16*16)
	rq := h.reg.live[u64(qr[32:], 16)]
	put64(rq, 0, bufAddr)      // addr
	put32(rq, 12, 1<<30|1<<31) // first, last
	atomicStore(qpDB(h, qr, dbPageQPRQOffset), 1)
	mod := make([]byte, modifyQPReq)
	put32(mod, 64, qp)
	put32(mod, 68, 1|1<<4|1<<5|1<<6) // INIT: state, pkey index, port, qkey
	mod[96], mod[104] = 1, 1
	h.must(cmd(cmdModifyQP, 0, mod, nil))
	put32(mod, 68, 1)
	mod[96] = 6 // ERR flushes the receive
	h.must(cmd(cmdModifyQP, 0, mod, nil))

	atomicStore(db, 1<<31) // arm: consumer count 0, one entry unpolled
	h.f.Arm(cqh)
	ev := make([]byte, 8)
	syscall.SetNonblock(chFD, true)
	if n, err := syscall.Read(chFD, ev); n != 8 || err != nil || u64(ev, 0) != 0xabcdef {
		t.Fatalf("event: %d %v % x", n, err, ev)
	}
	atomicStore(db, 1<<29|1<<31) // the next cmd_sn: another event, since the entry is still there
	h.f.Arm(cqh)

	r = h.destroyQPAndCQ(qp, cqh)
	if u32(r, 0) != 1 {
		t.Fatalf("comp_events_reported %d, want the 1 read", u32(r, 0))
	}
	if n, _ := syscall.Read(chFD, ev); n > 0 {
		t.Fatal("the unread event was not discarded")
	}
}

func qpDB(h *harness, resp []byte, off int) *uint32 {
	key := u64(resp[32:], 40) // sq_db_mmap_key
	if off == dbPageQPRQOffset {
		key = u64(resp[32:], 32) // rq_db_mmap_key
	}
	return (*uint32)(unsafePointer(h.reg.live[key][off:]))
}

// TestAsyncEventDiscard drains a QP's send queue with SQ_DRAINED asked for (RTS to SQD with
// en_sqd_async_notify and nothing in flight), which raises the event on the async fd; destroying
// the QP with the event unread discards it and reports none. (A CQ made through uverbs raises no
// async event: it is never paced on its doorbell, so it cannot overrun; docs/cabi.md.)
func TestAsyncEventDiscard(t *testing.T) {
	h := newHarness(t)
	drv := make([]byte, 8)
	put32(drv, 0, efaAllocUcontextCmdTxBatch|efaAllocUcontextCmdMinSQWR)
	r := h.must(cmd(cmdGetContext, (8+24)/4, withResp(8), drv))
	asyncFD := int(u32(r, 0))
	defer syscall.Close(asyncFD)

	pd := h.allocPD()
	cq, _ := h.createCQ(1, 32, 0)
	qp, _ := h.createQP(pd, cq, uapi.QPTypeUD, 16*64, 16*16)
	mod := make([]byte, modifyQPReq)
	put32(mod, 64, qp)
	for _, m := range []struct {
		state byte
		mask  uint32
	}{
		{1, 1 | 1<<4 | 1<<5 | 1<<6},          // INIT: STATE | PKEY_INDEX | PORT | QKEY
		{2, 1},                               // RTR
		{3, 1 | uapi.QPAttrSQPSN},            // RTS
		{4, 1 | uapi.QPAttrEnSQDAsyncNotify}, // SQD, notify when drained
	} {
		put32(mod, 68, m.mask)
		mod[96], mod[100], mod[104] = m.state, 1, 1
		h.must(cmd(cmdModifyQP, 0, mod, nil))
	}

	// Wait for the forwarder to queue the event, without reading it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		fds := []unix.PollFd{{Fd: int32(asyncFD), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 10); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no SQ_DRAINED event")
		}
	}
	d := make([]byte, 16)
	put64(d, 0, respAddr)
	put32(d, 8, qp)
	r = h.must(cmd(cmdDestroyQP, 1, d, nil))
	if u32(r, 0) != 0 {
		t.Fatalf("events_reported %d, want 0 (the event was never read)", u32(r, 0))
	}
	fds := []unix.PollFd{{Fd: int32(asyncFD), Events: unix.POLLIN}}
	if n, _ := unix.Poll(fds, 0); n != 0 {
		t.Fatal("the unread event is still queued")
	}
}

// TestCQ16 flushes two receives into a CQ of 16-byte entries (what libefa 44 creates without
// source GIDs): the entries are 16 bytes apart, each with phase 1, the receive queue type and
// its request id.
func TestCQ16(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	cq, r := h.createCQ(4, 16, 0)
	ring := h.reg.live[u64(r[8:], 8)]
	qp, qr := h.createQP(pd, cq, uapi.QPTypeUD, 16*64, 16*16)
	h.flushTwoRecvs(qp, qr, 7)
	for i := range 2 {
		e := ring[i*16:]
		if u16(e, 0) != uint16(7+i) || e[3]&1 != 1 || e[3]>>1&3 != 2 || e[2] == 0 {
			t.Fatalf("entry %d: % x", i, e[:16])
		}
	}
	if !cleared(ring[32:64]) {
		t.Fatalf("bytes past the second 16-byte entry were written: % x", ring[32:64])
	}
}

// flushTwoRecvs posts two receives (request ids first and first+1) on the QP's RQ, then moves
// the QP to INIT and on to ERR, which flushes both.
// destroyQPAndCQ destroys qp, then cq, and returns DESTROY_CQ's response (the event counts).
func (h *harness) destroyQPAndCQ(qp, cq uint32) []byte {
	d := make([]byte, 16)
	put64(d, 0, respAddr)
	put32(d, 8, qp)
	h.must(cmd(cmdDestroyQP, 1, d, nil))
	put32(d, 8, cq)
	return h.must(cmd(cmdDestroyCQ, 2, d, nil))
}

func (h *harness) flushTwoRecvs(qp uint32, qr []byte, first uint16) {
	rq := h.reg.live[u64(qr[32:], 16)]
	for i := range 2 {
		put64(rq[i*16:], 0, bufAddr)
		put16(rq[i*16:], 8, first+uint16(i))
		put32(rq[i*16:], 12, 1<<30|1<<31)
	}
	atomicStore(qpDB(h, qr, dbPageQPRQOffset), 2)
	mod := make([]byte, modifyQPReq)
	put32(mod, 64, qp)
	put32(mod, 68, 1|1<<4|1<<5|1<<6) // STATE | PKEY_INDEX | PORT | QKEY
	mod[96], mod[104] = 1, 1
	h.must(cmd(cmdModifyQP, 0, mod, nil))
	put32(mod, 68, 1)
	mod[96] = 6 // ERR
	h.must(cmd(cmdModifyQP, 0, mod, nil))
}
