package engine

import (
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softefa/softefa/internal/srd"
	"github.com/softefa/softefa/link"
)

// Ring tells the engine that the producer stored a new value into one of q's doorbells, so that
// it looks at q at once. Safe from any goroutine; it does not block.
//
// When neither the engine loop nor a receive loop holds the device, the caller does the work
// itself, at once: the doorbell's WQEs are executed and their datagrams sent from the caller's
// goroutine, which saves a goroutine handoff per post.
func (d *Device) Ring(q *QP) { d.RingBy(q, nil) }

// RingBy is Ring on behalf of by: receives that the work done on the calling goroutine completes
// tell their RecvWaiters by (RecvWaiter.Fn), so that the caller may answer them once it has
// nothing more to carry out. Receives completed elsewhere (the engine loop, a receive loop) tell
// nil.
func (d *Device) RingBy(q *QP, by any) {
	if d.ringInline(q, by) {
		return
	}
	if q.kicked.CompareAndSwap(false, true) {
		d.pending.push(q)
	}
	d.wake()
}

// RecvsWanted reports whether sends parked after RNR wait on this device: a receive posted now
// lets them go at once if its poster rings the doorbell (Ring), where otherwise they wait for their
// retry interval. A receive posted while nothing waits needs no ring: the device reads the
// receive queue's doorbell when a message arrives for it.
func (d *Device) RecvsWanted() bool { return d.parkedSends.Load() }

// ringInline does for q what the engine loop does for a kicked QP, if the device is free, and
// hands the engine loop whatever one step left (a batch limit, parked RNR retries); it reports
// false, having done nothing, if the device was busy or closed.
//
// The device lock is taken with TryLock: a poster never waits for the device (the engine loop
// does the work instead), and the datagrams go out from a queue of the free list (txqs), taken
// once the lock is held.
func (d *Device) ringInline(q *QP, by any) bool {
	if !d.mu.TryLock() {
		return false
	}
	if d.closed {
		d.mu.Unlock()
		return false
	}
	var worked, busy, more bool
	tq := d.takeTxq()
	d.unlockAfter(tq, func(now time.Duration) {
		d.inlineQ[0], d.ringBy = q, by
		worked, busy = d.step(d.inlineQ[:], false, now) // (and sends the owed ACKs that are due)
		d.inlineQ[0], d.ringBy = nil, nil
		more = !q.dead && uint16(atomic.LoadUint32(q.sq.db)) != q.sq.ci // a destroyed QP's doorbell page may be gone
	})
	d.putTxq(tq)
	switch {
	case more || busy:
		// Left over (a batch limit, parked RNR retries): the engine loop carries on.
		if q.kicked.CompareAndSwap(false, true) {
			d.pending.push(q)
		}
		d.wake()
	case worked && !d.fastPoll.Load():
		// Traffic after a quiet spell: the engine loop's timer (retransmissions, RNR retries)
		// must tick every PollMin again.
		d.inlined.Store(true)
		d.wake()
	}
	return true
}

// takeTxq takes a datagram queue from the free list, or makes one (the free list holds what the
// goroutines that ever posted at once needed: in steady state nothing is allocated).
func (d *Device) takeTxq() *srd.Queue {
	select {
	case q := <-d.txqs:
		return q
	default:
		return d.newQueue()
	}
}

// putTxq gives an empty queue back to the free list.
func (d *Device) putTxq(q *srd.Queue) {
	select {
	case d.txqs <- q:
	default:
	}
}

// driver is what Drive reuses from call to call.
type driver struct {
	rx     *srd.Inbox
	poller link.Poller
	q      *srd.Queue
	batch  []*QP
}

// busyPoll is what PollNetwork reuses from call to call: the link's receiver, which every
// reader uses in turn under busyMu, and the readers' inbox, which one reader holds at a time,
// from before its read until the datagrams its batch produced are sent (it lets go of busyMu
// once it holds mu). The device's first reader makes it (the receive loop has its own); a busy
// poll that finds it out reads nothing, as one that finds busyMu taken, and the engine loop's
// timer waits for it (timerRead). Making a second when two readers met (the timer and the
// application's poll, once in a ping-pong's 0.4 s) mapped and zeroed some 300 KB at MTU 9001,
// which took a millisecond of page faults on this machine kind, in the middle of a round trip
// (docs/performance.md, "Where the time goes").
type busyPoll struct {
	poller  link.Poller
	backlog link.Backlogger // the poller, if it tells whether a read left datagrams behind
	inbox   chan *scratch   // the inbox, while no reader holds it (capacity 1)
	made    atomic.Bool     // the inbox is made (or being made)
	bytes   atomic.Int64    // what the inbox holds
}

// scratch is the busy pollers' inbox, with what it held in datagram buffers when last counted.
type scratch struct {
	*srd.Inbox
	counted int
}

// takeInbox takes the busy pollers' inbox for the holder of busyMu, or returns nil, having let go
// of busyMu, when another reader holds the inbox. The first call makes it, letting go of busyMu
// meanwhile (the readers that poll then must not wait for its page faults), and returns nil if
// busyMu was taken again by then.
func (d *Device) takeInbox() *scratch {
	b := d.busyRx
	select {
	case in := <-b.inbox:
		return in
	default:
	}
	d.busyMu.Unlock()
	if b.made.Load() || !b.made.CompareAndSwap(false, true) { // (a load: the inbox is out)
		return nil
	}
	in := makeScratch(d)
	b.bytes.Add(int64(in.counted))
	if !d.busyMu.TryLock() {
		b.done(in)
		return nil
	}
	return in
}

