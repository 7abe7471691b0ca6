package engine

import (
	"syscall"
	"testing"
	"unsafe"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/internal/wire"
)

// A C program's registered buffer may be unmapped or protected behind the device's back: every
// access to a foreign region probes it first, and what would fault fails as a bad key would.
func TestForeignRegionFaults(t *testing.T) {
	const page = 4096
	pages, err := syscall.Mmap(-1, 0, 3*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer munmap(pages)
	r := newAccessRig(t)
	mr, err := r.d.RegForeignMR(r.pd, pages, 0x100000, uapi.AccessLocalWrite|uapi.AccessRemoteWrite|uapi.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	// Page 0 read-write, page 1 read-only, page 2 inaccessible. Page 2 is PROT_NONE rather than
	// unmapped: a hole of one page is soon filled by the next small mmap of the Go runtime (the
	// race detector's or the heap's), and then the "gone" page reads fine. Both fault the same
	// way; cabi's TestUnmappedBuffer unmaps for real.
	if err := syscall.Mprotect(pages[page:2*page], syscall.PROT_READ); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mprotect(pages[2*page:], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	ah, err := r.d.CreateAH(r.pd, r.d.gid)
	if err != nil {
		t.Fatal(err)
	}
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	for _, c := range []struct {
		off, n int
		need   int
		ok     bool
	}{
		{0, page, 0, true},
		{0, page, uapi.AccessLocalWrite, true},
		{page, page, 0, true},
		{page, page, uapi.AccessLocalWrite, false},
		{page + 4000, 10, uapi.AccessLocalWrite, false},
		{2 * page, 1, 0, false},
		{100, 2 * page, 0, false}, // the end reaches the inaccessible page
		{4093, 5, uapi.AccessLocalWrite, false},
		{1, 3, uapi.AccessLocalWrite, true}, // an unaligned corner of a good page
	} {
		_, ok := r.d.localSpan(r.pd, mr.lkey, mr.iova+uint64(c.off), uint64(c.n), c.need)
		if ok != c.ok {
			t.Errorf("local [%d, +%d) need %#x: ok %v, want %v", c.off, c.n, c.need, ok, c.ok)
		}
		rneed := uapi.AccessRemoteRead
		if c.need != 0 {
			rneed = uapi.AccessRemoteWrite
		}
		if _, ok := r.d.remoteSpan(r.pd, mr.rkey, mr.iova+uint64(c.off), uint64(c.n), rneed); ok != c.ok {
			t.Errorf("remote [%d, +%d) need %#x: ok %v, want %v", c.off, c.n, rneed, ok, c.ok)
		}
	}
	// Copies after the probe (a segment built or placed later) are guarded too.
	if r.d.copyMem(mem.Own(pages[:64]), mem.Own(pages[2*page:2*page+64])) || r.d.copyMem(mem.Own(pages[page:page+64]), mem.Own(pages[:64])) {
		t.Error("a copy from an inaccessible page or into a read-only one reported success")
	}
	if !r.d.copyMem(mem.Own(pages[:64]), mem.Own(pages[page:page+64])) {
		t.Error("a copy from a read-only page into a writable one failed")
	}
	scratch := make([]byte, 0, 128)
	if _, ok := (*host)(r.d).Gather(scratch, []mem.Span{mem.Own(pages[page-32 : page]), mem.Own(pages[2*page : 2*page+64])}, 0, 96); ok {
		t.Error("a segment reaching into an inaccessible page was read")
	}
	if _, ok := (*host)(r.d).Gather(scratch, []mem.Span{mem.Own(pages[page-32 : page]), mem.Own(pages[page : page+64])}, 16, 64); !ok {
		t.Error("a segment over two readable pages could not be read")
	}
	// A SEND from the inaccessible page completes in error instead of crashing the process.
	for _, c := range []struct {
		off  int
		want efaio.Status
	}{{0, efaio.StatusOK}, {page, efaio.StatusOK}, {2 * page, efaio.StatusLocalInvalidLKey}} {
		w := efaio.TxDesc{Op: efaio.OpSend, Length: 1, AHN: ah.ahn, QKey: 9, DestQPN: uint16(r.q.qpn),
			SGL: [2]efaio.BufDesc{{Length: 64, LKey: mr.lkey, Addr: mr.iova + uint64(c.off)}}}
		var m message
		if st := r.d.prepare(r.q, &w, &m); st != c.want {
			t.Errorf("SEND from page %d: status %v, want %v", c.off/page, st, c.want)
		}
	}
}

// munmap unmaps part of a mapping (syscall.Munmap takes only whole mappings it made).
func munmap(b []byte) error {
	if _, _, e := syscall.Syscall(syscall.SYS_MUNMAP, uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)), 0); e != 0 {
		return e
	}
	return nil
}

// A read response keeps slices of the region it reads, to send them again after a loss; if the
// program deregisters the region and protects or unmaps it meanwhile, gathering them faults
// into a failure, not a crash, also once no foreign region is registered any more.
func TestGatherAfterForeignDereg(t *testing.T) {
	const page = 4096
	pages, err := syscall.Mmap(-1, 0, page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer munmap(pages)
	r := newAccessRig(t)
	mr, err := r.d.RegForeignMR(r.pd, pages, 0x100000, uapi.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	r.d.mu.Lock()
	src, ok := r.d.remoteSpan(r.pd, mr.rkey, mr.iova, page, uapi.AccessRemoteRead)
	r.d.mu.Unlock()
	if !ok {
		t.Fatal("the region does not read")
	}
	if err := r.d.DeregMR(mr); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mprotect(pages, syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	if _, ok := (*host)(r.d).Gather(nil, []mem.Span{src}, 0, 16); ok {
		t.Error("a gather from a protected page succeeded")
	}
}

// The region an RDMA read's data comes from stays named to the transport (Host.Read, Host.Live):
// live while registered, not once deregistered, so that read data sent again after a dereg does
// not read memory the application has reused.
func TestReadRegionLiveUntilDereg(t *testing.T) {
	r := newAccessRig(t)
	h := (*host)(r.d)
	f := wire.Data{Op: wire.OpReadReq, DstQPN: uint16(r.q.qpn), QKey: 9, Length: 64, RKey: r.a.rkey, RAddr: r.a.iova}
	r.d.mu.Lock()
	b, region, st := h.Read([16]byte{1}, &f)
	live := h.Live(region)
	r.d.mu.Unlock()
	if st != efaio.StatusOK || b.Len() != 64 || !live {
		t.Fatalf("read: %d bytes, status %d, live %v; want 64, OK, live", b.Len(), st, live)
	}
	if err := r.d.DeregMR(r.a); err != nil {
		t.Fatal(err)
	}
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	if h.Live(region) {
		t.Error("the region is live after its dereg")
	}
}
