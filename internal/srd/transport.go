package srd

import (
	"io"
	"sync/atomic"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/seal"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link"
)

// Transport constants.
const (
	rxWindow      = 8192 // PSNs a receiver tracks beyond its cumulative point
	maxCwnd       = 4096 // packets in flight per peer (below rxWindow)
	initialCwnd   = 64
	minReorder    = 20 * time.Microsecond  // least reordering allowed within one path
	minRTO        = 2 * time.Millisecond   // Go timers do not fire much faster when idle
	maxRTO        = 200 * time.Millisecond //
	initialRTO    = 10 * time.Millisecond
	pathFailLoss  = 3                     // consecutive losses on a path that mark it failed
	probeInterval = 50 * time.Millisecond // how often a failed path is probed
	ackEvery      = 16                    // datagrams carrying DATA between ACKs within one receive batch
	datagramSlack = 48                    // IPv6 + UDP headers: what PathMTU leaves for us
)

// Host is the device above the transport. The transport calls it with the device's lock held
// (the caller of the transport's method holds it).
type Host interface {
	// Receive places one segment of a SEND or RDMA write that came on src's stream. in is what
	// Receive returned for the message's earlier segments (nil for its first); Receive returns
	// what to pass with the next one, or done and the message's status once it is whole or
	// failed. A status other than OK goes back to the sender in a RESP.
	Receive(src [16]byte, f *wire.Data, in Inbound) (next Inbound, st efaio.Status, done bool)
	// Read checks an RDMA read request from src and returns the memory the answer is read from,
	// and the region it lies in, which Live names again before each segment is read from it.
	Read(src [16]byte, f *wire.Data) (b mem.Span, region any, st efaio.Status)
	// Live reports whether a region Read returned is still registered: a segment of read data
	// sent (or sent again) after its region is gone would read memory the application has
	// reused, so the read fails instead.
	Live(region any) bool
	// UD delivers a UD message from src (which may not be validated: UD needs no state).
	UD(src [16]byte, f *wire.Data)
	// Done is the outcome of the request whose owner is owner, at now (the clock the transport
	// call that brought it was given). mayRetry: st is an RNR the owner may try again, as a new
	// request.
	Done(now time.Duration, owner any, st efaio.Status, mayRetry bool)
	// Gather appends bytes [off, off+n) of the concatenation of src to b (mem.Append); false if
	// the memory faulted.
	Gather(b []byte, src []mem.Span, off uint64, n int) ([]byte, bool)
	// Copy copies src into dst at byte off (read data arriving); false if the memory faulted.
	Copy(dst mem.Span, off int, src []byte) bool
}

// Inbound is the host's state for a message arriving in segments, which the transport keeps by
// message id until the message is whole, or aborted.
type Inbound interface {
	// Abort ends the message unfinished: the sender aborted it, or its stream was reset.
	Abort()
}

// Counters are the transport's counters, with EFA's names where EFA has the counter (the
// device's Counters embed them).
type Counters struct {
	TxBytes, TxPkts, RxBytes, RxPkts, RxDrops          atomic.Uint64
	RetransBytes, RetransPkts, RetransTimeoutEvents    atomic.Uint64
	UnresponsiveRemoteEvents, ImpairedRemoteConnEvents atomic.Uint64
	BadPackets, StalePackets                           atomic.Uint64 // dropped: malformed; for another incarnation
	Unvalidated                                        atomic.Uint64 // from devices not yet validated: challenged
	AuthFailures, Replays                              atomic.Uint64 // sealed datagrams dropped
	SpuriousRetrans                                    atomic.Uint64 // packets counted lost that arrived after all (softefa's own)
	SpuriousTimeouts                                   atomic.Uint64 // retransmission timeouts a packet sent before them, once, proved spurious (softefa's own)
	SparseCopies                                       atomic.Uint64 // second copies of packets sent while few were in flight (softefa's own)
	PeersForgotten                                     atomic.Uint64 // peer contexts dropped idle, by age or for room (softefa's own)
}

