package uverbs

import (
	"sync/atomic"
	"time"

	"github.com/softefa/softefa/internal/engine"
)

// Lingering after a post (docs/cabi.md, "Lingering after a post"): a program that ping-pongs posts
// and then spins on its CQ for the answer. Its device's receive loop, which would write the
// answer's completion, must first be woken and given a core, which on a small machine the
// program's busy polling keeps: most of a round trip. So the posting thread, once its QP has
// shown that it ping-pongs (lingerAfter rings in a row each answered by a receive), waits for the
// answer in the device instead, taking the network's datagrams itself (RingTrapped), or, for a
// program of the host device, waiting, its core yielded, until the device answers its kick
// (KickLinger).

// RingTrapped is a trapped store to the SQ doorbell of the QP with handle h: it rings the engine
// as Kick does, and a QP that talks to peers and ping-pongs (lingers) first has the calling
// thread wait for its next receive, for at most the linger budget (engine.Device.AwaitRecv).
// Unknown handles are ignored.
func (f *File) RingTrapped(h uint32) {
	o, sq := f.kick(h, nil)
	if o == nil || !o.qp.TalksToPeers() {
		return
	}
	seen := o.qp.RecvsBefore(sq) // (as KickLinger counts: the send may have been taken before the ring)
	if o.lingers(o.rungRecvs.Swap(seen) != seen) && f.d.linger > 0 {
		f.d.lingered.Add(1)
		f.d.e.AwaitRecv(o.qp, seen, f.d.linger)
	}
}

// Lingered returns how many posts have waited for their answer (RingTrapped, KickLinger).
func (d *Device) Lingered() uint64 { return d.lingered.Load() }

// KickLinger is Kick for a program in another process (the host device's doorbell socket). When
// wait is set (the program's thread waits for the answer), the kick posted a send (the QP's SQ
// doorbell moved since its previous kick) and the QP ping-pongs as RingTrapped tells it
// (lingers), it registers w for the QP's next receive (engine.QP.OnRecv) and returns the linger
// budget: the caller answers the program from w.Fn, or when the budget runs out, or when the
// program kicks again (its next kick may be what the receive needs), taking w back with
// Withdraw. The program's thread waits meanwhile, yielding its core, instead of spinning on its
// CQ, which on a machine with few cores leaves them to the peer and the device that make the
// answer. Otherwise
// (no linger, the receive already come, another waiter on the CQ) it returns 0 and the caller
// answers at once. A kick that posted no send (a receive posted) never lingers: no message of its
// is out to be answered, and a receive would wait for the program's own next send. Nor does one of
// a QP whose last message went to a QP of the same process on this device (engine.QP.LocalPeer):
// the answer is that process's own next post, which its waiting thread may be the one to make. lingering
// reports whether the QP's next kick would linger, for the program to wait on that one. The ring
// is made on behalf of by (engine.Device.RingBy): receives it completes tell their waiters by.
// Unknown handles are ignored. KickLinger does not wait for the File: while another holds its lock
// (a command, an arm, a netlink dump; a command that gives the program an fd waits for the
// program), it does nothing and reports busy, for the caller to try again, so that one program
// cannot hold up the goroutine that serves all.
func (f *File) KickLinger(h uint32, wait bool, w *engine.RecvWaiter, by any) (budget time.Duration, lingering, busy bool) {
	if !f.mu.TryLock() {
		return 0, false, true
	}
	o, ok := f.objs[h].(*qpObj)
	var sq uint32
	if ok {
		sq = atomic.LoadUint32(o.qp.SQDoorbell()) // (under the lock: the QP and its page live)
		f.d.e.RingBy(o.qp, by)
	}
	f.mu.Unlock()
	if !ok || f.d.linger <= 0 {
		return 0, false, false
	}
	if o.lastSQ.Swap(sq) == sq { // posted no send
		return 0, o.answers.Load() >= lingerAfter, false
	}
	// The receives that may answer this kick's send are those counted since the send was taken
	// from the SQ, which the engine loop may have done before this Ring (RecvsBefore); counted
	// from now, a reply that came meanwhile would leave the kick waiting its whole budget for the
	// one after it.
	seen := o.qp.RecvsBefore(sq)
	if p := o.qp.LocalPeer(); p != nil {
		if po, ok := p.Owner().(*qpObj); ok && po.f.sameProcess(f) {
			// Its answer is the program's own next post: no linger, and the run of answered
			// kicks starts again (a later peer elsewhere ping-pongs lingerAfter times first).
			o.rungRecvs.Store(seen)
			o.answers.Store(0)
			return 0, false, false
		}
	}
	if o.lingers(o.rungRecvs.Swap(seen) != seen) && wait && o.qp.OnRecv(seen, w) {
		f.d.lingered.Add(1)
		budget = f.d.linger
	}
	return budget, o.answers.Load() >= lingerAfter, false
}

// Withdraw takes back w, which KickLinger registered, before its receive, and reports whether it
// was still waiting (w.Fn has not run and will not).
func (d *Device) Withdraw(w *engine.RecvWaiter) bool { return d.e.Withdraw(w) }

// lingerAfter is how many trapped rings in a row a receive must follow before a ring lingers. A
// ping-pong's every ring is answered; a program whose messages take several posts (UCX's eager
// fragments, a rank sending to several peers before it waits) rings again before the answer, and
// a linger on its first post would wait its whole budget for an answer that needs the posts its
// own thread has yet to make (UCX tag_lat 4 KiB: 1.1–1.6 ms a round trip against 151–326 µs
// without lingering). Any run of two rings without a receive between them shows that shape.
const lingerAfter = 4

// lingers records a trapped ring of o, answered when the QP completed a receive since its
// previous ring, and reports whether this ring should wait for the answer: the last lingerAfter
// rings were all answered.
func (o *qpObj) lingers(answered bool) bool {
	if !answered {
		o.answers.Store(0)
		return false
	}
	if o.answers.Load() >= lingerAfter {
		return true
	}
	o.answers.Add(1)
	return false
}
