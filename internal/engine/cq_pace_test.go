package engine

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/softefa/softefa/config"
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

// TestCQArmSeenLate: a consumer's arm, a plain store, may become visible to the engine only after
// the engine wrote an entry and read the doorbell without it, while the consumer's own poll,
// made after the arm, found the ring empty (a load may pass an earlier store on x86): it then
// waits for an event (libfabric 2.6's fi_cq_sread hung so). The loop's next tick reads the
// doorbell of such a CQ again and raises the event; a tick after that raises none, and a CQ whose
// consumer polled everything stays armed for its next entry.
func TestCQArmSeenLate(t *testing.T) {
	// Driven: no engine loop of its own ticks beside the test's.
	d := newAccessRigOn(t, config.Device{Addr: netip.MustParseAddrPort("127.0.0.1:1"), Driven: true}).d
	events := 0
	var db uint32
	cq, err := d.CreateCQ(CQInit{Entries: 8, Unpaced: true, Doorbell: &db, Notify: func() { events++ }})
	if err != nil {
		t.Fatal(err)
	}
	locked := func(f func()) {
		d.mu.Lock()
		defer d.mu.Unlock()
		f()
	}
	post := func() { locked(func() { cq.post(&efaio.Completion{}) }) }
	tick := func() { d.Drive() }
	store := func(polled uint16, sn uint8, arm bool) { atomic.StoreUint32(&db, efaio.CQDoorbell(polled, sn, arm)) }
	want := func(what string, n int) {
		t.Helper()
		if events != n {
			t.Fatalf("%s: %d events, want %d", what, events, n)
		}
	}

	post()            // written while the consumer's arm is not yet visible…
	store(0, 0, true) // …the arm, with the entry not polled
	want("before the tick", 0)
	tick()
	want("the tick after the entry", 1)
	tick()
	want("a second tick", 1)

	// An entry written within a tick (from the network, say) is read again by the next tick,
	// not by its own: the consumer's arm may still be on its way.
	store(1, 0, false) // polled the entry, before taking its event
	d.ticks.Add(1)
	post()            // an entry of this tick, not armed…
	store(1, 1, true) // …and the consumer takes the event and arms
	locked(func() { d.recheckArms() })
	want("the same tick", 1)
	tick()
	want("the next tick", 2)

	store(2, 2, false) // took the event and polled the entry
	post()             // armed by cmd_sn (docs/cabi.md, "Events")
	want("the next entry", 3)

	store(3, 2, false) // polled it, before taking its event
	post()             // not armed: on the list for the next tick…
	store(4, 3, true)  // …and the consumer took the event, polled this entry, armed: nothing to tell
	tick()
	want("armed with every entry polled", 3)
	post()
	want("the entry after that", 4)

	// A CQ listed in an earlier tick that gets another entry in this one waits for the next.
	store(5, 3, false) // polled it, before taking its event
	post()             // listed, not armed
	d.ticks.Add(1)
	post()            // another entry, in the new tick
	store(5, 4, true) // the consumer takes the event and arms, two entries behind
	locked(func() { d.recheckArms() })
	want("the tick of the latest entry", 4)
	tick()
	want("the tick after it", 5)
}
