package verbs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/uapi"
)

// CQ is a completion queue (struct ibv_cq and ibv_cq_ex in one). Its ring holds 32-byte EFA
// completion entries that the device writes and Poll, or StartPoll/NextPoll/EndPoll, read by phase
// bit. Polling is safe from several goroutines: the CQ lock is held by Poll, and from StartPoll to
// EndPoll (unless the CQ was created single-threaded, when the caller serialises).
type CQ struct {
	ctx   *Context
	e     *engine.CQ
	ring  []byte
	mask  uint32
	db    *uint32
	depth int

	wcFlags     CreateCQWCFlags
	sgid        bool // efadv WITH_SGID
	unsolicited bool // efadv WITH_IS_UNSOLICITED
	single      bool
	channel     *CompChannel
	userCtx     any

	mu    sync.Mutex // guards the consumer state below, unless single
	cc    uint16     // CQEs consumed, modulo 2^16
	phase uint8      // expected phase of the entry at cc
	cur   efaio.Completion
	curUD bool // the current entry's QP is UD
	wrid  uint64
	bad   atomic.Uint64 // CQEs dropped as invalid
	// booked is the request-id books whose pool lock a Poll holds from one entry to the next
	// (put): a batch of completions of one QP's queue takes the lock once. nil outside a Poll,
	// and in a StartPoll session, whose caller may post between entries.
	booked   *wq
	bookedN  uint32 // WRs of booked completed in this batch, counted at once (unbook)
	batching bool   // a Poll is consuming entries: put may keep booked's lock

	polling atomic.Bool // a StartPoll session is open (the lock is held): EndPoll ends it

	graveMu sync.Mutex // guards graves: destroyed QPs' books, until their entries are consumed
	graves  []grave
	nGraves atomic.Int32

	cmdSN        atomic.Uint32 // bumped by every GetCQEvent, as libefa's cq_event does
	events, acks atomic.Uint64
}

// CQInitAttrEx describes an extended CQ (struct ibv_cq_init_attr_ex).
type CQInitAttrEx struct {
	CQE        int
	CQContext  any
	Channel    *CompChannel
	CompVector int
	WCFlags    CreateCQWCFlags
	CompMask   CQInitAttrMask
	Flags      CreateCQFlags
}

// CreateCQ creates a CQ of at least cqe entries (ibv_create_cq), rounded up to a power of two.
// compVector must be below the device's completion vectors (config.Device.CompVectors), else
// EINVAL.
func (c *Context) CreateCQ(cqe int, cqContext any, ch *CompChannel, compVector int) (*CQ, error) {
	return c.CreateCQEx(&CQInitAttrEx{CQE: cqe, CQContext: cqContext, Channel: ch, CompVector: compVector})
}

// CreateCQEx creates an extended CQ (ibv_create_cq_ex) with libefa's checks: EOPNOTSUPP for a
// comp_mask, wc_flags or flags EFA lacks; EINVAL for a nil attr, a parent domain (EFA CQs take
// none here), a completion vector outside [0, num_comp_vectors) or an entry count outside
// [1, max_cqe].
func (c *Context) CreateCQEx(attr *CQInitAttrEx) (*CQ, error) {
	return c.createCQ(attr, false, false)
}

func (c *Context) createCQ(attr *CQInitAttrEx, sgid, unsolicited bool) (*CQ, error) {
	switch {
	case c == nil || attr == nil:
		return nil, fmt.Errorf("verbs: create CQ with a nil context or attributes: %w", syscall.EINVAL)
	case attr.CompMask&^(CQInitAttrPD|CQInitAttrFlags) != 0:
		return nil, fmt.Errorf("verbs: CQ comp_mask %#x: %w", attr.CompMask, syscall.EOPNOTSUPP)
	case attr.WCFlags&^WCStandardFlags != 0:
		return nil, fmt.Errorf("verbs: CQ wc_flags %#x beyond the standard set: %w", attr.WCFlags, syscall.EOPNOTSUPP)
	case attr.CompMask&CQInitAttrFlags != 0 && attr.Flags&^CreateCQSingleThreaded != 0:
		return nil, fmt.Errorf("verbs: CQ flags %#x: %w", attr.Flags, syscall.EOPNOTSUPP)
	case attr.CompMask&CQInitAttrPD != 0:
		return nil, fmt.Errorf("verbs: CQ parent domain not supported: %w", syscall.EINVAL)
	case attr.Channel != nil && attr.Channel.ctx != c:
		return nil, fmt.Errorf("verbs: completion channel of another context: %w", syscall.EINVAL)
	case attr.CompVector < 0 || attr.CompVector >= c.cfg.CompVectors: // as the kernel's create_cq
		return nil, fmt.Errorf("verbs: completion vector %d outside [0, %d): %w", attr.CompVector, c.cfg.CompVectors, syscall.EINVAL)
	}
	if err := c.hold(); err != nil {
		return nil, err
	}
	cq := &CQ{
		ctx: c, wcFlags: attr.WCFlags, sgid: sgid, unsolicited: unsolicited, channel: attr.Channel,
		userCtx: attr.CQContext, phase: 1,
		single: attr.CompMask&CQInitAttrFlags != 0 && attr.Flags&CreateCQSingleThreaded != 0,
	}
	in := engine.CQInit{Entries: attr.CQE, Owner: cq}
	if sgid {
		in.Flags |= uapi.CQFlagWithSGID
	}
	if c.cfg.RequestID64 {
		in.Flags |= uapi.CQFlagSQ64BitReqID
	}
	if ch := attr.Channel; ch != nil {
		in.Flags |= uapi.CQFlagWithCompletionChannel
		in.Notify = func() { ch.push(cq) }
	}
	e, err := c.e.CreateCQ(in)
	if err != nil {
		c.release()
		return nil, err
	}
	cq.e, cq.ring, cq.db, cq.depth = e, e.Ring(), e.Doorbell(), e.Depth()
	cq.mask = uint32(cq.depth - 1)
	if ch := attr.Channel; ch != nil {
		ch.refs.Add(1)
	}
	return cq, nil
}

