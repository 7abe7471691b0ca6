package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"time"
)

// What perf reports is kept in memory that does not grow with the run: a bandwidth test of an
// hour (-D 3600) holds what one of a second does.

// peakMeter finds the best rate over any window of messages, as perftest does: every window/4
// completions it takes the time from the posting of the window's first message to the completion
// of its last, so that completions that come together (after a loss held them back) do not read
// as a rate no link has. It keeps only the last window+outstanding post times and the count.
type peakMeter struct {
	window, step int
	posts        []time.Time // post i is at posts[i%len(posts)]
	np, n        int         // messages posted, completed
	start, last  time.Time
	best         float64 // messages per second
}

// newPeakMeter makes a meter of window messages for a sender that keeps at most outstanding
// messages posted and not completed.
func newPeakMeter(window, outstanding int, start time.Time) *peakMeter {
	window = max(window, 1)
	return &peakMeter{window: window, step: max(window/4, 1), posts: make([]time.Time, window+max(outstanding, 1)),
		start: start}
}

// posted counts one message posted at t.
func (m *peakMeter) posted(t time.Time) {
	m.posts[m.np%len(m.posts)] = t
	m.np++
}

// add counts one completion at t.
func (m *peakMeter) add(t time.Time) {
	if first := m.n - m.window + 1; first >= 0 && first%m.step == 0 && first < m.np {
		if d := t.Sub(m.posts[first%len(m.posts)]).Seconds(); d > 0 {
			m.best = max(m.best, float64(m.window)/d)
		}
	}
	m.n++
	m.last = t
}

// rate is the best rate in bytes a second for messages of size bytes; with fewer completions
// than a window, the rate of all of them.
func (m *peakMeter) rate(size int) float64 {
	if m.best == 0 && m.n > 0 {
		if d := m.last.Sub(m.start).Seconds(); d > 0 {
			return float64(m.n*size) / d
		}
	}
	return m.best * float64(size)
}

// maxLatSamples bounds the latencies kept for the percentiles (8 MiB).
const maxLatSamples = 1 << 20

// latencies keeps a latency test's figures: the count, least, greatest, mean and deviation
// exactly, and for the percentiles every sample up to maxLatSamples, then a uniform random
// sample of that many of all of them (reservoir sampling).
type latencies struct {
	n        int
	min, max time.Duration
	mean, m2 float64 // in µs (Welford's running mean and sum of squared deviations)
	keep     []time.Duration
	rng      *rand.Rand
}

// reserve makes room for the samples of a run of iters latencies (of up to maxLatSamples, if the
// run is timed instead), so that add does not allocate while the run is measured.
func (l *latencies) reserve(iters int, timed bool) {
	n := min(iters, maxLatSamples)
	if timed {
		n = maxLatSamples
	}
	l.keep = slices.Grow(l.keep, n)
}

// add records one latency.
func (l *latencies) add(d time.Duration) {
	l.n++
	if l.n == 1 || d < l.min {
		l.min = d
	}
	l.max = max(l.max, d)
	us := float64(d.Nanoseconds()) / 1e3
	delta := us - l.mean
	l.mean += delta / float64(l.n)
	l.m2 += delta * (us - l.mean)
	switch {
	case len(l.keep) < maxLatSamples:
		l.keep = append(l.keep, d)
	default:
		if l.rng == nil {
			l.rng = rand.New(rand.NewPCG(1, 2))
		}
		if i := l.rng.IntN(l.n); i < len(l.keep) {
			l.keep[i] = d
		}
	}
}

type latSummary struct{ min, max, p50, p99, p999, avg, stdev float64 }

// summary gives the figures in microseconds.
func (l *latencies) summary() latSummary {
	if l.n == 0 {
		return latSummary{}
	}
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	s := slices.Clone(l.keep)
	slices.Sort(s)
	q := func(p float64) float64 { return us(s[min(int(math.Ceil(p*float64(len(s))))-1, len(s)-1)]) }
	return latSummary{min: us(l.min), max: us(l.max), p50: q(0.5), p99: q(0.99), p999: q(0.999), avg: l.mean,
		stdev: math.Sqrt(l.m2 / float64(l.n))}
}
