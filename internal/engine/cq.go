package engine

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/uapi"
)

// CQ is a completion queue: a ring of 32-byte CQEs the engine produces into and a doorbell word
// through which the consumer reports how many it has polled and arms completion events.
//
// Each entry is written body first; then its header word (req_id, status, flags with the phase
// bit) is stored atomically. The phase starts at 1 and flips each time the producer wraps.
type CQ struct {
	d     *Device
	ring  []byte
	depth uint32 // entries, a power of two
	esz   int    // bytes per entry: 32, or 16 for a CQ without source GIDs
	db    *uint32
	flags int

	pc      uint16 // CQEs produced, modulo 2^16
	phase   uint8
	unpaced bool   // CQInit.Unpaced: the doorbell's consumer count is not read for overrun
	refs    int    // QPs using this CQ
	overrun bool   // sticky: an entry was lost because the ring was full
	armed   bool   // latched by ArmCQ
	firedSN int    // cmd_sn of the doorbell that armed the last event
	recheck bool   // on Device.recheck: an entry was written without an event…
	rechkAt uint64 // …the latest during the tick of this number (Device.ticks)
	notify  func()
	owner   any
	dead    bool
	waiter  *RecvWaiter // OnRecv's, until its receive comes or it is withdrawn
}

// Owner returns the value given as CQInit.Owner; nil for a nil CQ.
func (cq *CQ) Owner() any {
	if cq == nil {
		return nil
	}
	return cq.owner
}

// Ring returns the CQ's ring memory.
func (cq *CQ) Ring() []byte { return cq.ring }

// Depth returns the number of entries.
func (cq *CQ) Depth() int { return int(cq.depth) }

// Doorbell returns the CQ doorbell word.
func (cq *CQ) Doorbell() *uint32 { return cq.db }

// Flags returns the creation flags (uapi.CQFlag*).
func (cq *CQ) Flags() int { return cq.flags }

// CQInit describes a CQ to create. Ring and Doorbell may name memory the caller owns (a shared
// mapping, say); left nil, the device allocates them.
type CQInit struct {
	Entries  int
	Flags    int    // uapi.CQFlag*
	Owner    any    // returned by Owner, for the provider's own bookkeeping
	Notify   func() // called, under the device lock and without blocking, when an armed CQ gets an entry
	Ring     []byte
	Doorbell *uint32

	// Unpaced makes the device write every entry as EFA hardware does, without comparing its
	// producer count with the consumer count in the doorbell: no overrun detection, and an
	// application that lets the producer lap it loses entries unnoticed. For consumers that do
	// not report every poll in the doorbell (libefa 44's extended-CQ polling never writes it;
	// docs/cabi.md, "Completion queues"). Left false, the CQ drops an entry when the ring is a
	// whole lap ahead of the doorbell's count (docs/descriptors.md).
	Unpaced bool

	// EntrySize is the CQE size: 0 or efaio.RxCQEExSize (32), or efaio.RxCQESize (16), which
	// libefa 44 asks for when the CQ has no source GIDs; a 16-byte RX CQE has no src_addr.
	EntrySize int
}

// CreateCQ creates a CQ of Entries rounded up to a power of two. EINVAL for 0 or more than
// MaxCQE entries, or caller memory too small; EOPNOTSUPP for unknown flags; ENOMEM past MaxCQ.
func (d *Device) CreateCQ(in CQInit) (*CQ, error) {
	const known = uapi.CQFlagWithCompletionChannel | uapi.CQFlagWithSGID | uapi.CQFlagSQ64BitReqID
	switch {
	case in.Entries < 1 || in.Entries > d.cfg.MaxCQE:
		return nil, fmt.Errorf("engine: %d CQ entries outside [1, %d]: %w", in.Entries, d.cfg.MaxCQE, syscall.EINVAL)
	case in.Flags&^known != 0:
		return nil, fmt.Errorf("engine: CQ flags %#x: %w", in.Flags, syscall.EOPNOTSUPP)
	case in.Flags&uapi.CQFlagWithSGID != 0 && d.cfg.Caps&uapi.CapCQWithSGID == 0:
		return nil, fmt.Errorf("engine: CQ with SGID not supported: %w", syscall.EOPNOTSUPP)
	}
	esz := in.EntrySize
	if esz == 0 {
		esz = efaio.CQESize
	}
	if esz != efaio.RxCQEExSize && (esz != efaio.RxCQESize || in.Flags&uapi.CQFlagWithSGID != 0) {
		return nil, fmt.Errorf("engine: CQ entries of %d bytes: %w", esz, syscall.EINVAL)
	}
	depth := roundUpPow2(uint32(in.Entries))
	ring, db := in.Ring, in.Doorbell
	if ring == nil {
		ring = allocRing(int(depth) * esz)
	}
	if db == nil {
		db = new(uint32)
	}
	if len(ring) < int(depth)*esz || !aligned4(ring) {
		return nil, fmt.Errorf("engine: CQ ring of %d bytes for %d entries: %w", len(ring), depth, syscall.EINVAL)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if d.nCQ >= d.cfg.MaxCQ {
		return nil, fmt.Errorf("engine: %d CQs, the device maximum: %w", d.nCQ, syscall.ENOMEM)
	}
	clear(ring)
	atomic.StoreUint32(db, 0)
	d.nCQ++
	return &CQ{d: d, ring: ring, depth: depth, esz: esz, db: db, flags: in.Flags, phase: 1, unpaced: in.Unpaced, firedSN: -1, notify: in.Notify, owner: in.Owner}, nil
}

// DestroyCQ frees cq; EBUSY while a QP uses it.
func (d *Device) DestroyCQ(cq *CQ) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cq.dead {
		return fmt.Errorf("engine: CQ already destroyed: %w", syscall.EINVAL)
	}
	if cq.refs > 0 {
		return fmt.Errorf("engine: CQ still used by %d QPs: %w", cq.refs, syscall.EBUSY)
	}
	cq.dead = true
	d.nCQ--
	return nil
}

