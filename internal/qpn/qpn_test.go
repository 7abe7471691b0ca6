package qpn

import (
	"errors"
	"syscall"
	"testing"
)

func TestNeverZeroOneOrReserved(t *testing.T) {
	tab, err := New(256, 100, 131)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]bool{}
	for {
		q, _, err := tab.Alloc()
		if errors.Is(err, syscall.ENOMEM) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if q < 2 || q >= 256 || (q >= 100 && q <= 131) {
			t.Fatalf("handed out %d", q)
		}
		if seen[q] {
			t.Fatalf("handed out %d twice", q)
		}
		seen[q] = true
	}
	if want := 256 - 2 - 32; len(seen) != want {
		t.Fatalf("handed out %d numbers, want %d", len(seen), want)
	}
}

func TestSixteenBitLimit(t *testing.T) {
	if _, err := New(Limit+1, 1, 0); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("size over 65536: err %v, want EINVAL", err)
	}
	tab, err := New(Limit, 0x8000, 0x80ff)
	if err != nil {
		t.Fatal(err)
	}
	for {
		q, _, err := tab.Alloc()
		if err != nil {
			break
		}
		if q > 0xffff {
			t.Fatalf("QPN %#x does not fit 16 bits", q)
		}
	}
}

func TestNoImmediateReuse(t *testing.T) {
	tab, err := New(64, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := tab.Alloc()
	tab.Free(a)
	b, _, _ := tab.Alloc()
	if a == b {
		t.Fatalf("freed QPN %d handed out again at once", a)
	}
	// a comes back only after the walk wraps past every other free number.
	var got []uint32
	for range 62 - 1 {
		q, _, err := tab.Alloc()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, q)
	}
	if got[len(got)-1] != a {
		t.Fatalf("last number handed out is %d, want the freed %d", got[len(got)-1], a)
	}
}

func TestGenerationBumps(t *testing.T) {
	tab, err := New(4, 1, 0) // numbers 2 and 3 only
	if err != nil {
		t.Fatal(err)
	}
	q1, g1, _ := tab.Alloc()
	tab.Free(q1)
	q2, _, _ := tab.Alloc()
	tab.Free(q2)
	q3, g3, _ := tab.Alloc()
	if q3 != q1 {
		t.Fatalf("wrap gave %d, want %d", q3, q1)
	}
	if g3 != g1+1 || tab.Gen(q3) != g3 {
		t.Fatalf("generation %d after reuse, first %d", g3, g1)
	}
}

func TestBadReservedRange(t *testing.T) {
	if _, err := New(64, 10, 70); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("range past the table: %v", err)
	}
	if _, err := New(4, 2, 3); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("range covering everything: %v", err)
	}
}

func TestFreeIgnoresReservedAndUnused(t *testing.T) {
	tab, _ := New(16, 8, 9)
	tab.Free(8)
	tab.Free(0)
	tab.Free(5)
	for {
		q, _, err := tab.Alloc()
		if err != nil {
			break
		}
		if q == 8 || q == 9 || q < 2 {
			t.Fatalf("handed out %d", q)
		}
	}
}