// makeScratch makes the busy pollers' inbox (a variable for the tests).
var makeScratch = func(d *Device) *scratch {
	in := &scratch{Inbox: d.srd.NewInbox()}
	in.counted = in.Bytes()
	return in
}

// ScratchBytes is what the busy pollers' inbox holds in datagram buffers (some 300 KB at MTU
// 9001, and its queue's as it grows), once a reader has made it: a test that measures the
// memory of something else takes it off.
func (d *Device) ScratchBytes() int64 {
	if d.busyRx == nil {
		return 0
	}
	return d.busyRx.bytes.Load()
}

// done gives the inbox back.
func (b *busyPoll) done(in *scratch) {
	n := in.Bytes()
	b.bytes.Add(int64(n - in.counted))
	in.counted = n
	b.inbox <- in
}

// Drive moves a driven device (config.Device.Driven) one step, on the caller's goroutine: it
// takes every datagram the link holds, serves the doorbells rung since the last call, looks at
// every doorbell, runs the transport's timers against the device clock, and sends what all that
// produced. It reports whether anything arrived or any work request was consumed: when no device
// on a simulated network has anything to do, its owner moves the clock on. A device that is not
// driven, or closed, does nothing.
func (d *Device) Drive() (worked bool) {
	dr := d.drv
	if dr == nil {
		return false
	}
	d.ticks.Add(1)
	d.locked(dr.q, func(now time.Duration) {
		if d.closed {
			return
		}
		for dr.poller != nil {
			n, err := dr.poller.TryReceive(dr.rx.Pkts)
			if n == 0 || err != nil {
				break
			}
			// The clock again for each batch, as the receive loop reads it: packets are
			// stamped when sent (srd: Transport.sendTime), and an ACK of one sent in this loop
			// must not be timed against a reading from before it (a negative RTT).
			now = d.clock()
			d.srd.Input(now, dr.rx, n, false)
			worked = true
		}
		dr.batch = d.pending.drain(dr.batch)
		if w, _ := d.step(dr.batch, true, now); w {
			worked = true
		}
		clear(dr.batch)
	})
	return worked
}

func (d *Device) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// run is the engine loop: the goroutine that consumes rings when no poster does it inline
// (ringInline), and runs the transport's timers. It wakes on Ring, and on a timer
// that polls every doorbell: every PollMin while there is work, backing off to PollMax while
// some QP's doorbells are noticed only by polling (PollDoorbells), and not at all when nothing
// is outstanding: an idle device costs no CPU.
func (d *Device) run() {
	defer d.wg.Done()
	period := d.cfg.PollMin
	timer := d.tick
	defer timer.Stop()
	armed, armedFor := true, period
	var batch []*QP
	q := d.newQueue()
	for {
		polled := false
		select {
		case <-d.done:
			return
		case <-d.kick:
		case <-timer.C:
			polled = true
		}
		d.counts.EngineWakeups.Add(1)
		if polled {
			// (A busy poller's ticks push the timer on while they leave work to time: when it
			// fires, this tick decides whether it stops or slows down.)
			d.tickAt.Store(int64(d.sinceStart()))
			d.ticks.Add(1)
			// Before the timers look for losses: what arrived and is not read yet. A process
			// short of CPU may wake here before its receive loop does, with the ACKs of every
			// packet the timer would otherwise send again waiting in the socket.
			if !d.timerRead() {
				return // (closed)
			}
		}
		var stop, reset bool
		d.locked(q, func(now time.Duration) {
			batch = d.pending.drain(batch)
			worked, busy := d.step(batch, polled, now)
			if d.inlined.Swap(false) {
				worked = true
			}
			// Idle: nothing to time (no stream has anything outstanding, nothing parked or
			// owed) and no QP whose doorbells only a poll notices. An idle device sleeps until
			// kicked.
			idle := !worked && !busy && (d.srd == nil || !d.srd.Busy() && !d.srd.Lingering()) && d.polledQPs == 0 &&
				len(d.recheck) == 0
			switch {
			case worked || busy:
				period = d.cfg.PollMin
			case polled:
				period = min(2*period, d.cfg.PollMax)
			}
			if polled {
				armed = false
			}
			stop = idle && armed
			// (Armed for longer than the period now wanted: ACKs owed after a quiet spell.)
			reset = !idle && (!armed || worked || armedFor > period)
			switch {
			case stop:
				armed = false
			case reset:
				armed, armedFor = true, period
			}
			// Decided under the lock: a poster that works inline after this sees whether the
			// timer will tick fast, and wakes the loop if not (ringInline).
			d.fastPoll.Store(armed && armedFor == d.cfg.PollMin)
		})
		switch {
		case stop:
			timer.Stop()
		case reset:
			timer.Reset(period)
		}
	}
}

