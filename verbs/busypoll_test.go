package verbs_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/softefa/softefa/link/memlink"
	"github.com/softefa/softefa/verbs"
)

// A Poll, or a StartPoll, that finds completions counts as busy polling, as one that finds none
// and reads the network does (engine.Device.Polled): the device's receive loop then parks
// beside the application instead of reading beside it (docs/architecture.md, "Goroutines";
// engine's rxorder tests show what the loop does with it).
func TestPollThatFindsCompletionsIsBusyPolling(t *testing.T) {
	for i, poll := range []func(cq *verbs.CQ) bool{
		func(cq *verbs.CQ) bool { n, err := cq.Poll(make([]verbs.WC, 4)); check(t, err); return n == 1 },
		func(cq *verbs.CQ) bool {
			err := cq.StartPoll(verbs.PollCQAttr{})
			check(t, err)
			cq.EndPoll()
			return true
		},
	} {
		a, b := memPair(t, memlink.New(1), 1, loopOpts{})
		b.recv(0, 0, 64)
		a.send(0, b, 0, 64)
		// The SEND's completion, written by the receive loop when the ACK came: no poll of
		// ours has run. Then the loop waits on the socket (were it on its way there, it would
		// clear what the poll marks).
		for deadline := time.Now().Add(10 * time.Second); verbs.CQWritten(a.cq) < 1 || !verbs.RxOnSocket(a.ctx); runtime.Gosched() {
			if time.Now().After(deadline) {
				t.Fatal("the SEND did not complete")
			}
		}
		if verbs.BusyPolled(a.ctx) {
			t.Fatalf("poll %d: busy-polled before any poll", i)
		}
		if !poll(a.cq) {
			t.Fatalf("poll %d found no completion", i)
		}
		if !verbs.BusyPolled(a.ctx) {
			t.Errorf("poll %d found a completion and did not count as busy polling", i)
		}
	}
}
