package engine

import (
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/softefa/softefa/efaio"
)

// TestCQPacing: a paced CQ (the Go provider's) drops the entry that would overwrite one the
// doorbell's consumer count has not passed, marks itself overrun and counts it; an unpaced CQ
// (uverbs', for libefa) writes every entry, as EFA hardware does, with the doorbell left at 0 as
// libefa 44's extended polling leaves it: entry n lands in slot n mod depth with the lap's phase.
func TestCQPacing(t *testing.T) {
	d := newAccessRig(t).d
	for _, unpaced := range []bool{false, true} {
		cq, err := d.CreateCQ(CQInit{Entries: 8, Unpaced: unpaced})
		if err != nil {
			t.Fatal(err)
		}
		before := d.counts.CQOverruns.Load()
		d.mu.Lock()
		for i := range 8*5 + 3 {
			cq.post(&efaio.Completion{ReqID: uint16(i)})
		}
		d.mu.Unlock()
		lost := d.counts.CQOverruns.Load() - before
		if !unpaced {
			if !cq.Overrun() || lost != 8*4+3 {
				t.Errorf("paced: overrun %v, %d entries lost; want true, %d", cq.Overrun(), lost, 8*4+3)
			}
			continue
		}
		if cq.Overrun() || lost != 0 {
			t.Fatalf("unpaced: overrun %v, %d entries lost", cq.Overrun(), lost)
		}
		for slot := range 8 {
			n := 8*5 + slot // the last lap written into this slot
			if slot >= 3 {
				n -= 8
			}
			e := efaio.CQE(cq.ring[slot*cq.esz:][:cq.esz])
			w := atomic.LoadUint32((*uint32)(unsafe.Pointer(&e[0])))
			if want := uint8(1 ^ (n/8)&1); uint16(w) != uint16(n) || efaio.PhaseOf(w) != want {
				t.Errorf("slot %d: req_id %d phase %d, want %d phase %d", slot, uint16(w), efaio.PhaseOf(w), n, want)
			}
		}
	}
}
