package engine

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/mem/memtest"
	"github.com/softefa/softefa/internal/uapi"
)

// A device serving the programs of a host reaches their registered memory in their processes
// (RegProcessMR): RDMA writes land in it, reads and SENDs take their bytes from it, receives place
// into it. Memory the program unmaps, protects or takes with it when it exits fails the work
// requests that name it, never the device. Two driven devices over UDP on loopback; the region is
// a child process's buffer.

// wrRig is an access rig with counters of the WRs posted and completions taken.
type wrRig struct {
	*accessRig
	tx, rx, cqes uint16
}

// post writes w into the next SQ slot and stores the doorbell.
func (r *wrRig) post(w efaio.TxDesc) {
	w.Phase, w.CompReq = r.q.sq.phase, true
	if r.tx > 0 && r.tx%uint16(r.q.sq.cnt) == 0 {
		panic("the rig does not wrap its SQ")
	}
	r.q.sq.slot(r.tx).Encode(&w)
	r.tx++
	atomic.StoreUint32(r.q.sq.db, uint32(r.tx))
}

// postRecv posts a receive WR of one buffer.
func (r *wrRig) postRecv(id uint16, lkey uint32, addr uint64, n uint16) {
	off := int(r.rx) * efaio.RxDescSize
	efaio.RxDesc(r.q.rq.ring[off : off+efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: addr, ReqID: id,
		Length: n, LKey: lkey, First: true, Last: true})
	r.rx++
	atomic.StoreUint32(r.q.rq.db, uint32(r.rx))
}