// ArmCQ latches a completion-event request the consumer stored in the doorbell (arm bit and
// cmd_sn): the next entry written raises one event, unless an event was already raised for this
// cmd_sn. A doorbell store with the arm bit is also noticed without ArmCQ when the engine next
// writes an entry, as long as the bit is still there.
//
// Entries the consumer has not polled when it arms (the doorbell's consumer count is behind the
// entries written) raise the event at once: the arm doorbell carries the consumer count for this.
func (d *Device) ArmCQ(cq *CQ) {
	d.EndBusy() // the consumer is about to sleep: the receive loop takes over the socket
	d.mu.Lock()
	defer d.mu.Unlock()
	cq.checkArm()
}

// Written is how many entries the CQ has written (modulo 2^16), each whole when counted (for
// tests that must not poll). It takes the device lock.
func (cq *CQ) Written() uint32 {
	cq.d.mu.Lock()
	defer cq.d.mu.Unlock()
	return uint32(cq.pc)
}

// checkArm reads the doorbell and latches the arm it shows; entries written and not yet polled
// raise the armed event at once. Called with the device's lock held.
func (cq *CQ) checkArm() {
	if cq.dead {
		return
	}
	v := atomic.LoadUint32(cq.db)
	cq.latchArm(v)
	if cq.armed && uint16(v&efaio.CQDoorbellCIMask) != cq.pc {
		cq.fire(v)
	}
}

// latchArm latches the arm that the doorbell v shows. The doorbell is memory, not a register the
// device sees every store to: a consumer that stores it itself can overwrite its arm before the
// engine reads it (libfabric 2.x's direct data path arms with one store and reports its next poll
// with another, without the arm bit, and its efa fabric's fi_cq_sread then waits for an event
// that never came). cmd_sn tells the two apart: a consumer moves it only by taking an event, and
// one that takes events arms again before it waits for the next, so after the first event a
// cmd_sn other than the last event's counts as an arm even with the bit clear. The first arm is
// read while its bit is still set: the consumer stores the doorbell again only when it polls an
// entry, after the engine wrote one and read the doorbell.
func (cq *CQ) latchArm(v uint32) {
	sn := int(v >> efaio.CQDoorbellSNShift & 3)
	if sn != cq.firedSN && (v&efaio.CQDoorbellArm != 0 || cq.firedSN >= 0) {
		cq.armed = true
	}
}

// Overrun reports whether the CQ lost an entry because it was full.
func (cq *CQ) Overrun() bool {
	cq.d.mu.Lock()
	defer cq.d.mu.Unlock()
	return cq.overrun
}

// A RecvWaiter is told of a QP's next receive (QP.OnRecv). It is for a consumer in another
// process: the host device answers a program's thread, which sleeps meanwhile instead of spinning
// on its ring, from the goroutine that completes the receive, with no goroutine woken between
// (docs/architecture.md, "Doorbells on the host device").
type RecvWaiter struct {
	// Fn runs once the receive is counted, on the goroutine that counts it and with the
	// device's lock held: it must not block or call into the device. by is what the Device.RingBy
	// whose work counted the receive was given, on its goroutine; nil when the receive was
	// counted by other work (the engine loop, a receive loop).
	Fn func(by any)
	q  *QP
	cq *CQ // the CQ it waits on; nil when it waits on none (guarded by the device's lock)
}

