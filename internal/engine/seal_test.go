package engine

import "testing"

// The replay window takes each counter once, in any order within replayWindow of the highest,
// and nothing older; a new salt starts afresh, an earlier one is a replay.
func TestReplayWindow(t *testing.T) {
	var r replayState
	want := func(salt uint32, ctr uint64, fresh bool) {
		t.Helper()
		if got := r.fresh(salt, ctr); got != fresh {
			t.Fatalf("salt %d counter %d: fresh %v, want %v", salt, ctr, got, fresh)
		}
	}
	want(7, 1, true)
	want(7, 1, false)
	want(7, 5000, true) // far ahead: the window moves, nothing in it seen but 5000
	want(7, 4999, true)
	want(7, 4999, false)
	want(7, 5000-replayWindow+1, true) // the oldest counter the window holds
	want(7, 5000-replayWindow, false)  // one older
	want(7, 5000-replayWindow+1, false)
	// A batch held back while the other receiver took 900 newer datagrams.
	for c := uint64(5001); c <= 5900; c++ {
		want(7, c, true)
	}
	for c := uint64(4990); c < 4999; c++ {
		want(7, c, true)
	}
	want(7, 4990, false)
	// Moving by less than the window forgets the counters it passes, not the ones it keeps.
	want(7, 5900+replayWindow-1, true)
	want(7, 5900, false) // kept: seen
	want(7, 5899, false) // passed: older than the window
	want(7, 6000, true)  // passed over, never seen
	want(8, 3, true)     // a new salt (the peer restarted)
	want(8, 3, false)
	want(7, 7000, false) // the old salt again: a replay
}