// next drives both devices until r's CQ holds another completion, and returns it.
func (r *wrRig) next(t *testing.T, other *wrRig, now *time.Duration) efaio.Completion {
	t.Helper()
	deadline := time.Now().Add(time.Minute) // (a lost datagram would need timers: the test would spin)
	cq := r.q.sendCQ
	for cq.Written() <= uint32(r.cqes) {
		if time.Now().After(deadline) {
			t.Fatal("no completion after a minute")
		}
		*now += 10 * time.Microsecond
		r.d.Drive()
		other.d.Drive()
	}
	e := efaio.CQE(cq.ring[int(r.cqes)*cq.esz : int(r.cqes+1)*cq.esz])
	r.cqes++
	var c efaio.Completion
	if err := e.Decode(binary.LittleEndian.Uint32(e), &c); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestProcessMemory(t *testing.T) {
	now := time.Second
	clock := func() time.Duration { return now }
	a, b := &wrRig{accessRig: drivenRig(t, clock)}, &wrRig{accessRig: drivenRig(t, clock)}
	ab, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	ba, err := b.d.CreateAH(b.pd, a.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	child := memtest.Start(t)
	p, err := mem.Open(child.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	const page, iova = memtest.PageSize, 0x4000000
	all := uapi.AccessLocalWrite | uapi.AccessRemoteWrite | uapi.AccessRemoteRead
	mr, err := b.d.RegProcessMR(b.pd, p, child.Base, memtest.Pages*page, iova, all)
	if err != nil {
		t.Fatal(err)
	}
	expect := func(c efaio.Completion, id uint16, st efaio.Status) {
		t.Helper()
		if c.ReqID != id || c.Status != st {
			t.Fatalf("WR %d completed with status %v, want WR %d with %v", c.ReqID, c.Status, id, st)
		}
	}
	remote := func(off, n int) efaio.RemoteMem {
		return efaio.RemoteMem{RKey: mr.RKey(), Addr: iova + uint64(off), Length: uint32(n)}
	}
	local := func(r *wrRig, n int) [efaio.TxNumBufs]efaio.BufDesc {
		return [efaio.TxNumBufs]efaio.BufDesc{{Length: uint32(n), LKey: r.a.lkey, Addr: r.a.iova}}
	}

	// An RDMA write lands in the child's memory, across a page boundary.
	msg := []byte("written into another process's memory")
	copy(a.inA, msg)
	a.post(efaio.TxDesc{Op: efaio.OpRDMAWrite, ReqID: 1, Length: 1, AHN: ab.ahn, QKey: 9, DestQPN: uint16(b.q.qpn),
		SGL: local(a, len(msg)), Remote: remote(page-10, len(msg))})
	expect(a.next(t, b, &now), 1, efaio.StatusOK)
	if got := child.Dump(t, page-10, len(msg)); !bytes.Equal(got, msg) {
		t.Fatalf("the child holds %q, want %q", got, msg)
	}

	// An RDMA read takes its data from it.
	a.post(efaio.TxDesc{Op: efaio.OpRDMARead, ReqID: 2, Length: 1, AHN: ab.ahn, QKey: 9, DestQPN: uint16(b.q.qpn),
		SGL: local(a, 3000), Remote: remote(3*page+5, 3000)})
	expect(a.next(t, b, &now), 2, efaio.StatusOK)
	if !bytes.Equal(a.inA[:3000], memtest.Pattern(3*page+5, 3000)) {
		t.Fatal("the read brought other bytes than the child's")
	}

	// A SEND from it, and one into a receive buffer in it.
	a.postRecv(3, a.a.lkey, a.a.iova, 64)
	b.post(efaio.TxDesc{Op: efaio.OpSend, ReqID: 4, Length: 1, AHN: ba.ahn, QKey: 9, DestQPN: uint16(a.q.qpn),
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: 64, LKey: mr.LKey(), Addr: iova + 6*page}}})
	expect(b.next(t, a, &now), 4, efaio.StatusOK)
	expect(a.next(t, b, &now), 3, efaio.StatusOK)
	if !bytes.Equal(a.inA[:64], memtest.Pattern(6*page, 64)) {
		t.Fatal("the SEND carried other bytes than the child's")
	}
	b.postRecv(5, mr.LKey(), iova+7*page, 64)
	copy(a.inA, "a SEND placed in another process")
	a.post(efaio.TxDesc{Op: efaio.OpSend, ReqID: 6, Length: 1, AHN: ab.ahn, QKey: 9, DestQPN: uint16(b.q.qpn),
		SGL: local(a, 32)})
	expect(a.next(t, b, &now), 6, efaio.StatusOK)
	expect(b.next(t, a, &now), 5, efaio.StatusOK)
	if got := child.Dump(t, 7*page, 32); string(got) != "a SEND placed in another process" {
		t.Fatalf("the receive buffer holds %q", got)
	}

	// On one device: a WRITE from the child's memory into b's own region, a READ back into it.
	b.post(efaio.TxDesc{Op: efaio.OpRDMAWrite, ReqID: 7, Length: 1, AHN: mustAH(t, b, b.d.GID()), QKey: 9,
		DestQPN: uint16(b.q.qpn), SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: 100, LKey: mr.LKey(), Addr: iova + 9*page}},
		Remote: efaio.RemoteMem{RKey: b.a.rkey, Addr: b.a.iova, Length: 100}})
	expect(b.next(t, a, &now), 7, efaio.StatusOK)
	if !bytes.Equal(b.inA[:100], memtest.Pattern(9*page, 100)) {
		t.Fatal("a same-device WRITE from the child's memory placed other bytes")
	}

	// Memory the program unmaps or protects fails the WRs that reach it, at the requester
	// (a SEND's source) and at the responder (a WRITE's target).
	child.Unmap(t, 12)
	child.Protect(t, 13)
	b.post(efaio.TxDesc{Op: efaio.OpSend, ReqID: 8, Length: 1, AHN: ba.ahn, QKey: 9, DestQPN: uint16(a.q.qpn),
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: 64, LKey: mr.LKey(), Addr: iova + 12*page}}})
	a.postRecv(9, a.a.lkey, a.a.iova, 64)
	if c := b.next(t, a, &now); c.ReqID != 8 || c.Status == efaio.StatusOK {
		t.Fatalf("a SEND from an unmapped page: WR %d, status %v", c.ReqID, c.Status)
	}
	for i, off := range []int{12 * page, 13 * page} {
		id := uint16(10 + i)
		a.post(efaio.TxDesc{Op: efaio.OpRDMAWrite, ReqID: id, Length: 1, AHN: ab.ahn, QKey: 9, DestQPN: uint16(b.q.qpn),
			SGL: local(a, 64), Remote: remote(off, 64)})
		expect(a.next(t, b, &now), id, efaio.StatusRemoteBadAddress)
	}
	if got := child.Dump(t, 13*page, 64); !bytes.Equal(got, memtest.Pattern(13*page, 64)) {
		t.Fatal("a write changed a read-only page")
	}

	// Once the program has exited, nothing reaches its memory; the device goes on serving others.
	child.Exit(t)
	<-p.Exited()
	a.post(efaio.TxDesc{Op: efaio.OpRDMARead, ReqID: 12, Length: 1, AHN: ab.ahn, QKey: 9, DestQPN: uint16(b.q.qpn),
		SGL: local(a, 64), Remote: remote(0, 64)})
	if c := a.next(t, b, &now); c.ReqID != 12 || c.Status == efaio.StatusOK {
		t.Fatalf("a read of an exited program's memory: WR %d, status %v", c.ReqID, c.Status)
	}
	copy(a.inA, "still serving")
	a.post(efaio.TxDesc{Op: efaio.OpRDMAWrite, ReqID: 13, Length: 1, AHN: ab.ahn, QKey: 9, DestQPN: uint16(b.q.qpn),
		SGL: local(a, 13), Remote: efaio.RemoteMem{RKey: b.a.rkey, Addr: b.a.iova + 200, Length: 13}})
	expect(a.next(t, b, &now), 13, efaio.StatusOK)
	if string(b.inA[200:213]) != "still serving" {
		t.Fatal("the device stopped serving its own regions")
	}
}