// claimTick claims the tick due at now for a busy poller (tickIfDue): it reports false if the
// last tick, the engine loop's or a poller's, was less than every ago, or another poller claimed
// this one.
func (d *Device) claimTick(now, every time.Duration) bool {
	last := d.tickAt.Load()
	return now-time.Duration(last) >= every && d.tickAt.CompareAndSwap(last, int64(now))
}

// tickIfDue runs the engine loop's timer tick on the calling goroutine, an application's that
// polls the device (PollNetwork, Polled), when one is due: while the loop's timer ticks every
// PollMin (fastPoll), three quarters of PollMin after the last tick, so that the poller comes
// before the loop's timer. Like the loop's tick it reads the network first, and on while its
// reads leave datagrams behind, as the receive loop's look does, which the tick stands for (up to
// tickReads reads: then the receive loop's park ends, and it reads the rest; a read refused, with
// another reader at work, ends them); then it steps every
// QP and runs the transport's timers. While that leaves work to time, it pushes the loop's timer
// on to PollMin after this tick; and it pushes a park of the receive loop to busyPark after it (at
// least PollMin): while the application polls, its thread does the device's periodic work and
// reads the socket, and no other thread of the process wakes for it. On 2 cores with two
// busy-polling processes, each wake-up of a second thread took a core from the other process
// (docs/architecture.md, "Goroutines"). When the application stops polling, the timer and the
// park end as they would have at its last tick; when a tick leaves nothing to time, the loop's
// own next tick decides whether its timer stops or slows down (run).
func (d *Device) tickIfDue() {
	if d.busyRx == nil || !d.fastPoll.Load() || !d.claimTick(d.sinceStart(), d.cfg.PollMin-d.cfg.PollMin/4) {
		return
	}
	d.ticks.Add(1)  // (before the read, as the engine loop's tick: recheckArms)
	backlog := true // (until a read leaves nothing behind: then the receive loop reads the rest, below)
	for i := range tickReads {
		got, more := d.readNetwork(true)
		if !more {
			backlog = false
			break
		}
		if !got {
			// Refused: another reader holds the receiver or the inbox, and reads. Refused at
			// the first read, the tick is one whose read found nothing; after reads that left
			// datagrams behind, the receive loop reads the rest.
			backlog = backlog && i > 0
			break
		}
	}
	var worked, busy bool
	tq := d.takeTxq()
	d.locked(tq, func(now time.Duration) {
		if d.closed {
			return
		}
		worked, busy = d.step(nil, true, now)
		// (Under mu: the engine loop decides under it whether its timer stops or slows down.)
		if (worked || busy) && d.fastPoll.Load() {
			d.tick.Reset(d.cfg.PollMin)
		}
	})
	d.putTxq(tq)
	switch {
	case (worked || busy) && !d.fastPoll.Load():
		// The loop's timer stopped or slowed down meanwhile: it must tick every PollMin again
		// (as after an inline post: ringInline).
		d.inlined.Store(true)
		d.wake()
	case backlog:
		// The application's thread has its own work to do: the receive loop reads the rest, as
		// at the end of a park (its look reads on while reads leave datagrams behind).
		select {
		case d.rxResume <- struct{}{}:
		default:
		}
	case d.parkedRx():
		d.park.Reset(max(time.Duration(busyPark.Load()), d.cfg.PollMin))
	}
}

// tickReads is the most reads a busy poller's tick makes (tickIfDue).
const tickReads = 4

// sinceStart is the time since the device started, for the timing of the engine loop's ticks
// (claimTick), which its timer measures in the same time, whatever the device clock
// (config.Device.Clock) says.
func (d *Device) sinceStart() time.Duration { return time.Since(d.start) }

// step processes the QPs handed over by Ring and, when polled, every QP's doorbells; then it
// retries sends parked after RNR. It reports whether any entry was consumed and whether parked
// work remains. Called with d.mu held, at now.
func (d *Device) step(batch []*QP, polled bool, now time.Duration) (worked, busy bool) {
	rqMoved := false
	look := func(q *QP) {
		if d.processSQ(q, now) {
			worked = true
		}
		if q.dead {
			return
		}
		if pc := uint16(atomic.LoadUint32(q.rq.db)); pc != q.rq.seen {
			q.rq.seen = pc
			rqMoved = true
		}
	}
	for _, q := range batch {
		q.kicked.Store(false)
		look(q)
	}
	if polled {
		for _, q := range d.qpList {
			look(q)
		}
		d.recheckArms()
	}
	parked := false
	for _, q := range d.qpList {
		d.retryParked(q, rqMoved, now)
		if len(q.parked) > 0 {
			parked = true
		}
	}
	d.parkedSends.Store(parked)
	busy = busy || parked
	if d.srd == nil {
		return worked || rqMoved, busy
	}
	if polled {
		busy = d.srd.Tick(now) || busy
	}
	if d.srd.AcksOwed() {
		// Owed ACKs (a busy poll's): the engine loop's tick sends them, so it must keep ticking.
		if polled {
			d.srd.FlushAcks(now, 0)
		} else {
			d.srd.FlushAcks(now, srd.AckDelay)
		}
		busy = busy || d.srd.AcksOwed()
	}
	return worked || rqMoved, busy
}

