package main

import (
	"testing"
	"testing/synctest"
	"time"
)

// A path's delay line sends datagrams in the order they fall due, none before its time, whatever
// the order they were added in.
func TestDelayLineSendsInDueOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newDelayLine()
		type sent struct {
			id byte
			at time.Time
		}
		var got []sent
		l.send = func(d delayed) { got = append(got, sent{d.b[0], time.Now()}) }
		done := make(chan struct{})
		go l.run(done)
		start := time.Now()
		delays := []time.Duration{300, 100, 200, 150, 0, 250}
		for i, d := range delays {
			l.add(delayed{due: start.Add(d * time.Microsecond), b: []byte{byte(i)}})
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		close(done)
		want := []byte{4, 1, 3, 2, 5, 0}
		if len(got) != len(want) {
			t.Fatalf("sent %d datagrams, want %d", len(got), len(want))
		}
		for i, g := range got {
			if g.id != want[i] {
				t.Errorf("datagram %d sent %d-th; want %d", g.id, i, want[i])
			}
			if due := start.Add(delays[g.id] * time.Microsecond); g.at.Before(due) {
				t.Errorf("datagram %d sent %v before it was due", g.id, due.Sub(g.at))
			}
		}
	})
}
