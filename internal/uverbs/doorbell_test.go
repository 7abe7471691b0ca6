//go:build linux

package uverbs

import (
	"testing"

	"github.com/softefa/softefa/internal/uapi"
)

// watching reports whether the watcher scans the QP with handle h.
func (h *harness) watching(qh uint32) bool {
	o := h.f.objs[qh].(*qpObj)
	w := h.d.dbs
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, x := range w.qps {
		if x.q == o.qp {
			return true
		}
	}
	return false
}

// TestTrapDoorbells: the shim learns which mmap key is a QP's doorbell page, and once every
// mapping libefa makes of it (the SQ's, and the RQ's if the QP has an RQ) traps stores, the
// watcher stops scanning the QP; with no QP left to scan it blocks (no wake-ups while the program
// is idle). A mapping that does not trap puts the QP back under the watcher for good.
func TestTrapDoorbells(t *testing.T) {
	h := newHarness(t)
	h.getContext()
	pd := h.allocPD()
	cq, cr := h.createCQ(64, 32, 0)
	qp, r := h.createQP(pd, cq, uapi.QPTypeDriver, 16*64, 16*16)
	drv := r[32:]
	dbKey, sqKey, cqDB := u64(drv, 32), u64(drv, 48), u64(cr[8:], 32)
	if got, ok := h.f.DoorbellPage(dbKey); !ok || got != qp {
		t.Fatalf("DoorbellPage(doorbell key %#x) = %d, %v; want QP %d", dbKey, got, ok, qp)
	}
	for _, k := range []uint64{sqKey, cqDB, 1 << 40} {
		if got, ok := h.f.DoorbellPage(k); ok {
			t.Errorf("DoorbellPage(%#x) = %d: not a QP's doorbell page", k, got)
		}
	}
	if !h.watching(qp) {
		t.Fatal("a new QP is not watched")
	}
	h.f.TrapDoorbells(qp, true) // the SQ's mapping
	if !h.watching(qp) {
		// The RQ's mapping may have been made where the shim cannot see it (libfabric's memory
		// hooks make the mmap system call themselves): its stores would go unnoticed.
		t.Fatal("the watcher left a QP with one of its two doorbell mappings unreported")
	}
	h.f.TrapDoorbells(qp, true) // the RQ's
	if h.watching(qp) || h.d.dbs.n.Load() != 0 {
		t.Fatal("the watcher still scans a QP whose doorbells trap")
	}
	h.f.TrapDoorbells(qp, false) // a third mapping, not trapped
	h.f.TrapDoorbells(qp, true)
	if !h.watching(qp) || h.d.dbs.n.Load() != 1 {
		t.Fatal("a QP with an untrapped doorbell mapping is not watched (once)")
	}
	h.f.TrapDoorbells(12345, true) // unknown handle: ignored
	d := make([]byte, 16)
	put64(d, 0, respAddr)
	put32(d, 8, qp)
	h.must(cmd(cmdDestroyQP, 1, d, nil))
	if h.d.dbs.n.Load() != 0 {
		t.Fatal("a destroyed QP is still watched")
	}
	// A QP without an RQ: libefa maps its doorbell page once, for the SQ.
	sqOnly, _ := h.createQP(pd, cq, uapi.QPTypeDriver, 16*64, 0)
	h.f.TrapDoorbells(sqOnly, true)
	if h.watching(sqOnly) {
		t.Fatal("the watcher still scans a QP without an RQ whose one doorbell mapping traps")
	}
}
