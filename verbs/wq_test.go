package verbs

import "testing"

// A request id that is not out — never taken, or completed already — is refused without
// touching the pool: a forged or repeated completion cannot unbalance it.
func TestWQPutRefusesIndexNotOut(t *testing.T) {
	var w wq
	w.init(8, 3)
	if w.put(5) {
		t.Fatal("put of an index never taken was accepted")
	}
	i := w.get()
	if !w.put(i) || w.put(i) {
		t.Fatal("an index taken once must be put back exactly once")
	}
	if w.used != 0 || w.completed.Load() != 1 {
		t.Fatalf("used %d completed %d, want 0 and 1", w.used, w.completed.Load())
	}
	for range 8 { // the whole pool is still there
		w.get()
	}
	if w.used != 8 {
		t.Fatalf("used %d after taking the whole pool", w.used)
	}
}