// recheckArms reads once more the doorbells of the CQs that got an entry without an event in an
// earlier tick (CQ.post): an arm stored before the entry, and not yet visible when the entry was
// written, is visible a tick later (a millisecond or more) and raises its event. An entry of this
// tick waits for the next: its consumer's arm may still be on its way. One read is enough: once
// the entry is visible to the consumer, an arm it stores later is followed by its own poll, which
// finds it. Called with d.mu held.
func (d *Device) recheckArms() {
	tick := d.ticks.Load()
	keep := d.recheck[:0]
	for _, cq := range d.recheck {
		if cq.rechkAt == tick && !cq.dead {
			keep = append(keep, cq)
			continue
		}
		cq.recheck = false
		cq.checkArm()
	}
	clear(d.recheck[len(keep):])
	d.recheck = keep
}

// AwaitRecv is made on the thread of a program that has just posted a send on q after a receive
// of q completed (a ping-pong: docs/cabi.md, "Lingering after a post"): the thread polls the
// network, as PollNetwork does, until q has completed a receive past seen (its Recvs count) or
// budget has passed. When the post left only itself on the network (a ping-pong, not a stream),
// the wait also lasts until the peer has acknowledged it: the program looks for both completions
// next (libfabric's fi_pingpong waits for its send's before it looks for the answer), and an ACK
// that comes after the answer must be taken off the socket too. Taking them on the program's own
// thread spares the wake-up of the receive loop's.
//
// When the program answered the previous linger's receive within srd.AckDelay, the ACKs of this
// one stay owed, as PollNetwork's do, for the answer to carry: a ping-pong then sends one
// datagram each way, not two. Otherwise (the program computes between a receive and its answer)
// they go at once, as the receive loop's do: an owed ACK would wait for the device's timer, which
// in a C program's process runs late. Either way, what is owed when the wait starts (an ACK the
// post could not carry) goes first. An ACK still owed when the program exits goes then
// (FlushAcks, from the shim's exit handler).
func (d *Device) AwaitRecv(q *QP, seen uint64, budget time.Duration) {
	last := q.answered.Load() // 0: the last linger took no receive, or there was none
	lazy := last != 0 && d.clock()-time.Duration(last) < srd.AckDelay
	d.sendOwedAcks()
	alone := q.outN.Load() <= 1
	d.pollWhile(func() bool { return q.recvs.Load() == seen || alone && q.outN.Load() > 0 }, budget, lazy)
	if q.recvs.Load() != seen {
		q.answered.Store(max(int64(d.clock()), 1))
	} else {
		q.answered.Store(0)
	}
}

// sendOwedAcks sends every owed ACK now, if the device is free (TryLock: a poster never waits for
// the device, and a holder of the device sends what is due at the end of its own batch).
func (d *Device) sendOwedAcks() {
	if d.busyRx == nil || !d.srd.AcksOwed() {
		return
	}
	q := d.takeTxq()
	d.flushOwed(q, 0)
	d.putTxq(q)
}

// flushOwed sends the ACKs owed for at least minAge from q, if the device is free (TryLock); q is
// the caller's.
func (d *Device) flushOwed(q *srd.Queue, minAge time.Duration) {
	if !d.srd.AcksOwed() || !d.mu.TryLock() {
		return
	}
	d.unlockAfter(q, func(now time.Duration) {
		if !d.closed {
			d.srd.FlushAcks(now, minAge)
		}
	})
}

// pollWhile polls the network on the calling thread, as PollNetwork does (running the engine
// loop's tick when one is due too), while waiting reports true and budget has not passed
// (AwaitRecv); lazy leaves the ACKs owed (pollNetwork).
//
// After yieldAfter of waiting, each poll that found nothing offers the thread's core to other
// threads (OSYield): on a machine with more busy processes than cores (MPI ranks beside each
// other) the peer that must answer may be waiting for this very core, and the program's own busy
// loop, which the wait stands in for, may have yielded too (MPICH's does).
func (d *Device) pollWhile(waiting func() bool, budget time.Duration, lazy bool) {
	if d.busyRx == nil {
		return // (no busy poller: PollNetwork would never take anything)
	}
	start := time.Now()
	for waiting() {
		d.markBusy()
		got := d.pollNetwork(lazy)
		d.tickIfDue()
		waited := time.Since(start)
		if !got && waited >= yieldAfter {
			yield()
		}
		if waited >= budget {
			return
		}
	}
}

// yieldAfter is how long pollWhile spins before it offers its core between polls: on a quiet
// machine the answer comes well within it (a lingering thread waits a round trip, 60-80 µs
// here), so it costs those nothing.
var yieldAfter = 100 * time.Microsecond // (variables for the tests)

var yield = OSYield

// TalksToPeers reports whether q has sent to another device: the completions of its sends, and
// likely the answers to them, come from the network.
func (q *QP) TalksToPeers() bool { return q.remote.Load() }

// LocalPeer returns the QP of this device that q's last message went to, or nil if that message
// went to another device, named no QP here, or none was sent. A host device tells by it whether a
// QP ping-pongs with a QP of its own program, whose answer the program's own thread may have to
// post.
func (q *QP) LocalPeer() *QP { return q.peer.Load() }

