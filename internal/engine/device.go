// Package engine is the software EFA device: the "NIC" behind the rings. It owns the device's
// object tables (QP numbers, PDs, memory keys, CQs, AHs), consumes the work-queue entries a
// provider writes into SQ and RQ rings, carries out each operation, and writes completions with
// phase bits into CQ rings. Its control calls are what EFA's kernel driver does for uverbs
// commands, with the kernel's checks and errnos; the libefa-level checks live in package verbs.
// Messages to other devices go through the SRD transport (package srd), which the device meets
// in host.go: requests go down with their send WR as owner, and arriving data, read requests and
// outcomes come up through srd.Host.
//
// # Ownership and locking
//
// Everything the device owns — its tables, each queue's consumer index and phase, each CQ's
// producer index and phase, parked RNR retries, its transport (srd.Transport) — is guarded by
// Device.mu, and whoever holds mu does the device's work: the engine loop (run: Ring's fallback
// and the timers), the receive loop (rxLoop: arrivals), a poster that finds the device free
// (ringInline, taking mu with TryLock so that it never waits), an application polling an empty CQ
// (PollNetwork), or, for a driven device with no goroutines of its own, the owner (Drive). Each
// holder does its work as one batch (locked, or unlockAfter once it has taken mu with TryLock):
// the clock is read once for the batch and passed to each call that needs it, the transport
// builds datagrams into the holder's own queue, and they are sent after mu is let go: no lock of
// the device is held across a system call. Control calls (create, modify, destroy) take mu too,
// so they see the device between batches.
// docs/architecture.md has the whole table of owners.
//
// The provider owns the other side of each ring: it writes entries and stores the producer
// counter into the doorbell word with an atomic store; it reads CQEs after an atomic load of the
// entry's header word, and stores its consumer count into the CQ doorbell. Ring makes the engine
// look at once, and is what package verbs calls after every doorbell store; a doorbell store alone
// is noticed by the engine's polling of doorbells (within PollMax) for the QPs whose rings were
// handed out for raw use (QP.PollDoorbells).
//
// Memory regions are Go byte slices; the engine reads and writes them only inside the slice
// registered, after checking key, protection domain, bounds and access.
package engine

import (
	"crypto/rand"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/qpn"
	"github.com/softefa/softefa/internal/seal"
	"github.com/softefa/softefa/internal/srd"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link"
)

