package engine

import (
	"bytes"
	"encoding/binary"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/srd"
	"github.com/softefa/softefa/internal/wire"
)

// receive hands the device one segment from the network, as its transport does (with the lock).
func (r *accessRig) receive(f *wire.Data, prev srd.Inbound) (srd.Inbound, efaio.Status, bool) {
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	return (*host)(r.d).Receive([16]byte{1}, f, prev)
}

// recvCompletions decodes the receive CQ's entries so far.
func (r *accessRig) recvCompletions(t *testing.T) []efaio.Completion {
	t.Helper()
	cq := r.q.recvCQ
	var out []efaio.Completion
	for i := range cq.Written() {
		e := efaio.CQE(cq.ring[int(i)*cq.esz : int(i+1)*cq.esz])
		var c efaio.Completion
		if err := e.Decode(binary.LittleEndian.Uint32(e), &c); err != nil {
			t.Fatalf("completion %d: %v", i, err)
		}
		out = append(out, c)
	}
	return out
}

// An RDMA write with immediate takes a receive WR; a malformed one (here an entry without its
// first-buffer bit) completes with LOCAL_QP_INTERNAL_ERROR and the write fails, as a SEND into it
// would. Before, the write took it as a good WR and completed it with the immediate.
func TestWriteImmIntoMalformedReceive(t *testing.T) {
	r := newAccessRig(t)
	efaio.RxDesc(r.q.rq.ring[:efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: r.a.iova, ReqID: 7,
		Length: 64, LKey: r.a.lkey, First: false, Last: true})
	atomic.StoreUint32(r.q.rq.db, 1)
	f := wire.Data{Op: wire.OpWrite, Flags: wire.FlagImm, Imm: 0xfeed, DstQPN: uint16(r.q.qpn), QKey: 9,
		Length: 8, RKey: r.a.rkey, RAddr: r.a.iova, Payload: []byte("written!")}
	if _, st, done := r.receive(&f, nil); !done || st != efaio.StatusRemoteBadStatus {
		t.Errorf("the write: done %v, status %d; want done and %d", done, st, efaio.StatusRemoteBadStatus)
	}
	cs := r.recvCompletions(t)
	if len(cs) != 1 || cs[0].ReqID != 7 || cs[0].Status != efaio.StatusLocalQPInternalError {
		t.Errorf("receive completions %+v, want WR 7 with status %d", cs, efaio.StatusLocalQPInternalError)
	}
	if !bytes.Equal(r.inA[:8], make([]byte, 8)) {
		t.Errorf("the region holds %q: the failed write landed", r.inA[:8])
	}
}

// A later segment of a message arriving in parts must belong to it (docs/wire.md, "Frames"): the
// same operation and length, its bytes inside the message. One that does not lands nothing and
// fails the message at once: its receive WR completes with REMOTE_ABORT, the sender's request
// with REMOTE_BAD_STATUS, and no byte past the message's end is written into the posted buffer.
func TestForeignSegmentFailsItsMessage(t *testing.T) {
	for _, c := range []struct {
		name string
		bad  func(f *wire.Data)
	}{
		{"past the end", func(f *wire.Data) { f.Offset = 25 }},
		{"another length", func(f *wire.Data) { f.Length = 40; f.Offset = 30 }},
		{"another operation", func(f *wire.Data) { f.Op = wire.OpWrite; f.RKey = 0; f.RAddr = 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newAccessRig(t)
			efaio.RxDesc(r.q.rq.ring[:efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: r.a.iova, ReqID: 7,
				Length: 64, LKey: r.a.lkey, First: true, Last: true})
			atomic.StoreUint32(r.q.rq.db, 1)
			seg := func(off uint32, edit func(*wire.Data)) wire.Data {
				f := wire.Data{Op: wire.OpSend, DstQPN: uint16(r.q.qpn), QKey: 9, Length: 30, Offset: off,
					Payload: bytes.Repeat([]byte{'a' + byte(off/10)}, 10)}
				if edit != nil {
					edit(&f)
				}
				return f
			}
			first := seg(0, nil)
			in, _, done := r.receive(&first, nil)
			if done || in == nil {
				t.Fatal("the first of three segments finished the message")
			}
			bad := seg(10, c.bad)
			_, st, done := r.receive(&bad, in)
			if !done || st != efaio.StatusRemoteBadStatus {
				t.Fatalf("the foreign segment: done %v, status %d; want done and %d", done, st, efaio.StatusRemoteBadStatus)
			}
			cs := r.recvCompletions(t)
			if len(cs) != 1 || cs[0].ReqID != 7 || cs[0].Status != efaio.StatusRemoteAbort {
				t.Errorf("receive completions %+v, want WR 7 with status %d", cs, efaio.StatusRemoteAbort)
			}
			if got, want := string(r.inA[:40]), strings.Repeat("a", 10)+strings.Repeat("\x00", 30); got != want {
				t.Errorf("the receive buffer holds %q, want %q", got, want)
			}
		})
	}
}