// PollNetwork is a receive done by a goroutine that found its completion queue empty (busy
// polling, as SO_BUSY_POLL does for sockets): it takes the datagrams the link holds now, without
// waiting, handles them and sends what they produced. It reports whether any datagram came. It
// does nothing, and reports false, when another goroutine is doing the same, or the device is
// closed, driven, or has no link that can be polled beside its receive loop (link.BusyPoller).
//
// busyMu is the busy pollers' token for the link's receiver, taken with TryLock: a goroutine that
// finds another already polling has nothing to add (they read the same socket) and goes back to
// its CQ instead of waiting, and so does one that finds the readers' inbox out (busyPoll): the
// holder of busyMu reads, then holds it until it holds mu, and the inbox until its batch is
// handed over and sent; only the engine loop's timer waits for the inbox (timerRead), and it and
// the receive loop wait for busyMu. When nothing came, the owed ACKs are flushed only if mu is free (TryLock): a holder of mu flushes what is
// due at the end of its own batch.
//
// A goroutine that busy-polls keeps the receive loop from spinning (rxOrdered): two threads
// spinning for one device take the cores other processes need. It also runs the engine loop's
// timer tick when one is due (tickIfDue).
func (d *Device) PollNetwork() bool {
	d.markBusy()
	got := d.pollNetwork(true)
	d.tickIfDue()
	return got
}

// Polled notes that an application's goroutine polled a CQ of the device and found completions:
// it busy-polls, and reads the network itself when its CQ runs dry (PollNetwork), so the receive
// loop parks where it would wait (rxOrdered). Without it a sender whose every poll found the
// completions the receive loop had made kept the loop reading beside it: two threads busy for
// one device. A load, and a store once a park (or long wait) of the loop; while the engine loop's
// timer ticks fast, a clock reading, and the timer's tick when one is due (tickIfDue).
func (d *Device) Polled() {
	if d.busyRx != nil {
		d.markPolled()
		d.tickIfDue()
	}
}

// markPolled sets polled: a load, and a store only when it was clear (once a park of the loop),
// when the device also joins polledSince unless it is in. A poll of another device than the last
// one polled in the process ends that one's park (lastPolled); a device that closes meanwhile is
// not left there.
func (d *Device) markPolled() {
	if !d.polled.Load() {
		d.polled.Store(true)
		if !d.marked.Load() {
			polledSince.add(d)
		}
	}
	if prev := lastPolled.Load(); prev != d && lastPolled.CompareAndSwap(prev, d) {
		if prev != nil {
			prev.EndBusy()
		}
		if d.closing() {
			lastPolled.CompareAndSwap(d, nil) // a poll racing Close keeps no closed device
		}
	}
}

// lastPolled is the device an application goroutine of the process polled last (markPolled).
// A goroutine that drives two devices (softefa demo plays both ends) polls one's CQ, finds a
// completion, and then polls the other's, whose completion needs the first device to read its
// socket: the poll's evidence that an application polls the first is gone, and its receive
// loop must not stay parked until the park ends. A goroutine that polls two devices by turns
// keeps neither loop parked: each reads as it did before parking existed. A load a poll, and a
// store when the device polled changes.
var lastPolled atomic.Pointer[Device]

// markBusy notes that an application's goroutine busy-polls the device now (rxOrdered).
func (d *Device) markBusy() {
	if d.busyRx != nil {
		d.busyAt.Store(monoNow())
		d.markPolled()
	}
}

// RxOnSocket reports whether the receive loop waits on the socket (for tests).
func (d *Device) RxOnSocket() bool { return d.rxWaits.Load() == rxOnSocket }

// BusyPolled reports whether an application goroutine busy-polled the device within busyQuiet,
// or polled it since the receive loop last parked or came back from a wait on the socket longer
// than pollStale (for tests).
func (d *Device) BusyPolled() bool { return d.busyNow() || d.polled.Load() }

// busyNow reports whether an application's goroutine busy-polled the device within busyQuiet
// (0: never, or not since EndBusy).
func (d *Device) busyNow() bool {
	at := d.busyAt.Load()
	return at != 0 && monoNow()-at < int64(busyQuiet)
}

// monoStart and monoNow are a monotonic clock for busyAt, which a step of the wall clock must
// not move. (In a synctest bubble time has no monotonic reading, and monoNow is far below 0:
// busyAt's 0 still means never.)
var monoStart = time.Now()

func monoNow() int64 { return int64(time.Since(monoStart)) }

// NeverPark keeps the receive loop waiting on the socket beside a busy poller instead of parking
// (rxOrdered): for a device whose applications can sleep where the device does not see it, as C
// programs do in ibv_get_cq_event (uverbs.NewDevice). Call it before the device is used.
func (d *Device) NeverPark() { d.noPark.Store(true) }

// BeginSleep and EndSleep bracket an application goroutine's sleep until a completion event
// (verbs' CompChannel.GetCQEvent): while one sleeps, the receive loop does not park, whatever
// other goroutines poll, since the sleeper's completion comes only from the loop.
//
// The sleeper may also have been what kept another device's receive loop parked: a goroutine
// that drives two devices (softefa demo plays both ends) polls one's CQ, finds a completion
// (Polled), and then waits on the other's, whose completion needs the first device to read its
// socket. So a sleep ends the park of every device of the process polled since the last sleep
// (polledSince, EndBusy); a device still polled by another goroutine parks again once its loop
// finds that goroutine's polls.
func (d *Device) BeginSleep() {
	d.sleepers.Add(1)
	polledSince.endBusy()
	d.EndBusy() // (its own loop too, should a poll that joins it race the walk)
}