// Device is one software EFA device.
type Device struct {
	cfg config.Device
	gid [16]byte

	mu     sync.Mutex // guards everything below and all object state; see the package doc
	qpns   *qpn.Table
	qps    map[uint32]*QP
	qpList []*QP
	// polledQPs counts the live QPs whose doorbells may be stored without Ring (PollDoorbells):
	// while there are any, the engine loop keeps polling doorbells.
	polledQPs int
	// recheck lists the CQs with a completion channel that got an entry without raising an
	// event, for a later tick of the loop to read their doorbells again (recheckArms).
	recheck []*CQ
	// ticks counts the engine loop's timer ticks (a busy poller's too: tickIfDue; and Drive's
	// steps), each counted before it takes anything from the network: an entry it writes is
	// rechecked by the next one.
	ticks  atomic.Uint64
	nCQ    int
	nPD    int
	pdNext uint16
	pds    map[uint16]*PD
	mrs    mrTable
	nAH    int
	// foreign is set once a foreign region has been registered: from then on, copies of
	// application memory are guarded against faults (copyMem), also after the region is
	// deregistered, since a read response or a message received in part may still hold slices
	// of it.
	foreign bool
	bounce  []byte // same-device messages from another process's memory pass through it (placeSpan)
	// receiving lists the messages from the network accepted and received in part (inbound.idx):
	// a flush, reset or destroy of their QP, or a deregistration of their buffers, ends them.
	receiving []*inbound
	events    []AsyncEvent
	closed    bool
	counts    Counters
	retired   QPCounters   // the destroyed QPs' counts, summed (WRCounts)
	pending   pendingQueue // QPs whose doorbells a provider rang (own lock)

	// SRD over the link (package srd); nil without a link: the device reaches only itself.
	link    link.Link
	srd     *srd.Transport
	start   time.Time
	freeIn  []*inbound
	freeWRs []*sendWR

	txqs    chan *srd.Queue // free list of datagram queues for posters working inline (ringInline)
	inlineQ [1]*QP          // ringInline's batch of one, under mu
	ringBy  any             // RingBy's by while ringInline works, under mu (countRecv)
	inlined atomic.Bool     // set after work outside the engine loop (ringInline, a batch of input), for it to poll fast
	// parkedSends: some QP holds sends parked after RNR (set when one parks, recomputed by each
	// step; under mu). Only then does a receive posted on this device need a step (RecvsWanted).
	parkedSends atomic.Bool
	whole       inbound     // respond's scratch, for a message that comes whole (under mu)
	loopSeg     uint64      // a same-device message's bytes a datagram, as counted (countLoopback)
	loopHdr     uint64      // and each datagram's other bytes
	fastPoll    atomic.Bool // the engine loop polls every PollMin
	// tickAt is the time since the device started (sinceStart) of the last tick, the engine
	// loop's or a busy poller's (claimTick); tick is the engine loop's timer, which a busy
	// poller's tick pushes on (tickIfDue).
	tickAt atomic.Int64
	tick   *time.Timer

	drv *driver // config.Device.Driven: the state Drive reuses; nil otherwise

	busyMu sync.Mutex   // the link's receiver, held by its reader (PollNetwork, readInput)
	busyAt atomic.Int64 // monoNow() of an application goroutine's last busy poll (markBusy)
	polled atomic.Bool  // an application goroutine polled lately: the rules are rxOrdered's (Polled, markBusy)
	marked atomic.Bool  // the device is in polledSince (written under polledSince.mu)
	busyRx *busyPoll    // nil: the device cannot be busy-polled
	// rxResume (one slot) ends the receive loop's park beside a busy poller (EndBusy).
	rxResume chan struct{}
	park     *time.Timer  // the receive loop's park beside a busy poller, pushed on by the poller's ticks
	rxWaits  atomic.Int32 // what the receive loop waits for: rxRunning, rxParked, rxOnSocket (for the tests)
	noPark   atomic.Bool  // NeverPark
	sleepers atomic.Int32 // application goroutines between BeginSleep and EndSleep

	kick     chan struct{} // one slot: wakes the engine loop
	evNotify chan struct{} // one slot: an async event was queued
	done     chan struct{}
	wg       sync.WaitGroup
}

// ErrClosed is returned by calls on a closed device.
var ErrClosed = errors.New("engine: device closed")

