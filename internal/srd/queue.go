package srd

import (
	"unsafe"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/seal"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link"
)

// Queue collects the datagrams one goroutine builds while it holds the device lock. Frames for the
// same peer and path go into the same datagram while they fit, so ACKs ride with data and small
// frames share datagrams.
type Queue struct {
	pkts   []link.Packet
	sealed []link.Packet      // the sealed copies, with a key
	aad    [seal.AADSize]byte // sealing's scratch
	n      int
	cur    *peer
	path   int
	maxLen int
	turn   bool // holds the turn to send (Transport.Hold)

	started uint64 // datagrams begun (roomFor), ever
	held    int    // bytes of its buffers and slots, counted as made (Inbox.Bytes)
}

// NewQueue makes a datagram queue for a goroutine that does the device's work.
func (t *Transport) NewQueue() *Queue { return newTxq(t.maxDatagram(), 64) }

func newTxq(max, n int) *Queue {
	// Datagram buffers come with first use (room): an idle device holds none.
	return &Queue{pkts: make([]link.Packet, n), maxLen: max, held: n * packetSlot}
}

// packetSlot is the size of a link.Packet, a slot of a queue or inbox.
const packetSlot = int(unsafe.Sizeof(link.Packet{}))

// segSize is the payload of one DATA frame that keeps a datagram within the path MTU, with room
// for a COOKIE frame (address validation, while it lasts).
func (t *Transport) segSize() int { return SegSize(t.cfg.PathMTU, t.seal != nil) }

// SegSize is the payload of one DATA frame on a device of path MTU pathMTU, sealed or not: what
// one datagram of a message carries (Transport.segSize).
func SegSize(pathMTU int, sealed bool) int {
	return maxDatagram(pathMTU, sealed) - wire.DatagramHeaderSize - wire.CookieFrameSize(1) - wire.FrameHeaderSize - wire.DataHeaderSize
}

// maxDatagram is the most bytes of one plain datagram (sealing adds seal.Overhead).
func (t *Transport) maxDatagram() int { return maxDatagram(t.cfg.PathMTU, t.seal != nil) }

func maxDatagram(pathMTU int, sealed bool) int {
	if sealed {
		return pathMTU - datagramSlack - seal.Overhead
	}
	return pathMTU - datagramSlack
}

// Whether a new datagram that starts with a DATA frame carries an ACK of the peer's stream
// (roomFor).
const (
	ackIfOwed = iota // if one is owed and the path is proven
	ackIfCopy        // a sparse copy: if the peer's stream has started and the path is proven
	ackAlways        // if the peer's stream has started (Msg.withAck)
)

// room returns the datagram to append a frame of size bytes to, for p on path, starting a new
// one when needed.
func (t *Transport) room(p *peer, path, size int) []byte { return t.roomFor(p, path, size, ackIfOwed) }

// roomFor is room, with the rule for an ACK riding in a new datagram.
func (t *Transport) roomFor(p *peer, path, size, ride int) []byte {
	q := t.txq
	if q.n > 0 && q.cur == p && q.path == path && q.pkts[q.n-1].N+size <= q.maxLen {
		return q.pkts[q.n-1].Buf[:q.pkts[q.n-1].N]
	}
	if q.n == len(q.pkts) {
		t.flushTx()
	}
	pk := &q.pkts[q.n]
	if pk.Buf == nil {
		pk.Buf = datagramBuf(q.maxLen)[:0] // once per slot: kept for every later datagram
		q.held += cap(pk.Buf)
	}
	q.n++
	q.started++
	q.cur, q.path = p, path
	t.revalidate(p)
	p.lastTx = t.now
	h := wire.Header{Path: uint8(path), SrcPort: t.link.LocalAddr().Port(), SrcInc: t.inc, DstInc: p.inc,
		TxEpoch: p.tx.epoch, RxEpoch: p.rx.epoch}
	pk.Buf = wire.AppendHeader(pk.Buf[:0], &h)
	if c, port := p.echoOn(path); c != 0 {
		pk.Buf = wire.AppendCookie(pk.Buf, c, []uint16{port})
	}
	fits := size >= wire.FrameHeaderSize+wire.DataHeaderSize && len(pk.Buf)+wire.FrameHeaderSize+wire.AckSize+size <= q.maxLen
	if fits && ((p.rx.ackDue || ride == ackIfCopy && p.rx.started) && t.carriesAck(p, path) || ride == ackAlways && p.rx.started) {
		// An ACK owed to p rides along with data (on a path fit for it: carriesAck); a
		// sparse copy carries one in any case, in case the original and its ACK were lost; and
		// a message that asks for one (Msg.withAck) gets one on every path.
		a := p.ack()
		p.rx.ackDue, p.rx.sinceAck = false, 0
		pk.Buf = wire.AppendAck(pk.Buf, &a)
	}
	pk.N, pk.Addr, pk.Path = len(pk.Buf), p.addr, path
	return pk.Buf[:pk.N]
}

