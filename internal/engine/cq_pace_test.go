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

// TestCQArmOverwritten: a consumer that stores the CQ doorbell itself arms with one store and
// reports its next poll with another, without the arm bit, before the engine has read the first
// (libfabric 2.x's efa fabric does so in fi_cq_sread). After the first event, a doorbell whose
// cmd_sn has moved past the last event's is armed even with the bit clear; before it, and while
// cmd_sn stays, only the bit arms.
func TestCQArmOverwritten(t *testing.T) {
	d := newAccessRig(t).d
	events := 0
	var db uint32
	cq, err := d.CreateCQ(CQInit{Entries: 8, Unpaced: true, Doorbell: &db, Notify: func() { events++ }})
	if err != nil {
		t.Fatal(err)
	}
	post := func(n int) {
		d.mu.Lock()
		defer d.mu.Unlock()
		for range n {
			cq.post(&efaio.Completion{})
		}
	}
	store := func(polled uint16, sn uint8, arm bool) { atomic.StoreUint32(&db, efaio.CQDoorbell(polled, sn, arm)) }
	want := func(what string, n int) {
		t.Helper()
		if events != n {
			t.Fatalf("%s: %d events, want %d", what, events, n)
		}
	}

	store(0, 0, false) // a consumer that polls and never arms
	post(2)
	want("never armed", 0)
	store(2, 0, true) // arms (cmd_sn 0)
	post(1)
	want("armed", 1)
	post(1)
	want("the arm is spent", 1)
	store(4, 1, true)  // took the event (cmd_sn 1) and armed again…
	store(4, 1, false) // …then polled: the arm bit is gone before the engine read it
	post(1)
	want("arm overwritten by the next poll's store", 2)
	post(1)
	want("spent again", 2)
	store(6, 1, false) // polls on, cmd_sn unchanged: no arm
	post(1)
	want("cmd_sn unchanged", 2)
}
