package engine

import (
	"encoding/binary"
	"io"
	"net/netip"
	"time"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/seal"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link"
)

// SRD over a link: each pair of devices shares a peer context per side. A device's DATA frames to
// a peer form a packet stream: PSNs from 0 in each stream epoch, acknowledged cumulatively and
// selectively, retransmitted until acknowledged, delivered to the receiver exactly once (the
// receiver keeps a window of PSNs seen). Messages ride on that stream: a SEND or RDMA write is cut
// into segments that fit the path MTU; the responder places segments as they come, in any order,
// and answers a message that fails with a RESP frame carrying its status; an RDMA read is a
// READ_REQ answered by READ_RESP segments. RESP, READ_REQ and READ_RESP frames are in the streams
// too, so they are as reliable as data. A message succeeds when ACKs cover every segment and the
// peer's stream has reached the horizon the covering ACK named with no RESP for it (settle).
//
// All of it is device state under Device.mu; frames are built into the txq of whichever goroutine
// holds the lock (the engine loop or the receive loop) and sent after it lets go.

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
	rnrInterval   = time.Millisecond      // default RNR retry pacing (Config.RNRInterval)
	ackEvery      = 16                    // DATA frames between ACKs within one receive batch
	datagramSlack = 48                    // IPv6 + UDP headers: what PathMTU leaves for us
	spinYield     = 40 * time.Microsecond // a yield longer than this ends the receive loop's spin
)

// peer is this device's context for one other device.
type peer struct {
	gid   [16]byte
	addr  netip.AddrPort
	inc   uint32 // the peer's incarnation; 0 until heard from
	heard bool   // the peer has sent us something: a timeout means unresponsive, not unreachable

	tx txStream
	rx rxStream

	paths  []pathState
	pathRR int // path of the current data burst
	ctrlRR int // path of the last ACK or PROBE_ACK

	replay seal.Replay // sealed datagrams seen from the peer
	// Address validation (admit.go). ports: the UDP ports the peer sends from, as its COOKIE
	// listed them (nil: not known yet, and we challenge it in every datagram until they are).
	// cookie: the peer's challenge to us, echoed with our ports while echo is set.
	ports    []uint16
	cookie   uint64
	echo     bool
	myCookie uint64 // our challenge to the peer, for the bucket myBucket
	myBucket int64
	seen     time.Duration // when the peer last sent us a datagram we took, or we queued it work
}

// pathState is the scoreboard of one of our paths towards a peer.
type pathState struct {
	srtt      time.Duration
	losses    int           // consecutive packets lost on this path
	ackedAt   time.Duration // send time of the latest packet on this path acknowledged
	failed    bool
	failedAt  time.Duration // when it was marked failed
	probeAt   time.Duration // when to probe a failed path next
	probeSent bool
	nonce     uint32
	sent      uint64
	lost      uint64
}

// newIncarnation draws a device's incarnation: random, never 0.
func newIncarnation(rng io.Reader) uint32 {
	var b [4]byte
	for {
		_, _ = io.ReadFull(rng, b[:])
		if v := binary.BigEndian.Uint32(b[:]); v != 0 {
			return v
		}
	}
}

// peerFor returns the context for gid, creating it (nil if MaxPeers are in use and none is idle).
func (d *Device) peerFor(gid [16]byte) *peer {
	if p := d.peers[gid]; p != nil {
		return p
	}
	if len(d.peers) >= d.cfg.MaxPeers && !d.makeRoom() {
		return nil
	}
	p := &peer{gid: gid, addr: AddrFromGID(gid, d.link.LocalAddr().Port()), paths: make([]pathState, d.link.Paths()),
		seen: d.now}
	p.tx.init()
	p.rx.init()
	d.recall(p)
	d.peers[gid] = p
	d.peerList = append(d.peerList, p)
	return p
}

// clock is the device's monotonic time, as a duration since it started.
func (d *Device) clock() time.Duration {
	if d.cfg.Clock != nil {
		return d.cfg.Clock()
	}
	return time.Since(d.start)
}

// segSize is the payload of one DATA frame that keeps a datagram within the path MTU, with room
// for a COOKIE and a CHALLENGE frame (address validation, while it lasts).
func (d *Device) segSize() int {
	return d.maxDatagram() - wire.DatagramHeaderSize - wire.CookieFrameSize(len(d.ports)) - challengeFrameSize -
		wire.FrameHeaderSize - wire.DataHeaderSize
}

// maxDatagram is the most bytes of one plain datagram (sealing adds seal.Overhead).
func (d *Device) maxDatagram() int {
	if d.seal != nil {
		return d.cfg.PathMTU - datagramSlack - seal.Overhead
	}
	return d.cfg.PathMTU - datagramSlack
}

// txq collects the datagrams one goroutine builds while it holds the device lock. Frames for the
// same peer and path go into the same datagram while they fit, so ACKs ride with data and small
// frames share datagrams.
type txq struct {
	pkts   []link.Packet
	sealed []link.Packet      // the sealed copies, with a key
	aad    [seal.AADSize]byte // sealing's scratch
	n      int
	cur    *peer
	path   int
	maxLen int
}

func newTxq(max, n int) *txq {
	// Datagram buffers come with first use (room): an idle device holds none.
	return &txq{pkts: make([]link.Packet, n), maxLen: max}
}

