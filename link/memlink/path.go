package memlink

import (
	"math/rand/v2"
	"time"
)

// Path is one sender's path with its own random stream, Gilbert–Elliott state and rate-limited
// queue: it decides what happens to each datagram under an Impairment. The in-memory fabric uses
// one per node and path; `softefa fabric` uses one per path over real sockets. Not safe for
// concurrent use.
type Path struct {
	rng  *rand.Rand
	bad  bool
	link Bottleneck
}

// NewPath returns a path whose randomness comes from the two seeds.
func NewPath(seed1, seed2 uint64) *Path { return &Path{rng: rand.New(rand.NewPCG(seed1, seed2))} }

// Verdict is what a path does to one datagram: Copies of it (0, 1 or 2) are delivered, copy i
// after Delay[i] with bit Flip[i] flipped (-1: none); Dropped counts the copies lost.
type Verdict struct {
	Copies  int
	Dropped int
	Delay   [2]time.Duration
	Flip    [2]int
}

// Decide applies imp to a datagram of n bytes sent at now.
func (p *Path) Decide(imp *Impairment, n int, now time.Time, v *Verdict) {
	*v = Verdict{Flip: [2]int{-1, -1}}
	loss := imp.Loss
	if imp.ToBad > 0 {
		if p.bad {
			p.bad = p.rng.Float64() >= imp.ToGood
		} else {
			p.bad = p.rng.Float64() < imp.ToBad
		}
		if p.bad {
			loss = imp.BadLoss
		}
	}
	if imp.Down || p.rng.Float64() < loss {
		v.Dropped = 1
		return
	}
	var queued time.Duration
	if imp.Rate > 0 {
		p.link.Rate, p.link.Queue = imp.Rate, imp.Queue
		q, ok := p.link.admit(now, n)
		if !ok {
			v.Dropped = 1
			return
		}
		queued = q
	}
	v.Copies = 1
	if p.rng.Float64() < imp.Duplicate {
		v.Copies = 2
	}
	for c := range v.Copies {
		v.Delay[c] = imp.Delay + queued
		if imp.Jitter > 0 {
			v.Delay[c] += time.Duration(p.rng.Int64N(int64(imp.Jitter)))
		}
		if n > 0 && p.rng.Float64() < imp.Corrupt {
			v.Flip[c] = p.rng.IntN(8 * n)
		}
	}
}