// CQE returns the number of entries (ibv_cq.cqe): the rounded size.
func (cq *CQ) CQE() int { return cq.depth }

// Context returns the CQ's context.
func (cq *CQ) Context() *Context { return cq.ctx }

// UserContext returns the cq_context given at creation.
func (cq *CQ) UserContext() any { return cq.userCtx }

// Destroy destroys the CQ (ibv_destroy_cq): EBUSY while a QP uses it or while completion events
// are not all acknowledged with AckEvents.
func (cq *CQ) Destroy() error {
	if n := cq.events.Load() - cq.acks.Load(); n != 0 {
		return fmt.Errorf("verbs: CQ has %d unacknowledged events: %w", n, syscall.EBUSY)
	}
	if err := cq.ctx.e.DestroyCQ(cq.e); err != nil {
		return err
	}
	if cq.channel != nil {
		cq.channel.refs.Add(-1)
	}
	cq.ctx.release()
	return nil
}

// ReqNotify asks for a completion event on the CQ's channel when the next entry arrives
// (ibv_req_notify_cq). EFA has no solicited-only events: solicitedOnly is EOPNOTSUPP.
func (cq *CQ) ReqNotify(solicitedOnly bool) error {
	if solicitedOnly {
		return fmt.Errorf("verbs: solicited-only CQ notification: %w", syscall.EOPNOTSUPP)
	}
	if cq.channel == nil {
		return fmt.Errorf("verbs: CQ has no completion channel: %w", syscall.EINVAL)
	}
	cq.lock()
	atomic.StoreUint32(cq.db, efaio.CQDoorbell(cq.cc, uint8(cq.cmdSN.Load()), true))
	cq.unlock()
	cq.ctx.e.ArmCQ(cq.e)
	return nil
}

// AckEvents acknowledges n completion events of this CQ (ibv_ack_cq_events): at most the events
// got and not yet acknowledged, none for n ≤ 0, so that acknowledging too many cannot leave the
// CQ busy for ever (Destroy waits for every event got to be acknowledged).
func (cq *CQ) AckEvents(n int) {
	for n > 0 {
		a := cq.acks.Load()
		k := min(uint64(n), cq.events.Load()-a)
		if k == 0 || cq.acks.CompareAndSwap(a, a+k) {
			return
		}
	}
}

// Overrun reports whether the device lost a completion because the CQ was full.
func (cq *CQ) Overrun() bool { return cq.e.Overrun() }

// BadCompletions returns how many entries polling dropped as invalid (unknown QP, stale
// generation): the count of EINVAL results.
func (cq *CQ) BadCompletions() uint64 { return cq.bad.Load() }

func (cq *CQ) lock() {
	if !cq.single {
		cq.mu.Lock()
	}
}

func (cq *CQ) unlock() {
	if !cq.single {
		cq.mu.Unlock()
	}
}

// CompChannel is a completion event channel (struct ibv_comp_channel).
type CompChannel struct {
	ctx    *Context
	mu     sync.Mutex
	queue  []*CQ
	sig    chan struct{}
	refs   atomic.Int32
	closed bool
}

// CreateCompChannel creates a completion channel (ibv_create_comp_channel).
func (c *Context) CreateCompChannel() (*CompChannel, error) {
	if err := c.hold(); err != nil {
		return nil, err
	}
	return &CompChannel{ctx: c, sig: make(chan struct{}, 1)}, nil
}

// Destroy destroys the channel (ibv_destroy_comp_channel): EBUSY while CQs use it, EINVAL once
// destroyed.
func (ch *CompChannel) Destroy() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed {
		return fmt.Errorf("verbs: completion channel already destroyed: %w", syscall.EINVAL)
	}
	if n := ch.refs.Load(); n > 0 {
		return fmt.Errorf("verbs: completion channel used by %d CQs: %w", n, syscall.EBUSY)
	}
	ch.closed = true
	ch.ctx.release()
	return nil
}

// push queues an event for cq. Called by the device with its lock held: it must not block.
func (ch *CompChannel) push(cq *CQ) {
	ch.mu.Lock()
	ch.queue = append(ch.queue, cq)
	ch.mu.Unlock()
	select {
	case ch.sig <- struct{}{}:
	default:
	}
}

// GetCQEvent waits for the next completion event (ibv_get_cq_event) and returns its CQ, which
// must then be re-armed with ReqNotify for another event and acknowledged with AckEvents. It
// returns ctx's error if ctx ends first.
func (ch *CompChannel) GetCQEvent(ctx context.Context) (*CQ, error) {
	for {
		ch.mu.Lock()
		if len(ch.queue) > 0 {
			cq := ch.queue[0]
			ch.queue = ch.queue[1:]
			ch.mu.Unlock()
			cq.cmdSN.Add(1)
			cq.events.Add(1)
			return cq, nil
		}
		ch.mu.Unlock()
		// The caller sleeps until an event: the device's receive loop, which alone can bring
		// it, takes the socket over now rather than at the end of a park, and does not park
		// while the caller sleeps; so do the parked loops of the process's other devices,
		// which the caller may have been polling (engine.Device.BeginSleep).
		e := ch.ctx.e
		e.BeginSleep()
		select {
		case <-ch.sig:
			e.EndSleep()
		case <-ctx.Done():
			e.EndSleep()
			return nil, ctx.Err()
		}
	}
}
