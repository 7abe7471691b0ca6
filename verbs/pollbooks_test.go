package verbs_test

import (
	"runtime"
	"testing"

	"github.com/softefa/softefa/verbs"
)

// A Poll that meets completions of a QP's send and receive queues in turn hands the request-id
// pool lock from one queue's books to the other's at each entry (CQ.put keeps the lock only for
// a run of one queue's entries). A QP sending to itself through one CQ gives such runs: each
// round's send and receive completions alternate. Over 200 rounds the 64-entry pools of both
// queues go round 25 times each: every WR id comes back exactly once, in its own queue, and
// posting never finds a pool empty.
func TestPollAlternatingBooks(t *testing.T) {
	a, _ := newLoop(t, loopOpts{size: 8192})
	const rounds, k = 200, 8
	mixed := 0
	buf := make([]verbs.WC, 4*k)
	for round := range rounds {
		base := uint64(round) * 1000
		for i := range uint64(k) {
			a.recv(base+i, int(i)*64, 64)
		}
		for i := range uint64(k) {
			a.sendAH(base+500+i, a.ah, a.qp.QPN(), 64)
		}
		seen := map[uint64]verbs.WCOpcode{}
		for empty := 0; len(seen) < 2*k; {
			n, err := a.cq.Poll(buf)
			if err != nil {
				t.Fatalf("round %d: poll: %v", round, err)
			}
			sends, recvs := 0, 0
			for _, wc := range buf[:n] {
				if wc.Status != verbs.WCSuccess {
					t.Fatalf("round %d: wr_id %d: %v", round, wc.WRID, wc.Status)
				}
				if _, dup := seen[wc.WRID]; dup {
					t.Fatalf("round %d: wr_id %d completed twice", round, wc.WRID)
				}
				seen[wc.WRID] = wc.Opcode
				if wc.Opcode == verbs.WCSend {
					sends++
				} else {
					recvs++
				}
			}
			if sends > 0 && recvs > 0 {
				mixed++
			}
			if n == 0 {
				if empty++; empty > 1_000_000 {
					t.Fatalf("round %d: %d of %d completions, then none in a million polls", round, len(seen), 2*k)
				}
				runtime.Gosched()
			}
		}
		for i := range uint64(k) {
			if op, ok := seen[base+i]; !ok || op != verbs.WCRecv {
				t.Fatalf("round %d: receive %d completed as %v (%v)", round, base+i, op, ok)
			}
			if op, ok := seen[base+500+i]; !ok || op != verbs.WCSend {
				t.Fatalf("round %d: send %d completed as %v (%v)", round, base+500+i, op, ok)
			}
		}
	}
	if mixed == 0 {
		t.Fatal("no Poll returned send and receive completions together: the test proved nothing")
	}
	t.Logf("%d of %d rounds had a Poll with both queues' completions", mixed, rounds)
}
