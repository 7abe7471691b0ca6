package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The peak meter finds the same best window as perftest's rule applied to the whole run (the
// window's messages over the time from its first one's post to its last one's completion), which
// it no longer keeps; and completions that come together do not make a peak of them.
func TestPeakMeterMatchesWholeRun(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, c := range []struct{ window, depth int }{{1, 1}, {3, 8}, {50, 128}, {128, 64}} {
		start := time.Unix(1000, 0)
		m := newPeakMeter(c.window, c.depth, start)
		var posts, dones []time.Time
		now := start
		for len(dones) < 5000 {
			for len(posts)-len(dones) < c.depth {
				posts = append(posts, now)
				m.posted(now)
			}
			now = now.Add(time.Duration(rng.IntN(20_000)) * time.Nanosecond)
			for k := rng.IntN(c.depth) + 1; k > 0 && len(dones) < len(posts); k-- { // a batch
				dones = append(dones, now)
				m.add(now)
			}
		}
		want := 0.0
		for first := 0; first+c.window-1 < len(dones); first += max(c.window/4, 1) {
			if d := dones[first+c.window-1].Sub(posts[first]).Seconds(); d > 0 {
				want = max(want, float64(c.window*64)/d)
			}
		}
		if got := m.rate(64); got != want {
			t.Errorf("window %d depth %d: peak %v, want %v", c.window, c.depth, got, want)
		}
		if len(m.posts) != c.window+c.depth {
			t.Errorf("window %d depth %d: %d times kept", c.window, c.depth, len(m.posts))
		}
	}
	// 128 completions at one instant, after 1 ms: 128 messages a millisecond, not infinitely many.
	start := time.Unix(0, 0)
	m := newPeakMeter(128, 128, start)
	for range 128 {
		m.posted(start)
	}
	for range 128 {
		m.add(start.Add(time.Millisecond))
	}
	if got := m.rate(1); got != 128e3 {
		t.Errorf("128 completions together after 1 ms: %v a second, want 128000", got)
	}
	// Fewer completions than a window: the rate of them all.
	m = newPeakMeter(100, 1, time.Unix(0, 0))
	m.posted(time.Unix(0, 0))
	m.add(time.Unix(2, 0))
	if got := m.rate(1000); got != 500 {
		t.Errorf("one completion after 2 s: %v B/s, want 500", got)
	}
}

// Up to maxLatSamples the figures are exact; past it, count, least, greatest, mean and
// deviation stay exact while the samples kept for the percentiles stop growing.
func TestLatenciesBounded(t *testing.T) {
	var l latencies
	var all []time.Duration
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 1000 {
		d := time.Duration(1000+rng.IntN(50_000)) * time.Nanosecond
		if i == 500 {
			d = 7 * time.Millisecond
		}
		all = append(all, d)
		l.add(d)
	}
	s := l.summary()
	sorted := slices.Clone(all)
	slices.Sort(sorted)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	if s.min != us(sorted[0]) || s.max != 7000 || s.p50 != us(sorted[499]) || s.p99 != us(sorted[989]) ||
		s.p999 != us(sorted[998]) {
		t.Fatalf("summary %+v, want min %v p50 %v p99 %v p99.9 %v max 7000", s, us(sorted[0]), us(sorted[499]),
			us(sorted[989]), us(sorted[998]))
	}
	var sum, sq float64
	for _, d := range all {
		sum += us(d)
	}
	mean := sum / float64(len(all))
	for _, d := range all {
		sq += (us(d) - mean) * (us(d) - mean)
	}
	if math.Abs(s.avg-mean) > 1e-9*mean || math.Abs(s.stdev-math.Sqrt(sq/float64(len(all)))) > 1e-6 {
		t.Fatalf("avg %v stdev %v, want %v %v", s.avg, s.stdev, mean, math.Sqrt(sq/float64(len(all))))
	}

	// Past the bound: 3 times as many samples, the last third ten times slower. A uniform sample
	// puts about a third of its samples there, so the median stays fast and the p99 is slow.
	var big latencies
	for i := range 3 * maxLatSamples {
		d := 10 * time.Microsecond
		if i >= 2*maxLatSamples {
			d = 100 * time.Microsecond
		}
		big.add(d)
	}
	if len(big.keep) != maxLatSamples || big.n != 3*maxLatSamples {
		t.Fatalf("kept %d of %d samples, want %d of %d", len(big.keep), big.n, maxLatSamples, 3*maxLatSamples)
	}
	slow := 0
	for _, d := range big.keep {
		if d == 100*time.Microsecond {
			slow++
		}
	}
	if frac := float64(slow) / maxLatSamples; frac < 0.32 || frac > 0.35 {
		t.Fatalf("%.3f of the kept samples are from the last third, want about 1/3", frac)
	}
	bs := big.summary()
	if bs.min != 10 || bs.max != 100 || bs.p50 != 10 || bs.p99 != 100 || math.Abs(bs.avg-40) > 1e-6 {
		t.Fatalf("summary %+v, want min 10 p50 10 p99 100 max 100 avg 40", bs)
	}
}

// A latency run records its samples without allocating once it has reserved room for them: an
// allocation in the run brings the collector into it.
func TestLatenciesReservedDoNotAllocate(t *testing.T) {
	for _, c := range []struct {
		iters int
		timed bool
	}{{1000, false}, {0, true}} {
		var l latencies
		l.reserve(c.iters, c.timed)
		n := 500 // twice: AllocsPerRun runs it once before it counts
		if allocs := testing.AllocsPerRun(1, func() {
			for i := range n {
				l.add(time.Duration(i))
			}
		}); allocs != 0 {
			t.Errorf("iters %d timed %v: %v allocations adding %d samples", c.iters, c.timed, allocs, n)
		}
	}
}