// OnRecv has w told (w.Fn run) when q completes a receive past seen (its Recvs count), or when q
// is destroyed first. It registers nothing and reports false when that receive has come already,
// when q is destroyed or has no receive CQ, when w is registered already (for its earlier
// receive), or when another waiter waits on q's receive CQ: one at a time, as one program thread
// sleeps on a CQ. Device.Withdraw takes w back before it is told.
func (q *QP) OnRecv(seen uint64, w *RecvWaiter) bool {
	d := q.d
	d.mu.Lock()
	defer d.mu.Unlock()
	cq := q.recvCQ
	if q.dead || cq == nil || cq.dead || cq.waiter != nil || w.cq != nil || q.recvs.Load() != seen {
		return false
	}
	w.q, w.cq = q, cq
	cq.waiter = w
	return true
}

// Withdraw takes w back from the CQ it waits on, and reports whether it was waiting: false when
// it was told first (w.Fn has run: it runs under the lock Withdraw takes) or never waited. d must
// be the device of the QP w waits on.
func (d *Device) Withdraw(w *RecvWaiter) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w.cq == nil {
		return false
	}
	w.cq.waiter, w.cq, w.q = nil, nil, nil
	return true
}

// countRecv counts a receive WR of q completed, with d.mu held (its entry written first: a
// program told of the receive finds the entry), and tells the RecvWaiter waiting for it. A
// receive WR that an RDMA write with immediate took counts too, with no bytes.
func (q *QP) countRecv(length uint64) {
	q.counts.RecvBytes += length
	q.recvs.Add(1)
	if cq := q.recvCQ; cq != nil && cq.waiter != nil && cq.waiter.q == q {
		w := cq.waiter
		cq.waiter, w.cq, w.q = nil, nil, nil
		w.Fn(q.d.ringBy)
	}
}

// post writes c into the next slot. Unless the CQ is unpaced, a full ring (the consumer's count
// from the doorbell is a whole ring behind) loses the entry: the CQ is marked overrun and a
// CQ_ERR event is raised, as rdmavt's rvt_cq_enter does.
func (cq *CQ) post(c *efaio.Completion) {
	v := atomic.LoadUint32(cq.db)
	if !cq.unpaced && (cq.overrun || uint32(cq.pc-uint16(v&efaio.CQDoorbellCIMask)) >= cq.depth) {
		if !cq.overrun {
			cq.overrun = true
			cq.d.raise(AsyncEvent{Type: uapi.EventCQErr, CQ: cq})
		}
		cq.d.counts.CQOverruns.Add(1)
		return
	}
	c.Phase = cq.phase
	slot := efaio.CQE(cq.ring[int(uint32(cq.pc)&(cq.depth-1))*cq.esz:][:cq.esz])
	slot.EncodeBody(c)
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&slot[0])), efaio.HeaderWord(c))
	cq.pc++
	if uint32(cq.pc)&(cq.depth-1) == 0 {
		cq.phase ^= 1
	}
	// The arm is read after the entry is stored, not before: a consumer that armed between the
	// read above and the store polled the ring before the entry was there and waits for an event
	// (libfabric 2.6's fi_cq_sread: arm, poll once more, wait; docs/cabi.md, "Events").
	v = atomic.LoadUint32(cq.db)
	cq.latchArm(v)
	if cq.armed {
		cq.fire(v)
		return
	}
	// Even so, the consumer's arm, a plain store to ordinary memory, may sit in its CPU's store
	// buffer while its own poll of the ring reads ahead of it (x86 lets a load pass an earlier
	// store; a device's doorbell register would not), and the read just made miss it. The
	// engine loop's next tick reads the doorbell once more (Device.recheckArms).
	if d := cq.d; cq.notify != nil {
		cq.rechkAt = d.ticks.Load() // the latest entry's tick
		if !cq.recheck {
			cq.recheck = true
			d.recheck = append(d.recheck, cq)
			if len(d.recheck) == 1 && !d.fastPoll.Load() {
				d.wake() // the loop's timer may be stopped: it restarts it, for the list's sake
			}
		}
	}
}

// fire raises the completion event an arm asked for; v is the doorbell that armed it.
func (cq *CQ) fire(v uint32) {
	cq.armed = false
	cq.firedSN = int(v >> efaio.CQDoorbellSNShift & 3)
	if cq.notify != nil {
		cq.notify()
	}
}

func roundUpPow2(n uint32) uint32 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len32(n-1)
}

// allocRing returns n zeroed bytes aligned to 8 bytes, so that header and doorbell words can be
// accessed atomically.
func allocRing(n int) []byte {
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), n)
}

func aligned4(b []byte) bool { return len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%4 == 0 }