// mustAH makes an AH of r's PD for gid.
func mustAH(t *testing.T, r *wrRig, gid [16]byte) uint16 {
	t.Helper()
	ah, err := r.d.CreateAH(r.pd, gid)
	if err != nil {
		t.Fatal(err)
	}
	return ah.ahn
}

// A region is checked when it is registered, as the kernel pins one: every page must be there.
func TestRegProcessMRChecksPages(t *testing.T) {
	r := newAccessRig(t)
	child := memtest.Start(t)
	p, err := mem.Open(child.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	child.Unmap(t, 3)
	const page = memtest.PageSize
	if _, err := r.d.RegProcessMR(r.pd, p, child.Base, 4*page, 0x1000, uapi.AccessLocalWrite); !errors.Is(err, syscall.EFAULT) {
		t.Fatalf("a region over an unmapped page: %v, want EFAULT", err)
	}
	mr, err := r.d.RegProcessMR(r.pd, p, child.Base, 3*page, 0x1000, uapi.AccessLocalWrite)
	if err != nil {
		t.Fatalf("the pages before it: %v", err)
	}
	if mr.Len() != 3*page {
		t.Fatalf("Len %d", mr.Len())
	}
	child.Protect(t, 10)
	if _, err := r.d.RegProcessMR(r.pd, p, child.Base+10*page, page, 0x1000, uapi.AccessLocalWrite); !errors.Is(err, syscall.EFAULT) {
		t.Fatalf("a writable region over a read-only page: %v, want EFAULT", err)
	}
	if _, err := r.d.RegProcessMR(r.pd, p, child.Base+10*page, page, 0x1000, 0); err != nil {
		t.Fatalf("a read-only region over a read-only page: %v", err)
	}
	if _, err := r.d.RegProcessMR(r.pd, p, child.Base, 0, 0x1000, uapi.AccessLocalWrite); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("an empty region: %v, want EINVAL", err)
	}
	child.Exit(t)
	<-p.Exited()
	if _, err := r.d.RegProcessMR(r.pd, p, child.Base, page, 0x1000, uapi.AccessLocalWrite); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("a region of an exited process: %v, want ESRCH", err)
	}
}