// commit records the datagram grown by the last room call.
func (t *Transport) commit(b []byte) {
	q := t.txq
	q.pkts[q.n-1].Buf = b
	q.pkts[q.n-1].N = len(b)
}

// flushTx sends the queued datagrams. Called with the lock held only when the queue is full;
// normally the lock holder sends the queue after unlocking (Hold, Flush). It waits for its turn
// (Hold): a goroutine that let go of the lock may still be sending an earlier batch.
func (t *Transport) flushTx() {
	q := t.txq
	if q.n == 0 {
		return
	}
	t.sendTurn <- struct{}{}
	t.sendPkts(q, q.pkts[:q.n])
	<-t.sendTurn
	q.n, q.cur = 0, nil
}

func (t *Transport) sendPkts(q *Queue, pkts []link.Packet) {
	for i := range pkts {
		wire.PutChecksum(pkts[i].Buf[:pkts[i].N])
	}
	if t.seal != nil {
		pkts = t.sealAll(q, pkts)
	}
	var bytes uint64
	for i := range pkts {
		bytes += uint64(pkts[i].N)
	}
	t.counts.TxPkts.Add(uint64(len(pkts)))
	t.counts.TxBytes.Add(bytes)
	_ = t.link.Send(pkts) // a failed link shows up as timeouts
}

// sendTx sends q's datagrams; called without the lock. It lets go of the turn to send that
// Hold took for q.
func (t *Transport) sendTx(q *Queue) {
	if q.n > 0 {
		t.sendPkts(q, q.pkts[:q.n])
		q.n, q.cur = 0, nil
	}
	if q.turn {
		q.turn = false
		<-t.sendTurn
	}
}

// roomLarge is room for a frame that may not fit a path-MTU datagram (a UD message up to the
// device MTU): it gets a datagram of its own, which the IP layer fragments if it must.
func (t *Transport) roomLarge(p *peer, path, size int) []byte {
	if wire.DatagramHeaderSize+size <= t.txq.maxLen {
		return t.room(p, path, size)
	}
	t.txq.cur = nil // start a datagram of its own
	b := t.room(p, path, 0)
	pk := &t.txq.pkts[t.txq.n-1]
	if cap(pk.Buf) < len(b)+size {
		nb := datagramBuf(len(b) + size)[:len(b)]
		copy(nb, b)
		t.txq.held += cap(nb) - cap(pk.Buf)
		pk.Buf = nb
		b = nb
	}
	t.txq.cur = nil // nothing else joins it
	return b
}

// With a key, every datagram leaves sealed (package seal) and only sealed ones are taken; a peer
// context is still made only through a cookie (admit.go), so a context forgotten with its replay
// window cannot be brought back by replayed datagrams.

// sealAll seals q's datagrams into its seal buffers and returns them.
func (t *Transport) sealAll(q *Queue, pkts []link.Packet) []link.Packet {
	if len(q.sealed) < len(pkts) {
		q.sealed = make([]link.Packet, len(q.pkts))
		q.held += len(q.sealed) * packetSlot
		for i := range q.sealed {
			q.sealed[i].Buf = datagramBuf(q.maxLen + seal.Overhead + 64)[:0]
			q.held += cap(q.sealed[i].Buf)
		}
	}
	out := q.sealed[:len(pkts)]
	for i := range pkts {
		p := &pkts[i]
		to := config.GIDFromAddr(p.Addr)
		b := t.seal.Seal(out[i].Buf[:0], p.Buf[:p.N], &q.aad, &t.ip, &to)
		out[i] = link.Packet{Buf: b, N: len(b), Addr: p.Addr, Path: p.Path}
	}
	return out
}
