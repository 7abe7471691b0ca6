package srd

import (
	"math"
	"testing"

	"github.com/softefa/softefa/internal/wire"
)

// A receive stream across the PSN wrap: its window takes PSNs in any order, once each, and its
// cumulative point passes 2^32 - 1 to 0.
func TestWindowAcrossWrap(t *testing.T) {
	r := rxStream{seen: make(window, rxWindow/64)}
	r.cum = math.MaxUint32 - 100
	start := r.cum
	arrive := func(psn wire.PSN) bool {
		if psn.Less(r.cum) || psn-r.cum >= rxWindow || r.seen.has(psn) {
			return false
		}
		r.seen.flip(psn)
		for r.seen.has(r.cum) {
			r.seen.flip(r.cum)
			r.cum++
		}
		return true
	}
	// Odd offsets first, then even ones: every PSN is new once and a duplicate after.
	for _, parity := range []wire.PSN{1, 0} {
		for off := parity; off < 300; off += 2 {
			if !arrive(start + off) {
				t.Fatalf("PSN %d refused the first time", start+off)
			}
			if arrive(start + off) {
				t.Fatalf("PSN %d taken twice", start+off)
			}
		}
	}
	if r.cum != start+300 || r.cum != 199 {
		t.Fatalf("cumulative point %d, want %d", r.cum, start+300)
	}
	for i, w := range r.seen {
		if w != 0 {
			t.Fatalf("word %d of the window still has bits %#x: the next lap would read them as arrived", i, w)
		}
	}
	if arrive(r.cum + rxWindow) {
		t.Fatal("a PSN a whole window ahead was taken")
	}
}