// Request is a message one of the host's queue pairs sends to another device.
type Request struct {
	Op             wire.Op // wire.OpSend, wire.OpWrite or wire.OpReadReq
	SrcQPN, DstQPN uint16
	QKey           uint32
	Imm            uint32
	HasImm         bool
	RKey           uint32 // RDMA
	RAddr          uint64 // RDMA
	Src            [efaio.TxNumBufs]mem.Span
	NSrc           int
	Length         uint64
	Sink           mem.Span // RDMA read: where the data goes
}

// Transport is one device's SRD endpoint: its peer contexts and everything they share.
type Transport struct {
	cfg    config.Device
	host   Host
	link   link.Link
	gid    [16]byte
	inc    uint32 // this device's incarnation
	counts *Counters

	sendTurn chan struct{} // holds a value while a goroutine puts datagrams on the link (Hold)

	stallFloor time.Duration // the least retransmission timeout, after stalls (stalled)
	stallAt    time.Duration // when stallFloor last rose or was halved

	peers    map[[16]byte]*peer
	peerList []*peer // the same, in the order they came: what loops over peers follow
	// active lists the peers not slim, in no order: the timer's loops over peers follow it, so
	// that thousands of idle peers cost a tick nothing (slim.go).
	active        []*peer
	memos         map[[16]byte]memo // what forgotten peers left (peers.go)
	held          int               // messages arriving in part, of all peers (maxHeld)
	nextExpiry    time.Duration     // when expirePeers looks next
	stranger      peer              // scratch context for datagrams from devices not yet validated
	frame         wire.Frame        // input's scratch
	strangerFrame wire.Frame        // admit's scratch

	txq    *Queue        // where frames go: the queue of the goroutine holding the device's lock
	due    []*peer       // streams to pump at the end of the batch (pumpLater, pumpDue)
	now    time.Duration // the clock of the call in progress, as its caller gave it (Tick, Input, ...)
	busy   bool          // some stream may have something outstanding (Busy)
	linger bool          // idle peers wait to be slimmed (Lingering)

	rings   [][]sentPkt // free transmit rings of ringStart slots (slim.go)
	windows []window    // free receive windows, all bits clear

	ackList  []*peer     // peers owed an ACK (flushAcks)
	acksOwed atomic.Bool // ackList is not empty
	freeMsgs []*Msg

	secret [32]byte     // the cookie key (admit.go)
	ports  []uint16     // the UDP source ports of our paths, which our COOKIE frames list
	ip     [16]byte     // our IP address as sealed datagrams name it (IPv4-mapped for IPv4)
	seal   *seal.Sealer // authenticated encryption, with a key (queue.go)
}

