package uverbs

import "time"

// Completion traps (docs/cabi.md, "Completion traps"). A program that reads the CQ rings itself
// (libfabric 2.x's efa provider) calls nothing softefa sees while it waits for a completion, so the
// completion could only come from the engine's receive loop, whose thread must first be woken and
// given a core: on a small machine whose cores the program's own busy polling keeps, that wait
// is most of a round trip. So, after a trapped SQ doorbell store of a QP that talks to other
// devices, the shim guards the program's mappings of the QP's CQ rings (no access); the
// program's next read of one faults, and its thread, instead of spinning on the entry, spins
// here, taking the network's datagrams itself, until the entry is written or a budget passes;
// then the mapping is open again until the next trapped doorbell store.

// CQTraps reports whether completion traps are on (Options.CQSpin).
func (d *Device) CQTraps() bool { return d.cqSpin > 0 }

// Lingers reports whether a trapped ring of a ping-ponging QP waits for the answer
// (Options.Linger).
func (d *Device) Lingers() bool { return d.linger > 0 }

// CQRing reports which CQ's ring the mmap key names: its handle, or false when the key is not a
// CQ's ring or completion traps are off. The shim guards its mappings of that ring after a
// trapped doorbell store (RingTrapped).
func (f *File) CQRing(key uint64) (uint32, bool) {
	if f.d.cqSpin <= 0 {
		return 0, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for h, o := range f.objs {
		if c, ok := o.(*cqObj); ok && c.ringKey == key && !c.dead {
			return h, true
		}
	}
	return 0, false
}

// RingTrapped is a trapped store to the SQ doorbell of the QP with handle h: it rings the engine
// as Kick does, and returns the handles of the QP's send and receive CQs if their next entries
// will come from the network (the QP has sent to another device), for the shim to guard. ok is
// false for an unknown handle, a QP that has talked only to its own device, or with completion
// traps off. With a linger budget (Options.Linger), a QP that talks to peers and ping-pongs (a
// receive followed each of its last lingerAfter rings: lingers) first has the calling thread
// wait for its next receive (engine.Device.AwaitRecv).
func (f *File) RingTrapped(h uint32) (send, recv uint32, ok bool) {
	o := f.kick(h)
	if o == nil || !o.qp.TalksToPeers() {
		return 0, 0, false
	}
	seen := o.qp.Counters().RecvWRs.Load()
	if o.lingers(o.rungRecvs.Swap(seen) != seen) && f.d.linger > 0 {
		f.d.e.AwaitRecv(o.qp, seen, f.d.linger)
	}
	if f.d.cqSpin <= 0 {
		return 0, 0, false
	}
	return o.cqs[0], o.cqs[1], true
}

// KickAwait is Kick for a program in another process (the host device's doorbell socket). When
// wait is set (the program's thread waits for the answer) and the QP ping-pongs as RingTrapped
// tells it (lingers), the calling goroutine then blocks until the QP's next receive, for at most
// the linger budget (Options.Linger, timed with t), or until interrupt is ready (the program
// kicked again: its next kick may be what the receive needs). The program's thread sleeps
// meanwhile instead of spinning on its CQ, which on a machine with few cores leaves them to the
// peer and the device that make the answer. It reports whether the QP's next kick would linger,
// for the program to wait on that one.
func (f *File) KickAwait(h uint32, wait bool, t *time.Timer, interrupt <-chan struct{}) (lingering bool) {
	o := f.kick(h)
	if o == nil || f.d.linger <= 0 {
		return false
	}
	seen := o.qp.Counters().RecvWRs.Load()
	if o.lingers(o.rungRecvs.Swap(seen) != seen) && wait {
		t.Reset(f.d.linger)
		o.qp.Await(seen, t.C, interrupt)
		t.Stop()
	}
	return o.answers.Load() >= lingerAfter
}

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

// AwaitCQ is a read at byte off of the ring of the CQ with handle h that found the program's
// mapping guarded: the reading thread polls the network until the entry there is written, or
// the spin budget has passed (engine.Device.AwaitCQ). Unknown handles are ignored.
func (f *File) AwaitCQ(h uint32, off uint64) {
	f.mu.Lock()
	o, ok := f.objs[h].(*cqObj)
	f.mu.Unlock()
	if !ok || f.d.cqSpin <= 0 {
		return
	}
	if slot := off / uint64(o.cq.EntrySize()); slot < uint64(o.cq.Depth()) {
		f.d.e.AwaitCQ(o.cq, uint32(slot), f.d.cqSpin)
	}
}