// polledSince holds the devices of the process that an application goroutine polled since the
// last sleep on a completion channel (BeginSleep): a device joins when its polled mark is set,
// and leaves when a sleep ends its park or it closes. A loop parks only on polled or on busyAt,
// and markBusy sets polled too, so every parked loop's device is here once the poll that parked
// it has returned; a sleep walks only them, not every device of the process (the bench's
// many-peers workload holds 10,000).
var polledSince devices

// devices is a set of devices, each marked while it is in (Device.marked).
type devices struct {
	mu   sync.Mutex
	list []*Device
}

// add puts d in the set, unless it is there or closed.
func (s *devices) add(d *Device) {
	s.mu.Lock()
	if !d.marked.Load() && !d.closing() {
		d.marked.Store(true)
		s.list = append(s.list, d)
	}
	s.mu.Unlock()
}

// remove takes d out of the set.
func (s *devices) remove(d *Device) {
	s.mu.Lock()
	if d.marked.Load() {
		d.marked.Store(false)
		if i := slices.Index(s.list, d); i >= 0 {
			s.list = slices.Delete(s.list, i, i+1)
		}
	}
	s.mu.Unlock()
}

// endBusy empties the set, ending each device's park (Device.EndBusy). A device leaves before its
// park ends: a poll between the two finds polled still set and adds nothing, and the park's end
// clears polled, then busyAt; a poll after both adds the device again.
func (s *devices) endBusy() {
	s.mu.Lock()
	list := s.list
	s.list = s.list[:0]
	for _, d := range list {
		d.marked.Store(false)
		d.EndBusy()
	}
	clear(list)
	s.mu.Unlock()
}

// closing reports whether Close has begun.
func (d *Device) closing() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// EndSleep ends what BeginSleep began.
func (d *Device) EndSleep() { d.sleepers.Add(-1) }

// EndBusy notes that the application stops polling (it arms a CQ, or sleeps until a completion
// event): the receive loop waits on the socket again at once instead of at the end of its park
// (rxOrdered).
func (d *Device) EndBusy() {
	if d.busyRx == nil {
		return
	}
	// polled before busyAt: a busy poll racing a sleep's walk (markBusy stores busyAt, then
	// loads polled) either finds polled cleared and joins polledSince again, or stored busyAt
	// before this clears it.
	d.polled.Store(false)
	d.busyAt.Store(0)
	select {
	case d.rxResume <- struct{}{}:
	default:
	}
}

// mayPark reports whether the receive loop may park beside a busy poller: with more than one Go
// processor (with one, no thread waits to be woken), not for a device that never parks
// (NeverPark), and not while a goroutine sleeps until a completion event (BeginSleep).
func (d *Device) mayPark() bool {
	return spinnable() && !d.noPark.Load() && d.sleepers.Load() == 0
}

// parkedRx reports whether the receive loop parks beside a busy poller.
func (d *Device) parkedRx() bool { return d.rxWaits.Load() == rxParked }

// What the receive loop waits for (Device.rxWaits).
const (
	rxRunning = iota
	rxParked
	rxOnSocket
)

// busyPark is how long, in nanoseconds, the receive loop parks beside a busy poller before it
// reads the socket once and looks again: a millisecond (a variable for the tests).
var busyPark atomic.Int64

// pollStale is how long, in nanoseconds, the receive loop may wait on the socket and still take
// a poll made before or during the wait as polling now (Device.polled): a park's length (a
// variable for the tests).
var pollStale atomic.Int64

func init() {
	busyPark.Store(int64(time.Millisecond))
	pollStale.Store(int64(time.Millisecond))
}

// pollNetwork is PollNetwork; lazy leaves the batch's ACKs owed (for up to AckDelay, so that the
// application's answer can carry them), otherwise they go at once, as the receive loop's do.
func (d *Device) pollNetwork(lazy bool) bool {
	got, _ := d.readNetwork(lazy)
	return got
}

// timerRead is the engine loop's read before its timer's tick (no busy poll: PollNetwork). While
// another reader holds the inbox it waits for it, then for busyMu: the holder, which has read and
// hands its batch over, may be off its core, with ACKs of packets the tick would count lost
// arriving meanwhile. The busy polls never wait for the inbox, and take busyMu first, with
// TryLock, so the timer's wait for busyMu while it holds the inbox blocks no one who holds busyMu.
// It reports false, having read nothing, when the device closed while it waited.
func (d *Device) timerRead() bool {
	b := d.busyRx
	if b == nil {
		return true
	}
	var in *scratch
	select {
	case in = <-b.inbox:
	default:
		if b.made.CompareAndSwap(false, true) {
			in = makeScratch(d)
			b.bytes.Add(int64(in.counted))
			break
		}
		select {
		case in = <-b.inbox: // (a reader gives it back once its batch is sent)
		case <-d.done:
			return false
		}
	}
	d.busyMu.Lock()
	d.readInput(in.Inbox, true)
	b.done(in)
	return true
}

