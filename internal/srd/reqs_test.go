package srd

import (
	"math/rand/v2"
	"testing"

	"github.com/softefa/softefa/internal/wire"
)

// The request table against a map, under the traffic a stream gives it: ids handed out in
// order from near the top of uint32 (they wrap), most requests finishing soon and nearly in
// order, a few staying outstanding while the ids go round the table many times (their home
// slots collide with newer ones), lookups of ids present, gone and never given.
func TestReqTableMatchesMap(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		var tab reqTable
		model := map[uint32]*Msg{}
		var live, long []uint32 // finishing soon; outstanding for long
		peak := 0
		next := uint32(1<<32 - 5000)
		take := func(list *[]uint32, i int) {
			id := (*list)[i]
			*list = append((*list)[:i], (*list)[i+1:]...)
			tab.remove(id)
			delete(model, id)
		}
		for step := range 200000 {
			switch r := rng.IntN(1000); {
			case r < 400 || len(live) == 0:
				m := &Msg{hdr: wire.Data{MsgID: next}}
				tab.put(m)
				model[next] = m
				if rng.IntN(100) == 0 {
					long = append(long, next)
				} else {
					live = append(live, next)
				}
				next++
			case r < 800:
				take(&live, rng.IntN(min(len(live), 4)))
			case r < 803 && len(long) > 0:
				take(&long, rng.IntN(len(long)))
			default:
				id := next - uint32(rng.IntN(3000))
				switch rng.IntN(8) {
				case 0:
					id = next + uint32(rng.IntN(100)) // never given
				case 1:
					if len(long) > 0 {
						id = long[rng.IntN(len(long))]
					}
				}
				if got, want := tab.get(id), model[id]; got != want {
					t.Fatalf("seed %d step %d: get(%d) = %p, want %p", seed, step, id, got, want)
				}
				tab.remove(next + 1) // absent: changes nothing
			}
			peak = max(peak, len(model))
			if tab.len() != len(model) {
				t.Fatalf("seed %d step %d: %d requests, want %d", seed, step, tab.len(), len(model))
			}
		}
		for id, m := range model {
			if tab.get(id) != m {
				t.Fatalf("seed %d: request %d lost", seed, id)
			}
		}
		if all := tab.all(nil); len(all) != len(model) {
			t.Fatalf("seed %d: all lists %d, want %d", seed, len(all), len(model))
		}
		if len(tab.slots) > 4*max(peak, reqsStart) {
			t.Fatalf("seed %d: %d slots for at most %d requests at once", seed, len(tab.slots), peak)
		}
	}
}

// Puts, gets and removals in order do not allocate once the table has its size.
func TestReqTableDoesNotAllocate(t *testing.T) {
	var tab reqTable
	msgs := make([]*Msg, 64)
	for i := range msgs {
		msgs[i] = &Msg{}
	}
	id := uint32(0)
	run := func() {
		for _, m := range msgs {
			m.hdr.MsgID = id
			id++
			tab.put(m)
		}
		for _, m := range msgs {
			if tab.get(m.hdr.MsgID) != m {
				t.Fatal("lost")
			}
			tab.remove(m.hdr.MsgID)
		}
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Fatalf("%v allocations a run, want 0", n)
	}
}

// Requests whose ids share a slot (ids a table's size apart: one outstanding while the ids went
// round the table) are all found, before and after any of them is taken out.
func TestReqTableCollisions(t *testing.T) {
	for _, ids := range [][]uint32{{0, 16, 32}, {15, 31, 47}, {14, 30, 15, 46}} {
		for drop := range ids {
			var tab reqTable
			ms := map[uint32]*Msg{}
			for _, id := range ids {
				m := &Msg{hdr: wire.Data{MsgID: id}}
				tab.put(m)
				ms[id] = m
			}
			if len(tab.slots) != reqsStart {
				t.Fatalf("%d slots, want %d", len(tab.slots), reqsStart)
			}
			tab.remove(ids[drop])
			for _, id := range ids {
				want := ms[id]
				if id == ids[drop] {
					want = nil
				}
				if got := tab.get(id); got != want {
					t.Errorf("ids %v without %d: get(%d) = %p, want %p", ids, ids[drop], id, got, want)
				}
			}
		}
	}
}
