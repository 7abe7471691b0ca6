package engine

import (
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
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
	efaio.RxDesc(r.q.rq.ring[:efaio.RxDescSize]).Encode(&efaio.RxDescFields{Addr: r.a.iova, ReqID: 7,
		Length: 64, LKey: r.a.lkey, First: true, Last: true})
	atomic.StoreUint32(r.q.rq.db, 1)
	copy(r.inA[2048:], msg)
	r.q.sq.slot(0).Encode(&efaio.TxDesc{Op: efaio.OpSend, ReqID: 3, Length: 1, AHN: ah.ahn, QKey: 9,
		DestQPN: uint16(r.q.qpn), CompReq: true, Phase: r.q.sq.phase,
		SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: uint32(len(msg)), LKey: r.a.lkey, Addr: r.a.iova + 2048}}})
	atomic.StoreUint32(r.q.sq.db, 1) // the doorbell, stored without Ring
	if err := r.d.DestroyQP(r.q); err != nil {
		t.Fatal(err)
	}
	if got := r.d.counts.SendWRs.Load(); got != 1 {
		t.Errorf("%d SEND WRs carried out, want 1", got)
	}
	if got := string(r.inA[:len(msg)]); got != msg {
		t.Errorf("the receive buffer holds %q, want %q", got, msg)
	}
}
