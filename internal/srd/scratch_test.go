package srd

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/link"
)

// Queues and inboxes count what they hold as they make it, for the engine's count of its busy
// pollers' scratch, which it takes after every batch (engine.Device.ScratchBytes): the count
// matches a recount of every buffer's capacity and every slot, after a queue has grown its
// datagram buffers, and after it has made its sealed copies.
func TestQueueAndInboxCountWhatTheyHold(t *testing.T) {
	r := newTrace(t, 2, nil)
	if got, want := r.in.Bytes(), recountInbox(r.in); got != want {
		t.Fatalf("a new inbox counts %d bytes, holds %d", got, want)
	}
	r.post(1, efaio.OpSend, 20000) // several datagrams through r.q
	if recountQueue(r.q) == len(r.q.pkts)*packetSlot {
		t.Fatal("the queue grew no datagram buffers")
	}
	if got, want := r.q.held, recountQueue(r.q); got != want {
		t.Fatalf("a queue that sent counts %d bytes, holds %d", got, want)
	}
	sealed := newTrace(t, 2, func(c *config.Device) { c.Key = bytes.Repeat([]byte{0x42}, 32) })
	pk := []link.Packet{{Buf: make([]byte, 64), N: 64, Addr: netip.MustParseAddrPort("10.9.9.9:4791")}}
	sealed.tr.sealAll(sealed.in.Out, pk)
	if len(sealed.in.Out.sealed) == 0 {
		t.Fatal("the queue made no sealed copies")
	}
	if got, want := sealed.in.Bytes(), recountInbox(sealed.in); got != want {
		t.Fatalf("an inbox whose queue sealed counts %d bytes, holds %d", got, want)
	}
}

func recountQueue(q *Queue) int {
	n := (cap(q.pkts) + cap(q.sealed)) * packetSlot
	for _, p := range q.pkts {
		n += cap(p.Buf)
	}
	for _, p := range q.sealed {
		n += cap(p.Buf)
	}
	return n
}

func recountInbox(rx *Inbox) int {
	n := cap(rx.opened.Buf) + cap(rx.Pkts)*packetSlot + recountQueue(rx.Out)
	for _, p := range rx.Pkts {
		n += cap(p.Buf)
	}
	return n
}