// readNetwork is pollNetwork, which also reports whether its read may have left datagrams behind
// (readInput). It reads nothing while another reader holds busyMu or the inbox (busyPoll), and
// then reports that datagrams may be left (got false, more true).
func (d *Device) readNetwork(lazy bool) (got, more bool) {
	if d.busyRx == nil {
		return false, false
	}
	if !d.busyMu.TryLock() {
		return false, true
	}
	in := d.takeInbox()
	if in == nil {
		return false, true
	}
	n, more, _ := d.readInput(in.Inbox, lazy)
	d.busyRx.done(in)
	return n > 0, more
}

// readInput is one read of the link by the holder of busyMu (a busy poll, or the receive loop:
// rxOrdered) into in, and the hand-over of what came to the transport. It lets go of busyMu once
// it holds the device lock, so that the next reader reads while this batch is handled, and
// handles its own batch after this one (it needs the device lock to hand it over). It returns
// how many datagrams came, and whether the read may have left some behind (link.Backlogger; a
// read that filled in.Pkts, for a poller that cannot tell).
func (d *Device) readInput(in *srd.Inbox, lazy bool) (n int, more bool, err error) {
	n, err = d.busyRx.poller.TryReceive(in.Pkts)
	if n == 0 || err != nil {
		d.busyMu.Unlock()
		d.flushOwed(in.Out, srd.AckDelay) // nothing came: the ACKs the last poll left owed may be due
		return 0, false, err
	}
	if d.busyRx.backlog != nil {
		more = d.busyRx.backlog.Backlogged()
	} else {
		more = n == len(in.Pkts)
	}
	d.mu.Lock()
	d.busyMu.Unlock()
	closed := d.closed
	d.unlockAfter(in.Out, func(now time.Duration) {
		if !closed {
			d.srd.Input(now, in, n, lazy)
		}
	})
	if closed {
		return 0, false, link.ErrClosed
	}
	d.wakeAfterInput()
	return n, more, nil
}

// rxOrdered is the receive goroutine of a link it can wait on without reading (link.ReadWaiter):
// it waits for datagrams, then reads and handles them as a busy poller does, holding busyMu from
// the read until it holds the device lock (readInput). It waits only after a read that found
// nothing: a read may leave datagrams in the poller's own buffers (the rest of a GRO run), which
// no wait on the socket would see. Reading beside the busy pollers, each into buffers of its
// own (GRO hands a run out over several reads), the receive loop could hand the transport an
// earlier batch after a poller had handed it a later one, whose ACK then told the sender that
// later packets came before earlier ones had: losses that were not (a bandwidth run between
// two processes: 62 and 136 batches out of order).
//
// While an application's goroutine busy-polls the device, the loop does not wait on the socket
// but parks (busyPark at a time, then one read; mayPark), as NAPI's busy polling keeps a NIC's
// interrupts off: the poller reads every datagram itself, and a loop woken for each would take a
// thread from the busy poller's core, or its peer's, for nothing (docs/architecture.md,
// "Goroutines"). The application's arm of a CQ or its sleep on a completion channel ends the park
// (EndBusy).
func (d *Device) rxOrdered(w link.ReadWaiter) {
	in := d.srd.NewInbox()
	var last time.Time               // when the last datagram came
	more := false                    // the last read got datagrams: read again before waiting
	woke, looked := false, false     // it woke from a park (and looks); the last read ended the look
	_, spins := d.link.(link.Poller) // as rxLoop: a link that is no Poller is never spun on
	park := d.park
	for {
		// The loop parks where it would wait (after a read that found nothing, or after its
		// look, whatever the look found; a look goes on while its reads leave datagrams
		// behind) while the application polls: it went to read the socket within busyQuiet
		// (busyNow), or it polled at all since the loop last parked or came back from a wait
		// on the socket longer than pollStale (polled; EndBusy, its arm or sleep, clears that
		// too). In a
		// stream every look finds datagrams, a sender whose polls find the completions the
		// loop made never reads the socket itself, and between two polls a poller may post
		// for longer than busyQuiet. A loop that read on beside the poller was a second
		// thread spinning for the device.
		wouldWait := !more || looked
		busy := d.busyNow() || wouldWait && d.polled.Load()
		spin := spins && d.cfg.RxSpin > 0 && time.Since(last) < d.cfg.RxSpin && !busy
		if !spin && wouldWait && busy && d.mayPark() {
			d.polled.Store(false)
			park.Reset(time.Duration(busyPark.Load()))
			d.rxWaits.Store(rxParked)
			select {
			case <-d.rxResume:
			case <-park.C:
			case <-d.done:
				return
			}
			d.rxWaits.Store(rxRunning)
			park.Stop()
			// One read (the look) before the socket is waited on: the poller may have stopped.
			more, woke, looked = true, true, false
			continue
		}
		if !spin && !more {
			if !d.mayPark() {
				// Where the loop may not park, a poll keeps it from spinning until it waits.
				d.polled.Store(false)
			}
			d.rxWaits.Store(rxOnSocket)
			waited := time.Now()
			err := w.WaitReadable()
			d.rxWaits.Store(rxRunning)
			if time.Since(waited) > time.Duration(pollStale.Load()) {
				d.polled.Store(false) // a poll during a long wait is no busy polling beside the loop
			}
			if err != nil {
				if d.stopping(err) {
					return
				}
				continue
			}
		}
		d.busyMu.Lock()
		n, backlog, err := d.readInput(in, false)
		got := n > 0
		// A look that left datagrams behind (it filled its batch, or GRO's run holds more)
		// goes on: more waited than one read takes, and the loop reads on while its reads
		// leave some, whoever polls (a poller whose CQ never runs dry never reads the socket),
		// then parks again; reading on until a read found nothing, in a stream, it would
		// never park.
		more, looked, woke = got, woke && !backlog, woke && backlog
		switch {
		case err != nil:
			if d.stopping(err) {
				return
			}
		case got:
			if spinnable() {
				last = time.Now()
			}
		case spin:
			t := time.Now()
			runtime.Gosched()
			if time.Since(t) > spinYield {
				last = time.Time{} // others wait for the processor: wait in the network poller
			}
		}
	}
}

