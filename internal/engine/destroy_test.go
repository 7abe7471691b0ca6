package engine

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/srd"
	"github.com/softefa/softefa/internal/uapi"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/link"
)

// A SEND whose doorbell was stored but that the device has not looked at yet (a doorbell mapping
// that does not trap, which the watcher notices up to a millisecond later) is carried out when
// the QP is destroyed, as a device that fetches on the doorbell would have done already; the
// destroy does not flush it unsent (docs/cabi.md, "Doorbells"). The device is driven, so nothing
// but the destroy looks at the rings.
func TestDestroyCarriesOutRungWQEs(t *testing.T) {
	r := newAccessRigOn(t, config.Device{Addr: netip.MustParseAddrPort("127.0.0.1:1"), Driven: true})
	ah, err := r.d.CreateAH(r.pd, r.d.gid)
	if err != nil {
		t.Fatal(err)
	}
	const msg = "carried out at destroy"
	storeRungSend(r, r, ah, 0, msg)
	if err := r.d.DestroyQP(r.q); err != nil {
		t.Fatal(err)
	}
	if got := r.d.WRCounts().SendWRs; got != 1 {
		t.Errorf("%d SEND WRs carried out, want 1", got)
	}
	if got := string(r.inA[:len(msg)]); got != msg {
		t.Errorf("the receive buffer holds %q, want %q", got, msg)
	}
}

// A QP moved to RESET with a SEND still on the network discards it without a completion, as IB's
// RESET discards everything, and can then be destroyed: when the transport gives up on the
// SEND (its peer never answers), nothing is left to complete. Before, RESET kept the SEND in the
// QP's list of WRs on the network, the destroy dropped the list, and the transport's timeout
// completed a WR the QP no longer had: the engine panicked.
func TestResetDiscardsWRsOnTheNetwork(t *testing.T) {
	silent, err := link.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), 1) // never read
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	l, err := link.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var now time.Duration
	r := newAccessRigOn(t, config.Device{Addr: l.LocalAddr(), Link: l, Driven: true,
		Clock: func() time.Duration { return now }})
	ah, err := r.d.CreateAH(r.pd, GIDFromAddr(silent.LocalAddr()))
	if err != nil {
		t.Fatal(err)
	}
	r.q.sq.slot(0).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: 3, Length: 1, AHN: ah.ahn, QKey: 9,
		DestQPN: 1, CompReq: true, Phase: r.q.sq.phase,
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: 8, LKey: r.a.lkey, Addr: r.a.iova}}})
	atomic.StoreUint32(r.q.sq.db, 1)
	r.d.Drive()
	if len(r.q.out) != 1 {
		t.Fatalf("%d WRs on the network after the post, want 1", len(r.q.out))
	}
	if err := r.d.ModifyQP(r.q, &QPAttr{State: uapi.QPSReset}, uapi.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if len(r.q.out) != 0 {
		t.Fatalf("%d WRs on the network after RESET, want 0", len(r.q.out))
	}
	cq := r.q.sendCQ
	if err := r.d.DestroyQP(r.q); err != nil {
		t.Fatal(err)
	}
	for range 20 { // well past the transport timeout, in steps the timers see
		now += r.d.cfg.TransportTimeout / 4
		r.d.Drive()
	}
	if got := cq.Written(); got != 0 {
		t.Errorf("%d completions for a SEND discarded by RESET, want 0", got)
	}
}

