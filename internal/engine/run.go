package engine

import (
	"sync/atomic"
	"time"
)

// Ring tells the engine that the producer stored a new value into one of q's doorbells, so that
// it looks at q at once. Safe from any goroutine; it does not block.
func (d *Device) Ring(q *QP) {
	if q.kicked.CompareAndSwap(false, true) {
		d.pending.push(q)
	}
	d.wake()
}

func (d *Device) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// run is the engine loop: the one goroutine that consumes rings. It wakes on Ring, and on a timer
// that polls every doorbell: every PollMin while there is work, backing off to PollMax when idle,
// and not at all while the device has no QP.
func (d *Device) run() {
	defer d.wg.Done()
	period := d.cfg.PollMin
	timer := time.NewTimer(period)
	defer timer.Stop()
	armed := true
	var batch []*QP
	q := newTxq(d.maxDatagram(), 64)
	for {
		polled := false
		select {
		case <-d.done:
			return
		case <-d.kick:
		case <-timer.C:
			polled = true
		}
		d.mu.Lock()
		d.useTx(q)
		batch = d.pending.drain(batch)
		worked, busy := d.step(batch, polled)
		idle := len(d.qpList) == 0 && len(d.peers) == 0
		d.mu.Unlock()
		d.sendTx(q)
		switch {
		case worked || busy:
			period = d.cfg.PollMin
		case polled:
			period = min(2*period, d.cfg.PollMax)
		}
		if polled {
			armed = false
		}
		switch {
		case idle && armed:
			timer.Stop()
			armed = false
		case !idle && (!armed || worked):
			timer.Reset(period)
			armed = true
		}
	}
}

// step processes the QPs handed over by Ring and, when polled, every QP's doorbells; then it
// retries sends parked after RNR. It reports whether any entry was consumed and whether parked
// work remains. Called with d.mu held.
func (d *Device) step(batch []*QP, polled bool) (worked, busy bool) {
	now := time.Now()
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
	}
	for _, q := range d.qpList {
		d.retryParked(q, rqMoved, now)
		if len(q.parked) > 0 {
			busy = true
		}
	}
	if polled && d.transportTick(d.clock()) {
		busy = true
	}
	return worked || rqMoved, busy
}