// NewDevice creates a device from cfg and starts its engine loop.
func NewDevice(cfg config.Device) (*Device, error) {
	if err := cfg.Fill(); err != nil {
		return nil, err
	}
	tab, err := qpn.New(cfg.QPNTableSize, cfg.QPNReservedStart, cfg.QPNReservedEnd)
	if err != nil {
		return nil, err
	}
	rng := cfg.Rand
	if rng == nil {
		rng = rand.Reader
	}
	d := &Device{
		cfg:      cfg,
		gid:      GIDFromAddr(cfg.Addr),
		link:     cfg.Link,
		start:    time.Now(),
		qpns:     tab,
		qps:      make(map[uint32]*QP),
		pds:      make(map[uint16]*PD),
		kick:     make(chan struct{}, 1),
		txqs:     make(chan *srd.Queue, 8),
		evNotify: make(chan struct{}, 1),
		rxResume: make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
	if len(cfg.Key) > 0 {
		if err := seal.CheckKey(cfg.Key); err != nil {
			return nil, err
		}
	}
	inc := srd.NewIncarnation(rng)
	d.loopSeg = uint64(srd.SegSize(cfg.PathMTU, len(cfg.Key) > 0))
	d.loopHdr = wire.DatagramHeaderSize + wire.FrameHeaderSize + wire.DataHeaderSize
	if len(cfg.Key) > 0 {
		d.loopHdr += seal.Overhead
	}
	d.mrs.init(cfg.MaxMR, rng)
	if d.link != nil {
		d.gid = GIDFromAddr(d.link.LocalAddr())
		tcfg := cfg
		tcfg.Clock = d.clock // the transport stamps each packet it sends with a fresh reading
		if d.srd, err = srd.New(tcfg, d.link, inc, rng, (*host)(d), &d.counts.Counters); err != nil {
			return nil, err
		}
	}
	if cfg.Driven {
		d.drv = &driver{}
		if d.link != nil {
			d.drv.q = d.srd.NewQueue()
			d.drv.rx = d.srd.NewInbox()
			d.drv.poller = d.link.(link.Poller) // config.Fill checked
		}
		return d, nil
	}
	if d.link != nil {
		if b, ok := d.link.(link.BusyPoller); ok {
			p := b.NewPoller()
			d.busyRx = &busyPoll{poller: p, inbox: make(chan *scratch, 1)} // (made by the first reader)
			d.busyRx.backlog, _ = p.(link.Backlogger)
			d.park = time.NewTimer(time.Hour)
			d.park.Stop()
		}
		d.wg.Add(1)
		go d.rxLoop()
	}
	d.tick = time.NewTimer(cfg.PollMin)
	d.wg.Add(1)
	go d.run()
	return d, nil
}

// Close stops the engine loop and closes the link. Objects still open are left as they are;
// their memory is freed with the device.
func (d *Device) Close() error {
	closed := false
	q := d.takeTxq()
	d.locked(q, func(now time.Duration) {
		if closed = d.closed; !closed {
			d.flushAllAcks(now) // what a busy poll left owed goes now: the peers are waiting for it
			d.closed = true
		}
	})
	d.putTxq(q)
	if closed {
		return nil
	}
	close(d.done)
	polledSince.remove(d)
	lastPolled.CompareAndSwap(d, nil)
	if d.link != nil {
		d.link.Close()
	}
	d.wg.Wait()
	return nil
}

// FlushAcks sends now every acknowledgement a busy poll left owed (PollNetwork leaves them for
// the application's answer to carry, for up to srd.AckDelay). A process about to exit calls it:
// an owed ACK would die with the process, and the peer's send would then fail as unresponsive
// after its transport timeout although the message was delivered.
func (d *Device) FlushAcks() {
	q := d.takeTxq()
	d.locked(q, func(now time.Duration) {
		if !d.closed {
			d.flushAllAcks(now)
		}
	})
	d.putTxq(q)
}

// flushAllAcks has every owed ACK sent at now; the caller holds mu.
func (d *Device) flushAllAcks(now time.Duration) {
	if d.srd != nil && d.srd.AcksOwed() {
		d.srd.FlushAcks(now, 0)
	}
}

// Config returns the device's configuration with defaults filled in.
func (d *Device) Config() config.Device { return d.cfg }

// GID returns the device's 16-byte address.
func (d *Device) GID() [16]byte { return d.gid }

// GIDFromAddr and AddrFromGID are config's: the GID scheme of docs/wire.md.
var (
	GIDFromAddr = config.GIDFromAddr
	AddrFromGID = config.AddrFromGID
)

// Counters are the device's port counters, with EFA's names (efa_verbs.c port stats), but for
// those of work requests, which its QPs count (WRCounts).
type Counters struct {
	srd.Counters                       // the transport's
	RDMAReadWRErr, RDMAReadRespBytes   atomic.Uint64
	RDMAWriteWRErr, RDMAWriteRecvBytes atomic.Uint64
	CQOverruns                         atomic.Uint64
	EngineWakeups                      atomic.Uint64 // times the engine loop woke, by a kick or its timer (softefa's own)
}

// Counters returns the device's live counters.
func (d *Device) Counters() *Counters { return &d.counts }

// WRCounts returns the device's work-request counters (EFA's send_wrs, recv_bytes, rdma_read_wrs
// and the like): those of its QPs, live and destroyed, summed. Its WRErrors, which EFA does not
// count per device, are the send WRs completed with an error. It takes the device lock.
func (d *Device) WRCounts() QPCounters {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.retired
	for _, q := range d.qpList {
		qc := q.countsLocked()
		c.add(&qc)
	}
	return c
}

// PathStat is one path's scoreboard towards one peer.
type PathStat = srd.PathStat

// PathStats returns every peer's path scoreboards.
func (d *Device) PathStats() []PathStat {
	if d.srd == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.srd.PathStats()
}
