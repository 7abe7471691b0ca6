package seal

import (
	"net/netip"
	"testing"

	"github.com/softefa/softefa/config"
)

// The replay window takes each counter once, in any order within Window of the highest,
// and nothing older; a new salt starts afresh, an earlier one is a replay.
func TestReplayWindow(t *testing.T) {
	var r Replay
	if !r.OtherRun(7) {
		t.Fatal("a window that knows no run takes a salt as its current run's")
	}
	want := func(salt uint32, ctr uint64, fresh bool) {
		t.Helper()
		if got := r.Fresh(salt, ctr); got != fresh {
			t.Fatalf("salt %d counter %d: fresh %v, want %v", salt, ctr, got, fresh)
		}
	}
	want(7, 1, true)
	want(7, 1, false)
	want(7, 5000, true) // far ahead: the window moves, nothing in it seen but 5000
	want(7, 4999, true)
	want(7, 4999, false)
	want(7, 5000-Window+1, true) // the oldest counter the window holds
	want(7, 5000-Window, false)  // one older
	want(7, 5000-Window+1, false)
	// A batch held back while the other receiver took 900 newer datagrams.
	for c := uint64(5001); c <= 5900; c++ {
		want(7, c, true)
	}
	for c := uint64(4990); c < 4999; c++ {
		want(7, c, true)
	}
	want(7, 4990, false)
	// Moving by less than the window forgets the counters it passes, not the ones it keeps.
	want(7, 5900+Window-1, true)
	want(7, 5900, false) // kept: seen
	want(7, 5899, false) // passed: older than the window
	want(7, 6000, true)  // passed over, never seen
	want(8, 3, true)     // a new salt (the peer restarted)
	want(8, 3, false)
	want(8, 2, false) // sent before the first datagram taken of the run: not told from a replay
	want(8, 4, true)
	want(7, 7000, false) // the old salt again: a replay
}

// A sealed datagram authenticates only from the address that sealed it and at the device it was
// sealed for: replayed from another IP, or to another device with the key, it fails.
func TestSealBindsAddresses(t *testing.T) {
	key := make([]byte, 32)
	s, err := New(key, zeroReader{})
	if err != nil {
		t.Fatal(err)
	}
	var aad [AADSize]byte
	from := netip.MustParseAddr("127.0.0.1").As16()
	other := netip.MustParseAddr("127.0.0.2").As16()
	to := config.GIDFromAddr(netip.MustParseAddrPort("127.0.0.1:4791"))
	elsewhere := config.GIDFromAddr(netip.MustParseAddrPort("127.0.0.1:4792"))
	sealed := s.Seal(nil, []byte("a datagram"), &aad, &from, &to)
	for _, c := range []struct {
		name     string
		from, to *[16]byte
		ok       bool
	}{{"as sent", &from, &to, true}, {"from another IP", &other, &to, false}, {"to another device", &from, &elsewhere, false}} {
		plain, _, _, ok := s.Open(nil, sealed, &aad, c.from, c.to)
		if ok != c.ok || ok && string(plain) != "a datagram" {
			t.Errorf("%s: opened %v (%q), want %v", c.name, ok, plain, c.ok)
		}
	}
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// A Sealer's salt is never 0 (a Replay's "none known") and its counter starts below 2^62, so
// that it never wraps, whatever the random source gives.
func TestSealerStartsSafe(t *testing.T) {
	key := make([]byte, 32)
	for _, fill := range []byte{0x00, 0xff} {
		s, err := New(key, constReader(fill))
		if err != nil {
			t.Fatal(err)
		}
		if s.salt == 0 || s.ctr.Load() >= 1<<62 {
			t.Errorf("random bytes %#x: salt %#x, first counter %#x", fill, s.salt, s.ctr.Load())
		}
	}
}

type constReader byte

func (c constReader) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte(c)
	}
	return len(b), nil
}