// New makes the transport of a device with configuration cfg (filled) over l, as incarnation
// inc; rng draws its cookie key and sealing salts; host is the device.
func New(cfg config.Device, l link.Link, inc uint32, rng io.Reader, host Host, counts *Counters) (*Transport, error) {
	t := &Transport{
		cfg: cfg, host: host, link: l, inc: inc, counts: counts, sendTurn: make(chan struct{}, 1),
		gid:    config.GIDFromAddr(l.LocalAddr()),
		ip:     l.LocalAddr().Addr().Unmap().As16(),
		ports:  []uint16{l.LocalAddr().Port()},
		peers:  make(map[[16]byte]*peer),
		memos:  make(map[[16]byte]memo),
		secret: newSecret(rng),
	}
	if pp, ok := l.(link.PathPorter); ok {
		t.ports = pp.PathPorts()
	}
	if len(cfg.Key) > 0 {
		var err error
		if t.seal, err = seal.New(cfg.Key, rng); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// sendTime is the time to stamp packets sent now with: the clock read afresh. t.now, read once
// for a whole batch, can be tens of microseconds old by the end of it, and packets stamped with it
// look sent earlier than they were: a packet framed late in one batch then seems to have waited
// longer than one framed early in the next, and the loss rules (docs/congestion.md) counted
// packets lost that were only reordered. A pump reads it once, and again for each datagram it
// begins (restamp).
func (t *Transport) sendTime() time.Duration {
	if t.cfg.Clock == nil {
		return t.now
	}
	return max(t.cfg.Clock(), t.now)
}

// Inc returns this device's incarnation.
func (t *Transport) Inc() uint32 { return t.inc }

// Use makes q the queue frames go to until the caller lets go of the device's lock; the caller
// sends what q holds afterwards, with Flush.
func (t *Transport) Use(q *Queue) { t.txq = q }

// Hold frames the requests queued and not framed yet (Request queues them, and one pump a stream
// frames them together; FlushAcks, Frame and the transport's own pumps may have framed them
// already), then takes the turn to send q's datagrams, if it holds any, before the caller lets go
// of the device's lock; Flush, after, sends them and gives the turn back. Datagrams so go on the
// link in the order their frames were written, whichever goroutine wrote them: a goroutine off its
// processor between the lock and the send would otherwise send a batch after later ones, and
// the peer's ACKs of those would take its packets for lost (docs/congestion.md).
func (t *Transport) Hold(q *Queue) {
	t.pumpDue()
	if q.n > 0 {
		t.sendTurn <- struct{}{}
		q.turn = true
	}
}

// Flush sends q's datagrams. Called without the device's lock, after Hold if the caller took
// the turn.
func (t *Transport) Flush(q *Queue) { t.sendTx(q) }

// The calls below that take now are given the clock by their caller, which reads it once for its
// batch, not once per packet; the transport keeps it as the time of the call in progress (t.now)
// for the helpers under it, and passes it on to the host's callbacks (Host.Done).

// Busy reports whether some stream may have something outstanding: the device's timer must run
// (Tick) until it reports false.
func (t *Transport) Busy() bool { return t.busy }

// Tick runs the transport's timers at now: path probes, transport timeouts, retransmission
// timeouts, peer expiry. It reports whether any stream has something outstanding.
func (t *Transport) Tick(now time.Duration) bool {
	t.now = now
	t.busy = t.transportTick(now)
	return t.busy
}

// AckDelay is how long a busy poll leaves an acknowledgement owed (FlushAcks).
const AckDelay = ackDelay

// FlushAcks sends, at now, the ACKs owed for at least minAge (see flushAcks).
func (t *Transport) FlushAcks(now, minAge time.Duration) {
	t.now = now
	t.pumpDue() // the batch's requests first: the ACKs owed ride on their datagrams
	t.flushAcks(now, minAge)
}

// AcksOwed reports whether any ACK is owed; safe without the device's lock.
func (t *Transport) AcksOwed() bool { return t.acksOwed.Load() }

// Input handles, at now, the first n datagrams of in's packets; lazy (a busy poll) leaves their
// acknowledgements owed for up to AckDelay, so that the application's answer can carry them.
func (t *Transport) Input(now time.Duration, in *Inbox, n int, lazy bool) {
	t.now = now
	t.inputBatch(in, n, now, lazy)
}

// Request starts, at now, request r to the device dst, on behalf of owner (not nil): it goes on
// the peer's stream, framed when the batch ends (Hold), and Host.Done gets owner and the outcome
// when the peer answers or the transport gives up. It returns LOCAL_UNREACH_REMOTE, having
// started nothing, if the peer table is full.
func (t *Transport) Request(now time.Duration, dst [16]byte, r *Request, owner any) (*Msg, efaio.Status) {
	t.now = now
	return t.sendRemote(dst, r, owner)
}

// UD sends r, at now, as one unacknowledged datagram: it has gone when UD returns.
func (t *Transport) UD(now time.Duration, dst [16]byte, r *Request) efaio.Status {
	t.now = now
	return t.sendUD(dst, r)
}

// Frame frames, at now, the requests queued in this batch (Request), as Hold would at its end:
// for a caller that cancels requests of the batch and wants those already made carried out, as
// far as the window allows (the device's DestroyQP).
func (t *Transport) Frame(now time.Duration) {
	t.now = now
	t.pumpDue()
}

// Cancel detaches request m from its owner, whose queue pair was flushed: Done will not be called
// for it (see cancel).
func (t *Transport) Cancel(m *Msg) { t.cancel(m) }