// stopping reports whether a receive error means the device is closing.
func (d *Device) stopping(err error) bool { return d.closing() || err == link.ErrClosed }

// rxLoop is the receive goroutine: it reads batches from the link and has the transport handle
// them under the device lock, then sends the ACKs and frames the batch produced.
func (d *Device) rxLoop() {
	defer d.wg.Done()
	if w, ok := d.link.(link.ReadWaiter); ok && d.busyRx != nil {
		d.rxOrdered(w)
		return
	}
	rx := d.srd.NewInbox()
	pkts, q := rx.Pkts, rx.Out
	poller, _ := d.link.(link.Poller)
	var last time.Time // when the last datagram came
	for {
		var n int
		var err error
		if poller != nil && d.cfg.RxSpin > 0 && time.Since(last) < d.cfg.RxSpin {
			if n, err = poller.TryReceive(pkts); n == 0 && err == nil {
				t := time.Now()
				runtime.Gosched()
				if time.Since(t) > spinYield {
					// Other goroutines were waiting for the processor: spinning takes it from
					// them. Wait in the network poller until the next traffic.
					last = time.Time{}
				}
				continue
			}
		} else {
			n, err = d.link.Receive(pkts)
		}
		if err != nil {
			select {
			case <-d.done:
				return
			default:
			}
			if err == link.ErrClosed {
				return
			}
			continue
		}
		if spinnable() {
			last = time.Now()
		}
		d.locked(q, func(now time.Duration) { d.srd.Input(now, rx, n, false) })
		d.wakeAfterInput()
	}
}

// wakeAfterInput wakes the engine loop after a batch of datagrams unless its timer already ticks
// every PollMin: what a batch can leave to it (parked RNR retries, owed ACKs, packets in flight)
// waits for the timer, not for a step now. Waking it for every batch cost a thread wake-up a
// datagram (a ping-pong between two processes on 2 vCPUs spent a tenth of its CPU switching).
func (d *Device) wakeAfterInput() {
	if !d.fastPoll.Load() {
		// Traffic after a quiet spell: the timer ticks again (at least once), as after an
		// inline post, so that what only ticks do (forgetting idle peers, probing paths) runs
		// while the device is in use.
		d.inlined.Store(true)
		d.wake()
	}
}

// busyQuiet: the receive loop spins only when no goroutine has busy-polled for this long.
const busyQuiet = 50 * time.Microsecond

// spinnable reports whether the receive loop may spin after traffic (config.Device.RxSpin): not
// on Go's only processor. A goroutine that yields with runtime.Gosched there is run again at once
// whenever no other goroutine is runnable, and the network poller is not asked meanwhile: every
// goroutine waiting for the network (another device's receive loop, the application's own
// sockets) waited for the spin to end (TestReceiveLoopLeavesTheOnlyProcessor).
func spinnable() bool { return runtime.GOMAXPROCS(0) > 1 }

// spinYield: a yield longer than this ends the receive loop's spin.
const spinYield = 40 * time.Microsecond

// locked takes the device lock and does work as one batch of the device's work (unlockAfter).
func (d *Device) locked(q *srd.Queue, work func(now time.Duration)) {
	d.mu.Lock()
	d.unlockAfter(q, work)
}

// unlockAfter does work as one batch of the device's work, then releases the device lock, which
// the caller holds. work is given the clock, read once for the whole batch (not once per packet),
// and the transport's frames go into q, the caller's own queue (nil without a link), whose
// datagrams are sent once the lock is released: no lock of the device is held across the system
// call.
func (d *Device) unlockAfter(q *srd.Queue, work func(now time.Duration)) {
	if d.srd != nil {
		d.srd.Use(q)
	}
	work(d.clock())
	if d.srd != nil {
		d.srd.Hold(q) // (the batches' datagrams go out in the batches' order)
	}
	d.mu.Unlock()
	if d.srd != nil {
		d.srd.Flush(q)
	}
}

// newQueue makes a datagram queue for a goroutine that works for the device (nil without a
// link: nothing is ever sent).
func (d *Device) newQueue() *srd.Queue {
	if d.srd == nil {
		return nil
	}
	return d.srd.NewQueue()
}

// clock is the device's monotonic time, as a duration since it started.
func (d *Device) clock() time.Duration {
	if d.cfg.Clock != nil {
		return d.cfg.Clock()
	}
	return time.Since(d.start)
}