// A SEND from the network that arrived in part has taken its receive WR; when the QP is flushed
// (ERR), destroyed, or the receive buffer's region deregistered before the rest arrives, the WR
// completes at once (FLUSHED, or LOCAL_INVALID_LKEY for the region), the rest of the message
// places nothing, and no second completion follows; the sender's request fails. Before, the WR
// got no completion at the flush, and the later segments were copied into the buffer (which the
// application may have unmapped by then) and completed into the CQ.
func TestPartReceivedSendEndsWithItsQP(t *testing.T) {
	for _, c := range []struct {
		name string
		stop func(r *accessRig) error
		want efaio.Status
	}{
		{"ERR", func(r *accessRig) error {
			return r.d.ModifyQP(r.q, &QPAttr{State: uapi.QPSErr}, uapi.QPAttrState)
		}, efaio.StatusFlushed},
		{"destroy", func(r *accessRig) error { return r.d.DestroyQP(r.q) }, efaio.StatusFlushed},
		{"dereg", func(r *accessRig) error { return r.d.DeregMR(r.a) }, efaio.StatusLocalInvalidLKey},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newAccessRigOn(t, config.Device{Addr: netip.MustParseAddrPort("127.0.0.1:1"), Driven: true})
			h := (*host)(r.d)
			cq := r.q.recvCQ
			efaio.RxDesc(r.q.rq.ring[:efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: r.a.iova, ReqID: 7,
				Length: 64, LKey: r.a.lkey, First: true, Last: true})
			atomic.StoreUint32(r.q.rq.db, 1)
			seg := func(off int, prev srd.Inbound) (srd.Inbound, efaio.Status, bool) {
				f := wire.Data{Op: wire.OpSend, DstQPN: uint16(r.q.qpn), QKey: 9, Length: 30, Offset: uint32(off),
					Payload: bytes.Repeat([]byte{byte('a' + off/10)}, 10)}
				r.d.mu.Lock() // as the transport calls its host
				defer r.d.mu.Unlock()
				return h.Receive([16]byte{1}, &f, prev)
			}
			in, _, done := seg(0, nil)
			if done || in == nil {
				t.Fatal("the first of three segments finished the message")
			}
			if err := c.stop(r); err != nil {
				t.Fatal(err)
			}
			if got := cq.Written(); got != 1 {
				t.Fatalf("%d receive completions at the %s, want 1", got, c.name)
			}
			e := efaio.CQE(cq.ring[:cq.esz])
			var got efaio.Completion
			if err := e.Decode(binary.LittleEndian.Uint32(e), &got); err != nil || got.Status != c.want || got.ReqID != 7 {
				t.Errorf("the completion has status %d for WR %d (%v), want %d for WR 7", got.Status, got.ReqID, err, c.want)
			}
			in, _, _ = seg(10, in)
			_, st, done := seg(20, in)
			if !done || st == efaio.StatusOK {
				t.Errorf("the last segment: done %v, status %d; want done and a failure for the sender", done, st)
			}
			if got := cq.Written(); got != 1 {
				t.Errorf("%d receive completions after the rest arrived, want still 1", got)
			}
			if got := string(r.inA[:30]); got != strings.Repeat("a", 10)+strings.Repeat("\x00", 20) {
				t.Errorf("the receive buffer holds %q: the rest of the message was placed", got)
			}
		})
	}
}

// The same for a SEND to another device, one already heard from: the transport frames a batch's
// requests at its end (srd.Transport.Hold), and the destroy's flush, in the batch that carried
// the WQE out, cancelled the request before any of it was framed. The peer never got the message
// (MPICH's partner waiting in MPI_Allreduce, as before e79fa0a). The sender is driven: no timer
// of its own looks at the ring between the doorbell and the destroy.
func TestDestroyCarriesOutRungWQEsToAPeer(t *testing.T) {
	start := time.Now()
	a, b := drivenRig(t, func() time.Duration { return time.Since(start) }), udpRig(t)
	ah, err := a.d.CreateAH(a.pd, b.d.GID())
	if err != nil {
		t.Fatal(err)
	}
	postSend(a, b, ah, "first")
	for deadline := time.Now().Add(10 * time.Second); a.q.sendCQ.Written() == 0; a.d.Drive() {
		if time.Now().After(deadline) {
			t.Fatal("the first SEND was not answered in 10 s")
		}
	}
	// Answered: a has heard from b.

	const msg = "carried out at destroy"
	storeRungSend(a, b, ah, 1, msg)
	if err := a.d.DestroyQP(a.q); err != nil {
		t.Fatal(err)
	}
	b.d.AwaitRecv(b.q, 1, 10*time.Second)
	if got := string(b.inA[1024 : 1024+len(msg)]); got != msg {
		t.Errorf("the peer's receive buffer holds %q, want %q", got, msg)
	}
}

// storeRungSend posts, in slot i of each queue, a receive WR at b (64 bytes at 1024*i into region
// A, req_id 7+i) and a SEND of msg from a (from 2048 into its region A, req_id 3+i) through ah,
// and stores both doorbells without Ring: a doorbell the device has not looked at yet.
func storeRungSend(a, b *accessRig, ah *AH, i uint16, msg string) {
	efaio.RxDesc(b.q.rq.ring[int(i)*efaio.RxDescSize:][:efaio.RxDescSize]).Encode(&efaio.RxDescFields{
		Addr: b.a.iova + 1024*uint64(i), ReqID: 7 + i, Length: 64, LKey: b.a.lkey, First: true, Last: true})
	atomic.StoreUint32(b.q.rq.db, uint32(i)+1)
	copy(a.inA[2048:], msg)
	a.q.sq.slot(i).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: 3 + i, Length: 1, AHN: ah.ahn, QKey: 9,
		DestQPN: uint16(b.q.qpn), CompReq: true, Phase: a.q.sq.phase,
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: uint32(len(msg)), LKey: a.a.lkey, Addr: a.a.iova + 2048}}})
	atomic.StoreUint32(a.q.sq.db, uint32(i)+1)
}