// room returns the datagram to append a frame of size bytes to, for p on path, starting a new
// one when needed. It returns nil when the queue is full: the caller flushes and retries.
func (d *Device) room(p *peer, path, size int) []byte {
	q := d.txq
	if q.n > 0 && q.cur == p && q.path == path && q.pkts[q.n-1].N+size <= q.maxLen {
		return q.pkts[q.n-1].Buf[:q.pkts[q.n-1].N]
	}
	if q.n == len(q.pkts) {
		d.flushTx()
	}
	pk := &q.pkts[q.n]
	if pk.Buf == nil {
		pk.Buf = make([]byte, 0, q.maxLen) // once per slot: kept for every later datagram
	}
	q.n++
	q.cur, q.path = p, path
	h := wire.Header{Path: uint8(path), SrcPort: d.link.LocalAddr().Port(), SrcInc: d.inc, DstInc: p.inc,
		TxEpoch: p.tx.epoch, RxEpoch: p.rx.epoch}
	pk.Buf = wire.AppendHeader(pk.Buf[:0], &h)
	if p.echo {
		pk.Buf = wire.AppendCookie(pk.Buf, p.cookie, d.ports)
	}
	if p.ports == nil && p.tx.busy() {
		// We reached out to p ourselves and do not know its ports yet: challenge it, so that its
		// answers, from whichever of its ports, come with a COOKIE listing them (admit.go). UD
		// traffic alone keeps no stream and asks for nothing.
		pk.Buf = wire.AppendChallenge(pk.Buf, d.challengeFor(p))
	}
	fits := size >= wire.FrameHeaderSize+wire.DataHeaderSize && len(pk.Buf)+wire.FrameHeaderSize+wire.AckSize+size <= q.maxLen
	if fits && ((p.rx.ackDue || d.ackCopy && p.rx.started) && d.proven(p, path) || d.ackForce && p.rx.started) {
		// An ACK owed to p rides along with data (a path known to work: it must get there); a
		// sparse copy carries one in any case, in case the original and its ACK were lost; and
		// a message that asks for one (outMsg.withAck) gets one on every path.
		a := p.ack()
		p.rx.ackDue, p.rx.sinceAck = false, 0
		pk.Buf = wire.AppendAck(pk.Buf, &a)
	}
	pk.N, pk.Addr, pk.Path = len(pk.Buf), p.addr, path
	return pk.Buf[:pk.N]
}

// commit records the datagram grown by the last room call.
func (d *Device) commit(b []byte) {
	q := d.txq
	q.pkts[q.n-1].Buf = b
	q.pkts[q.n-1].N = len(b)
}

// flushTx sends the queued datagrams. Called with the lock held only when the queue is full;
// normally the lock holder swaps the queue out and sends after unlocking (takeTx).
func (d *Device) flushTx() {
	q := d.txq
	if q.n == 0 {
		return
	}
	d.sendPkts(q, q.pkts[:q.n])
	q.n, q.cur = 0, nil
}

func (d *Device) sendPkts(q *txq, pkts []link.Packet) {
	for i := range pkts {
		wire.PutChecksum(pkts[i].Buf[:pkts[i].N])
	}
	if d.seal != nil {
		pkts = d.sealAll(q, pkts)
	}
	var bytes uint64
	for i := range pkts {
		bytes += uint64(pkts[i].N)
	}
	d.counts.TxPkts.Add(uint64(len(pkts)))
	d.counts.TxBytes.Add(bytes)
	_ = d.link.Send(pkts) // a failed link shows up as timeouts
}

// useTx makes q the queue frames go to until the lock is released, and reads the clock for the
// batch the caller is about to do (d.now: one read per batch, not per packet); the caller sends
// what q holds afterwards with sendTx.
func (d *Device) useTx(q *txq) {
	d.txq = q
	d.now = d.clock()
}

// sendTx sends q's datagrams; called without the lock.
func (d *Device) sendTx(q *txq) {
	if q.n > 0 {
		d.sendPkts(q, q.pkts[:q.n])
		q.n, q.cur = 0, nil
	}
}

// resetPeer forgets everything about the peer's streams when it restarts as incarnation inc:
// partly received messages from it are dropped; requests its earlier life had any of fail with
// st (REMOTE_ABORT), the others go to the new life (resetRestart).
func (d *Device) resetPeer(p *peer, st efaio.Status, inc uint32) {
	d.resetRx(p)
	p.inc = inc // before resetTx: the requests it sends again are for the new life
	p.rx.epoch = 0
	p.heard = false
	p.ports, p.cookie, p.echo = nil, 0, false // the new life sends from ports of its own, and challenges anew
	d.resetTx(p, st, resetRestart)            // the answers were for the peer's earlier life
}

// PathStat is one path's scoreboard towards one peer.
type PathStat struct {
	Peer   [16]byte
	Path   int
	SRTT   time.Duration
	Sent   uint64
	Lost   uint64
	Failed bool
	Cwnd   float64 // the peer's stream's window, in packets
}

// PathStats returns every peer's path scoreboards.
func (d *Device) PathStats() []PathStat {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []PathStat
	for _, p := range d.peerList {
		for i, ps := range p.paths {
			out = append(out, PathStat{Peer: p.gid, Path: i, SRTT: ps.srtt, Sent: ps.sent, Lost: ps.lost,
				Failed: ps.failed, Cwnd: p.tx.cwnd})
		}
	}
	return out
}
