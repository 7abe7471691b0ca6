package verbs_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/seal"
	"github.com/softefa/softefa/internal/srd"
	"github.com/softefa/softefa/internal/wire"
	"github.com/softefa/softefa/verbs"
)

func pattern(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

// Same-device loopback between two QPs of one context and of two contexts: SEND gathered from two
// SGEs and scattered into two, with the receive completion's fields.
func TestLoopbackSend(t *testing.T) {
	for _, same := range []bool{true, false} {
		a, b := newLoop(t, loopOpts{sameCtx: same})
		pattern(a.buf[:300], 1)
		if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 77, SGList: []verbs.SGE{b.mr.SGE(1000, 100), b.mr.SGE(2000, 500)}}}); err != nil {
			t.Fatal(err)
		}
		check(t, a.post(5, b, func(x *verbs.QPEx) {
			x.WRSend()
			x.WRSetSGEList([]verbs.SGE{a.mr.SGE(0, 150), a.mr.SGE(150, 150)})
		}))
		wantWC(t, a.one(), 5, verbs.WCSuccess, verbs.WCSend)
		wc := b.one()
		wantWC(t, wc, 77, verbs.WCSuccess, verbs.WCRecv)
		if wc.ByteLen != 300 || wc.SrcQP != a.qp.QPN() || wc.QPNum != b.qp.QPN() || wc.SLID != verbs.AHN(b.ah) ||
			wc.WCFlags != 0 {
			t.Fatalf("receive completion %+v", wc)
		}
		got := append(append([]byte{}, b.buf[1000:1100]...), b.buf[2000:2200]...)
		if !bytes.Equal(got, a.buf[:300]) {
			t.Fatal("scattered data differs")
		}
	}
}

func TestSendImmAndInline(t *testing.T) {
	a, b := newLoop(t, loopOpts{})
	pattern(a.buf[:32], 9)
	// SEND_WITH_IMM through QPEx, inline data.
	b.recv(1, 0, 64)
	check(t, a.post(2, b, func(x *verbs.QPEx) {
		x.WRSendImm(0xfeedf00d)
		x.WRSetInlineData(a.buf[:20])
	}))
	wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCSend)
	wc := b.one()
	if wc.WCFlags&verbs.WCWithImm == 0 || wc.ImmData != 0xfeedf00d || wc.ByteLen != 20 || !bytes.Equal(b.buf[:20], a.buf[:20]) {
		t.Fatalf("inline send with imm: %+v", wc)
	}
	// Inline list.
	b.recv(3, 0, 64)
	check(t, a.post(4, b, func(x *verbs.QPEx) {
		x.WRSend()
		x.WRSetInlineDataList([][]byte{a.buf[:5], a.buf[10:20]})
	}))
	wantWC(t, a.one(), 4, verbs.WCSuccess, verbs.WCSend)
	if wc := b.one(); wc.ByteLen != 15 || !bytes.Equal(b.buf[:15], append(append([]byte{}, a.buf[:5]...), a.buf[10:20]...)) {
		t.Fatalf("inline list: %+v", wc)
	}
	// ibv_post_send with IBV_SEND_INLINE takes the data from the SGEs' memory.
	b.recv(5, 0, 64)
	pattern(a.buf[100:132], 50)
	wr := verbs.SendWR{WRID: 6, SGList: []verbs.SGE{a.mr.SGE(100, 32)}, Opcode: verbs.WRSendWithImm, ImmData: 42,
		SendFlags: verbs.SendSignaled | verbs.SendInline, AH: a.ah, RemoteQPN: b.qp.QPN(), RemoteQKey: qkey}
	if _, err := a.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatal(err)
	}
	wantWC(t, a.one(), 6, verbs.WCSuccess, verbs.WCSend)
	if wc := b.one(); wc.ByteLen != 32 || wc.ImmData != 42 || !bytes.Equal(b.buf[:32], a.buf[100:132]) {
		t.Fatalf("post_send inline: %+v", wc)
	}
	// Zero-length SEND into an empty receive.
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 7}}); err != nil {
		t.Fatal(err)
	}
	check(t, a.post(8, b, func(x *verbs.QPEx) { x.WRSend(); x.WRSetSGEList(nil) }))
	wantWC(t, a.one(), 8, verbs.WCSuccess, verbs.WCSend)
	if wc := b.one(); wc.WRID != 7 || wc.ByteLen != 0 || wc.Status != verbs.WCSuccess {
		t.Fatalf("zero-length: %+v", wc)
	}
}

// Inline RDMA write needs INLINE_WRITE, which makes the WQEs 128 bytes.
func TestInlineRDMAWrite(t *testing.T) {
	a, b := newLoop(t, loopOpts{qpFlags: efadv.QPFlagsInlineWrite, access: verbs.AccessRemoteWrite,
		cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 80}})
	if sq, _, _ := efadv.QueryQPWQs(a.qp); sq.EntrySize != 128 {
		t.Fatalf("WQE size %d with INLINE_WRITE", sq.EntrySize)
	}
	pattern(a.buf[:80], 3)
	check(t, a.post(1, b, func(x *verbs.QPEx) {
		x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr()+100)
		x.WRSetInlineData(a.buf[:80])
	}))
	wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCRDMAWrite)
	if !bytes.Equal(b.buf[100:180], a.buf[:80]) {
		t.Fatal("inline write data differs")
	}
	// An RDMA read cannot be inline; an inline write without INLINE_WRITE is refused.
	wantErrno(t, a.post(2, b, func(x *verbs.QPEx) { x.WRRDMARead(b.mr.RKey(), b.mr.Addr()); x.WRSetInlineData(a.buf[:8]) }), syscall.EINVAL)
	c, d := newLoop(t, loopOpts{access: verbs.AccessRemoteWrite})
	wantErrno(t, c.post(3, d, func(x *verbs.QPEx) { x.WRRDMAWrite(d.mr.RKey(), d.mr.Addr()); x.WRSetInlineData(c.buf[:8]) }), syscall.EINVAL)
	a.empty()
	c.empty()
}

func TestRDMAReadWriteAndWriteImm(t *testing.T) {
	a, b := newLoop(t, loopOpts{access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead})
	pattern(b.buf, 11)
	check(t, a.post(1, b, func(x *verbs.QPEx) {
		x.WRRDMARead(b.mr.RKey(), b.mr.Addr()+10)
		x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 1000)
	}))
	wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend) // libefa reports reads as SEND
	if !bytes.Equal(a.buf[:1000], b.buf[10:1010]) {
		t.Fatal("read data differs")
	}
	pattern(a.buf, 99)
	b.recv(33, 0, 16)
	check(t, a.post(2, b, func(x *verbs.QPEx) {
		x.WRRDMAWriteImm(b.mr.RKey(), b.mr.Addr()+2048, 0xabcd)
		x.WRSetSGE(a.mr.LKey(), a.mr.Addr()+100, 2000)
	}))
	wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCRDMAWrite)
	wc := b.one()
	wantWC(t, wc, 33, verbs.WCSuccess, verbs.WCRecvRDMAWithImm)
	if wc.ByteLen != 2000 || wc.ImmData != 0xabcd || wc.WCFlags&verbs.WCWithImm == 0 {
		t.Fatalf("write-imm receive %+v", wc)
	}
	if !bytes.Equal(b.buf[2048:4048], a.buf[100:2100]) {
		t.Fatal("write data differs")
	}
	// Each QP counts its WRs, the write-imm's receive among b's receives; the device sums them.
	if c := a.qp.Counters(); c.RDMAReadWRs != 1 || c.RDMAReadBytes != 1000 || c.RDMAWriteWRs != 1 || c.RDMAWriteBytes != 2000 {
		t.Errorf("requester's QP counters %+v", c)
	}
	if c := b.qp.Counters(); c.RecvWRs != 1 || c.RecvBytes != 0 || c.RDMAWriteWRs != 0 {
		t.Errorf("responder's QP counters %+v", c)
	}
	if c := a.ctx.Counters(); c.RDMAReadWRs != 1 || c.RDMAReadBytes != 1000 || c.RDMAWriteWRs != 1 ||
		c.RDMAWriteBytes != 2000 || c.RecvWRs != 1 || c.RDMAReadRespBytes != 1000 || c.RDMAWriteRecvBytes != 2000 {
		t.Errorf("device counters %+v", c)
	}
	// Same-device traffic counts as the datagrams it would be: the read's request and its data,
	// the write's one datagram, each sent and received.
	if c, hdr := a.ctx.Counters(), uint64(wire.DatagramHeaderSize+wire.FrameHeaderSize+wire.DataHeaderSize); c.TxPkts != 3 ||
		c.RxPkts != 3 || c.TxBytes != 3000+3*hdr || c.RxBytes != c.TxBytes {
		t.Errorf("a read of 1000 bytes and a write of 2000 on one device: tx %d packets %d bytes, rx %d packets %d bytes; want 3 packets, %d bytes each way",
			c.TxPkts, c.TxBytes, c.RxPkts, c.RxBytes, 3000+3*hdr)
	}
}

// A same-device message counts in the device's tx and rx packets as the DATA datagrams it would
// take between two devices, at least one (a UD message one), each with its headers (a sealing
// device's too): hw_counters' tx_bytes and tx_pkts move for traffic that loops back inside the
// device, as programs of a host device expect (fabtests read them).
func TestLoopbackCounted(t *testing.T) {
	plain := uint64(wire.DatagramHeaderSize + wire.FrameHeaderSize + wire.DataHeaderSize)
	for _, c := range []struct {
		name string
		typ  verbs.QPType
		key  []byte
		hdr  uint64
	}{
		{"srd", verbs.QPTDriver, nil, plain},
		{"sealed", verbs.QPTDriver, testKey, plain + seal.Overhead},
		{"ud", verbs.QPTUD, nil, plain},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := newLoop(t, loopOpts{typ: c.typ, size: 32768, access: verbs.AccessRemoteWrite,
				cfg: func(d *config.Device) { d.PathMTU, d.Key = 1500, c.key }})
			seg := srd.SegSize(a.ctx.Device().PathMTU(), c.key != nil)
			sizes := []int{0, 1, seg, seg + 1, 3 * seg, 8 * seg}
			if c.typ == verbs.QPTUD {
				sizes = []int{0, 1, 3 * seg} // (no RDMA; one datagram however long)
			}
			for _, n := range sizes {
				before := a.ctx.Counters()
				pkts := uint64(max((n+seg-1)/seg, 1))
				if n <= 8192 { // (the device's MTU, a SEND's most)
					b.recv(1, 0, n+40) // (a UD receive's GRH first)
					check(t, a.post(2, b, func(x *verbs.QPEx) { x.WRSend(); x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(n)) }))
					wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCSend)
					wantWC(t, b.one(), 1, verbs.WCSuccess, verbs.WCRecv)
				} else {
					check(t, a.post(3, b, func(x *verbs.QPEx) {
						x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr())
						x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(n))
					}))
					wantWC(t, a.one(), 3, verbs.WCSuccess, verbs.WCRDMAWrite)
				}
				if c.typ == verbs.QPTUD {
					pkts = 1
				}
				after := a.ctx.Counters()
				bytes := uint64(n) + pkts*c.hdr
				if got := after.TxPkts - before.TxPkts; got != pkts || after.RxPkts-before.RxPkts != pkts {
					t.Errorf("%d bytes: %d packets sent, %d received; want %d", n, got, after.RxPkts-before.RxPkts, pkts)
				}
				if got := after.TxBytes - before.TxBytes; got != bytes || after.RxBytes-before.RxBytes != bytes {
					t.Errorf("%d bytes: %d bytes sent, %d received; want %d", n, got, after.RxBytes-before.RxBytes, bytes)
				}
			}
		})
	}
}

// Each error outcome is a per-WR status; the QP and the peer stay usable afterwards.
func TestErrorStatuses(t *testing.T) {
	a, b := newLoop(t, loopOpts{access: verbs.AccessRemoteRead, size: 16384,
		cfg: func(c *config.Device) { c.MaxRDMASize = 8192 }})
	ok := func() {
		t.Helper()
		b.recv(100, 0, 64)
		a.send(101, b, 0, 64)
		wantWC(t, a.one(), 101, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 100, verbs.WCSuccess, verbs.WCRecv)
	}
	cases := []struct {
		name   string
		setup  func()
		build  func(x *verbs.QPEx)
		dstQPN uint32
		qkey   uint32
		want   verbs.WCStatus
		vendor efaio.Status
	}{
		{"receiver SGL too short", func() { b.recv(1, 0, 10) }, func(x *verbs.QPEx) {
			x.WRSend()
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 100)
		}, 0, 0, verbs.WCRemInvReqErr, efaio.StatusRemoteBadLength},
		{"bad rkey", nil, func(x *verbs.QPEx) {
			x.WRRDMARead(b.mr.RKey()^1, b.mr.Addr())
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 100)
		}, 0, 0, verbs.WCRemAccessErr, efaio.StatusRemoteBadAddress},
		{"remote bounds", nil, func(x *verbs.QPEx) {
			x.WRRDMARead(b.mr.RKey(), b.mr.Addr()+16384-50)
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 100)
		}, 0, 0, verbs.WCRemAccessErr, efaio.StatusRemoteBadAddress},
		{"remote address wraps", nil, func(x *verbs.QPEx) {
			x.WRRDMARead(b.mr.RKey(), math.MaxUint64-10)
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 100)
		}, 0, 0, verbs.WCRemAccessErr, efaio.StatusRemoteBadAddress},
		{"no remote write access", nil, func(x *verbs.QPEx) {
			x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr())
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 100)
		}, 0, 0, verbs.WCRemAccessErr, efaio.StatusRemoteBadAddress},
		{"bad destination QPN", nil, func(x *verbs.QPEx) {
			x.WRSend()
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 10)
		}, 0xfff0, 0, verbs.WCRemInvRDReqErr, efaio.StatusRemoteBadDestQPN},
		{"qkey mismatch", nil, func(x *verbs.QPEx) {
			x.WRSend()
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 10)
		}, 0, qkey + 1, verbs.WCRemInvRDReqErr, efaio.StatusRemoteBadDestQPN},
		{"message over the MTU", nil, func(x *verbs.QPEx) {
			x.WRSend()
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 8193)
		}, 0, 0, verbs.WCLocLenErr, efaio.StatusLocalBadLength},
		{"RDMA over max_rdma_size", nil, func(x *verbs.QPEx) {
			x.WRRDMARead(b.mr.RKey(), b.mr.Addr())
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 8193)
		}, 0, 0, verbs.WCLocLenErr, efaio.StatusLocalBadLength},
		{"bad lkey", nil, func(x *verbs.QPEx) {
			x.WRSend()
			x.WRSetSGE(a.mr.LKey()^0x100, a.mr.Addr(), 10)
		}, 0, 0, verbs.WCLocProtErr, efaio.StatusLocalInvalidLKey},
		{"local bounds", nil, func(x *verbs.QPEx) {
			x.WRSend()
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr()+16380, 10)
		}, 0, 0, verbs.WCLocProtErr, efaio.StatusLocalInvalidLKey},
		{"lkey of another PD", nil, func(x *verbs.QPEx) {
			x.WRSend()
			x.WRSetSGE(b.mr.LKey(), b.mr.Addr(), 10)
		}, 0, 0, verbs.WCLocProtErr, efaio.StatusLocalInvalidLKey},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				c.setup()
			}
			wrid := uint64(1000 + i)
			a.x.WRStart()
			a.x.WRID, a.x.WRFlags = wrid, verbs.SendSignaled
			c.build(a.x)
			dst, k := b.qp.QPN(), uint32(qkey)
			if c.dstQPN != 0 {
				dst = c.dstQPN
			}
			if c.qkey != 0 {
				k = c.qkey
			}
			a.x.WRSetUDAddr(a.ah, dst, k)
			check(t, a.x.WRComplete())
			wc := a.one()
			op := verbs.WCSend
			if c.name == "no remote write access" {
				op = verbs.WCRDMAWrite
			}
			wantWC(t, wc, wrid, c.want, op)
			if efaio.Status(wc.VendorErr) != c.vendor {
				t.Fatalf("vendor_err %d, want %d (%v)", wc.VendorErr, c.vendor, c.vendor)
			}
			b.empty()
			if c.setup != nil { // the short receive is still posted: a fitting send lands in it
				a.send(2, b, 0, 10)
				wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCSend)
				wantWC(t, b.one(), 1, verbs.WCSuccess, verbs.WCRecv)
			}
			ok()
		})
	}
}

// RNR: with rnr_retry 7 a send waits for a receive however long it takes; with a finite count it
// fails with RNR_RETRY_EXC_ERR once the retries are spent.
func TestRNR(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := newLoop(t, loopOpts{rnrRetry: -1})
		a.send(1, b, 0, 100)
		time.Sleep(time.Second)
		a.empty() // still retrying after 1000 retry intervals
		b.recv(2, 0, 100)
		wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 2, verbs.WCSuccess, verbs.WCRecv)
	})
	for _, n := range []int{0, 3} {
		synctest.Test(t, func(t *testing.T) {
			a, b := newLoop(t, loopOpts{rnrRetry: n})
			start := time.Now()
			a.send(1, b, 0, 100)
			wc := a.one()
			wantWC(t, wc, 1, verbs.WCRNRRetryExcErr, verbs.WCSend)
			if efaio.Status(wc.VendorErr) != efaio.StatusRemoteRNR {
				t.Fatalf("vendor_err %d", wc.VendorErr)
			}
			if took := time.Since(start); took < time.Duration(n)*time.Millisecond {
				t.Fatalf("rnr_retry %d gave up after %v, before %d retry intervals", n, took, n)
			}
			b.empty()
		})
	}
}

// A WR whose AH is destroyed while it waits completes with INVALID_AH (LOC_QP_OP_ERR).
func TestAHDestroyedInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := newLoop(t, loopOpts{rnrRetry: -1})
		a.send(1, b, 0, 100)
		synctest.Wait()
		check(t, a.ah.Destroy())
		a.ah = nil
		b.recv(2, 0, 100)
		wc := a.one()
		wantWC(t, wc, 1, verbs.WCLocQPOpErr, verbs.WCSend)
		if efaio.Status(wc.VendorErr) != efaio.StatusLocalInvalidAH {
			t.Fatalf("vendor_err %d", wc.VendorErr)
		}
		time.Sleep(10 * time.Millisecond)
		b.empty()
	})
}

// Moving a QP to ERR completes every outstanding WR with WR_FLUSH_ERR and the WR's own wr_id.
// Destroying it flushes them too, but polling drops those entries (EINVAL), as libefa does.
func TestFlushOnDestroyAndErr(t *testing.T) {
	for _, destroy := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			a, b := newLoop(t, loopOpts{rnrRetry: -1})
			for i := range 3 {
				a.send(uint64(10+i), b, 0, 100)
			}
			a.recv(20, 0, 100)
			a.recv(21, 100, 100)
			synctest.Wait()
			a.empty()
			if destroy {
				check(t, a.qp.Destroy())
				a.qp = nil
			} else {
				check(t, a.qp.Modify(&verbs.QPAttr{QPState: verbs.QPSErr}, verbs.QPAttrState))
				_, err := a.qp.PostRecv([]verbs.RecvWR{{WRID: 1}})
				wantErrno(t, err, syscall.EINVAL)
				wantErrno(t, a.post(1, b, func(x *verbs.QPEx) { x.WRSend() }), syscall.EINVAL)
			}
			if destroy {
				waitDropped(t, a.cq, 5)
				a.empty()
				b.recv(30, 0, 100)
				time.Sleep(10 * time.Millisecond)
				b.empty() // nothing of the flushed sends arrives
				return
			}
			got := map[uint64]verbs.WCOpcode{}
			for _, wc := range waitWC(t, a.cq, 5) {
				if wc.Status != verbs.WCWRFlushErr {
					t.Fatalf("completion %+v, want flushed", wc)
				}
				got[wc.WRID] = wc.Opcode
			}
			want := map[uint64]verbs.WCOpcode{10: verbs.WCSend, 11: verbs.WCSend, 12: verbs.WCSend, 20: verbs.WCRecv, 21: verbs.WCRecv}
			for k, v := range want {
				if got[k] != v {
					t.Fatalf("flushed %v, want %v", got, want)
				}
			}
			b.recv(30, 0, 100)
			time.Sleep(10 * time.Millisecond)
			b.empty() // nothing of the flushed sends arrives
		})
	}
}

// A completion a destroyed QP left behind is dropped, as libefa drops it, also once a new QP holds
// the number: polling consumes it and reports EINVAL (CQ.BadCompletions), so the new QP never
// sees it under its number, however its WRs' request ids line up with the old QP's (the same pool
// index; with 64-bit request ids, the same wr_id). The new QP's own completions still work.
func TestStaleGenerationDropped(t *testing.T) {
	for _, id64 := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			a, b := newLoop(t, loopOpts{sameCtx: true, rnrRetry: -1,
				cfg: func(c *config.Device) { c.QPNTableSize = 4; c.RequestID64 = id64 }}) // QPNs 2 and 3 only
			a.send(1, b, 0, 100) // parked: b has no receive
			a.recv(2, 0, 100)
			synctest.Wait()
			old := a.qp.QPN()
			check(t, a.qp.Destroy()) // its two flushed completions wait in a.cq
			attr := verbs.QPInitAttrEx{SendCQ: a.cq, RecvCQ: a.cq, QPType: verbs.QPTDriver, PD: a.pd,
				Cap:      verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1},
				CompMask: verbs.QPInitAttrPD | verbs.QPInitAttrSendOpsFlags, SendOpsFlags: verbs.SendOpsSend}
			a.qp = must[*verbs.QP](t)(efadv.CreateQPEx(a.ctx, &attr, &efadv.QPInitAttr{}))
			if a.qp.QPN() != old {
				t.Fatalf("new QP got %d, want the freed %d", a.qp.QPN(), old)
			}
			a.x = must[*verbs.QPEx](t)(a.qp.ToQPEx())
			a.toRTS(-1)
			a.recv(2, 0, 100) // the index the old QP's receive had
			b.recv(3, 0, 100)
			a.send(1, b, 0, 100) // the index, and the wr_id, the old QP's send had
			synctest.Wait()
			wc := make([]verbs.WC, 4)
			for i := range 2 {
				if n, err := a.cq.Poll(wc); n != 0 || !errors.Is(err, syscall.EINVAL) {
					t.Fatalf("poll %d: %d completions (first %+v), %v; want the old QP's entries dropped with EINVAL", i, n, wc[0], err)
				}
			}
			if a.cq.BadCompletions() != 2 {
				t.Fatalf("%d completions dropped, want 2", a.cq.BadCompletions())
			}
			wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend)
			wantWC(t, b.one(), 3, verbs.WCSuccess, verbs.WCRecv)
			check(t, a.qp.Modify(&verbs.QPAttr{QPState: verbs.QPSErr}, verbs.QPAttrState))
			wantWC(t, a.one(), 2, verbs.WCWRFlushErr, verbs.WCRecv) // the new QP's receive, still outstanding
			a.empty()
		})
	}
}

// UD QPs: a GRH in front of the payload; undeliverable messages are dropped silently and the
// sender still succeeds.
func TestUDLoopback(t *testing.T) {
	a, b := newLoop(t, loopOpts{typ: verbs.QPTUD})
	pattern(a.buf[:100], 5)
	b.recv(1, 0, 200)
	a.send(2, b, 0, 100)
	wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCSend)
	wc := b.one()
	wantWC(t, wc, 1, verbs.WCSuccess, verbs.WCRecv)
	if wc.ByteLen != 140 || wc.WCFlags&verbs.WCGRH == 0 || !bytes.Equal(b.buf[40:140], a.buf[:100]) {
		t.Fatalf("UD receive %+v", wc)
	}
	if g := verbs.GID(b.buf[8:24]); g != a.ctx.Device().GID() || binary.BigEndian.Uint16(b.buf[4:]) != 100 {
		t.Fatalf("GRH source %v", g)
	}
	// No receive posted, wrong qkey: dropped, sender succeeds.
	a.send(3, b, 0, 100)
	wantWC(t, a.one(), 3, verbs.WCSuccess, verbs.WCSend)
	b.recv(4, 0, 200)
	check(t, a.post(5, b, func(x *verbs.QPEx) { x.WRSend(); x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 10) }))
	wantWC(t, a.one(), 5, verbs.WCSuccess, verbs.WCSend)
	wantWC(t, b.one(), 4, verbs.WCSuccess, verbs.WCRecv)
	a.x.WRStart()
	a.x.WRID, a.x.WRFlags = 6, verbs.SendSignaled
	a.x.WRSend()
	a.x.WRSetUDAddr(a.ah, b.qp.QPN(), qkey+1)
	a.x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 10)
	check(t, a.x.WRComplete())
	wantWC(t, a.one(), 6, verbs.WCSuccess, verbs.WCSend)
	b.recv(7, 0, 200)
	b.empty()
	if b.ctx.Counters().RxDrops < 2 {
		t.Fatalf("rx_drops %d", b.ctx.Counters().RxDrops)
	}
}

// In 64-bit request-id mode the SQ's completions echo the whole wr_id.
func TestRequestID64(t *testing.T) {
	a, b := newLoop(t, loopOpts{cfg: func(c *config.Device) { c.RequestID64 = true }})
	const id = 0xdeadbeef12345678
	b.recv(0x1122334455667788, 0, 64)
	a.send(id, b, 0, 64)
	wantWC(t, a.one(), id, verbs.WCSuccess, verbs.WCSend)
	wantWC(t, b.one(), 0x1122334455667788, verbs.WCSuccess, verbs.WCRecv)
	sq, _, _ := efadv.QueryQPWQs(a.qp)
	if sq.Caps&efadv.WQCaps64BitReqID == 0 {
		t.Fatal("SQ does not report 64-bit request ids")
	}
	slot := sq.Buffer[:64] // the first WQE stays in the ring: wr_id bits 16..63 ride in req_id_ex
	if binary.LittleEndian.Uint16(slot[0:]) != 0x5678 || binary.LittleEndian.Uint16(slot[26:]) != 0x1234 ||
		binary.LittleEndian.Uint32(slot[28:]) != 0xdeadbeef {
		t.Fatalf("WQE request id bytes % x", slot[:32])
	}
}

// Legacy ibv_post_send: SEND and SEND_WITH_IMM only, signaled only, known flags, SGE and inline
// limits; the failing WR's index comes back and those before it are posted.
func TestPostSendChecks(t *testing.T) {
	a, b := newLoop(t, loopOpts{cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 16}})
	good := verbs.SendWR{WRID: 1, SGList: []verbs.SGE{a.mr.SGE(0, 8)}, Opcode: verbs.WRSend, SendFlags: verbs.SendSignaled,
		AH: a.ah, RemoteQPN: b.qp.QPN(), RemoteQKey: qkey}
	for _, c := range []struct {
		name string
		mod  func(*verbs.SendWR)
	}{
		{"RDMA write opcode", func(w *verbs.SendWR) { w.Opcode = verbs.WRRDMAWrite }},
		{"RDMA read opcode", func(w *verbs.SendWR) { w.Opcode = verbs.WRRDMARead }},
		{"unsignaled", func(w *verbs.SendWR) { w.SendFlags = 0 }},
		{"fence", func(w *verbs.SendWR) { w.SendFlags |= verbs.SendFence }},
		{"two SGEs over max_send_sge 1", func(w *verbs.SendWR) { w.SGList = append(w.SGList, a.mr.SGE(8, 8)) }},
		{"inline over max_inline_data", func(w *verbs.SendWR) { w.SendFlags |= verbs.SendInline; w.SGList = []verbs.SGE{a.mr.SGE(0, 17)} }},
		{"inline outside a region", func(w *verbs.SendWR) {
			w.SendFlags |= verbs.SendInline
			w.SGList = []verbs.SGE{{Addr: 8, Length: 4, LKey: 99}}
		}},
		{"no AH", func(w *verbs.SendWR) { w.AH = nil }},
	} {
		bad := good
		c.mod(&bad)
		b.recv(9, 0, 64)
		n, err := a.qp.PostSend([]verbs.SendWR{good, bad, good})
		if n != 1 || !errorsIsEINVAL(err) {
			t.Fatalf("%s: index %d err %v, want 1 EINVAL", c.name, n, err)
		}
		wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend)
		wantWC(t, b.one(), 9, verbs.WCSuccess, verbs.WCRecv)
	}
}

func errorsIsEINVAL(err error) bool { return err != nil && errorsIs(err, syscall.EINVAL) }

// A session with an error or an abort posts nothing and leaks no slot; the next session works.
func TestSessionRollback(t *testing.T) {
	a, b := newLoop(t, loopOpts{cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 8}})
	for range 40 { // more than the SQ holds: a leak would show as ENOMEM
		a.x.WRStart()
		a.x.WRID, a.x.WRFlags = 1, verbs.SendSignaled
		a.x.WRSend()
		a.x.WRSetUDAddr(a.ah, b.qp.QPN(), qkey)
		a.x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 8)
		a.x.WRSend()
		a.x.WRSetInlineData(make([]byte, 9)) // over max_inline_data
		wantErrno(t, a.x.WRComplete(), syscall.EINVAL)
		a.x.WRStart()
		a.x.WRSend()
		a.x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 8)
		a.x.WRAbort()
	}
	a.empty()
	for i := range 16 {
		b.recv(uint64(i), 0, 8)
	}
	a.x.WRStart()
	for i := range 16 {
		a.x.WRID, a.x.WRFlags = uint64(100+i), verbs.SendSignaled
		a.x.WRSend()
		a.x.WRSetUDAddr(a.ah, b.qp.QPN(), qkey)
		a.x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 8)
	}
	check(t, a.x.WRComplete())
	seen := map[uint64]bool{}
	for _, wc := range waitWC(t, a.cq, 16) {
		if wc.Status != verbs.WCSuccess || seen[wc.WRID] {
			t.Fatalf("completion %+v", wc)
		}
		seen[wc.WRID] = true
	}
	waitWC(t, b.cq, 16)
	// An opcode the QP was not created with fails the session with EOPNOTSUPP.
	u, v := newLoop(t, loopOpts{typ: verbs.QPTUD})
	u.x.WRStart()
	u.x.WRRDMAWrite(v.mr.RKey(), v.mr.Addr())
	wantErrno(t, u.x.WRComplete(), syscall.EOPNOTSUPP)
	wantErrno(t, u.x.WRComplete(), syscall.EINVAL) // no session
}

// Processing hints land in ctrl3 of the WQE.
func TestProcessingHints(t *testing.T) {
	a, b := newLoop(t, loopOpts{})
	b.recv(1, 0, 64)
	check(t, a.post(2, b, func(x *verbs.QPEx) {
		x.WRSend()
		efadv.WRSetProcessingHints(efadv.QPFromIBVQPEx(x), efadv.WRProcessingHintBurstPPSSensitive)
		x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 64)
	}))
	wantWC(t, a.one(), 2, verbs.WCSuccess, verbs.WCSend)
	b.one()
	sq, _, _ := efadv.QueryQPWQs(a.qp)
	if efadv.ProcessingHints(sq.Buffer[14]) != efadv.WRProcessingHintBurstPPSSensitive {
		t.Fatalf("ctrl3 %#x", sq.Buffer[14])
	}
	// A QP without WITH_PROCESSING_HINTS refuses them.
	u, v := newLoop(t, loopOpts{typ: verbs.QPTUD})
	err := u.post(1, v, func(x *verbs.QPEx) {
		x.WRSend()
		efadv.WRSetProcessingHints(efadv.QPFromIBVQPEx(x), 1)
	})
	wantErrno(t, err, syscall.EOPNOTSUPP)
}

// Several goroutines post RDMA writes on one QP while two poll its CQ: every WR completes once.
func TestConcurrentPostAndPoll(t *testing.T) {
	a, b := newLoop(t, loopOpts{access: verbs.AccessRemoteWrite})
	const posters, each = 4, 300
	var wg sync.WaitGroup
	for p := range posters {
		wg.Go(func() {
			for i := range each {
				for {
					err := a.post(uint64(p*each+i), b, func(x *verbs.QPEx) {
						x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr()+uint64(p*64))
						x.WRSetSGE(a.mr.LKey(), a.mr.Addr()+uint64(p*64), 64)
					})
					if err == nil {
						break
					}
					if !errorsIs(err, syscall.ENOMEM) {
						t.Error(err)
						return
					}
					runtimeGosched()
				}
			}
		})
	}
	var mu sync.Mutex
	seen := map[uint64]int{}
	var pollers sync.WaitGroup
	done := make(chan struct{})
	for range 2 {
		pollers.Go(func() {
			var wc [16]verbs.WC
			for {
				n, err := a.cq.Poll(wc[:])
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, w := range wc[:n] {
					if w.Status != verbs.WCSuccess {
						t.Errorf("completion %+v", w)
					}
					seen[w.WRID]++
				}
				total := len(seen)
				mu.Unlock()
				if total == posters*each {
					return
				}
				select {
				case <-done:
					return
				default:
				}
				if n == 0 {
					runtimeGosched()
				}
			}
		})
	}
	wg.Wait()
	pollers.Wait()
	close(done)
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("wr_id %d completed %d times", id, n)
		}
	}
	if len(seen) != posters*each {
		t.Fatalf("%d completions, want %d", len(seen), posters*each)
	}
}

// The data path allocates nothing per work request in steady state: posting, the device's work
// and polling, for SEND through both APIs and for RDMA write.
func TestDataPathDoesNotAllocate(t *testing.T) {
	a, b := newLoop(t, loopOpts{access: verbs.AccessRemoteWrite})
	recv := []verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{b.mr.SGE(0, 256)}}}
	send := []verbs.SendWR{{WRID: 2, SGList: []verbs.SGE{a.mr.SGE(0, 256)}, Opcode: verbs.WRSend,
		SendFlags: verbs.SendSignaled, AH: a.ah, RemoteQPN: b.qp.QPN(), RemoteQKey: qkey}}
	wc := make([]verbs.WC, 1)
	wait := func(cq *verbs.CQ) { spinOne(t, cq, wc) }
	rkey, raddr := b.mr.RKey(), b.mr.Addr()
	lkey, laddr := a.mr.LKey(), a.mr.Addr()
	ops := map[string]func(){
		"post_send": func() {
			b.qp.PostRecv(recv)
			a.qp.PostSend(send)
			wait(a.cq)
			wait(b.cq)
		},
		"wr_send": func() {
			b.qp.PostRecv(recv)
			a.x.WRStart()
			a.x.WRID, a.x.WRFlags = 3, verbs.SendSignaled
			a.x.WRSend()
			a.x.WRSetUDAddr(a.ah, b.qp.QPN(), qkey)
			a.x.WRSetSGE(lkey, laddr, 256)
			a.x.WRComplete()
			wait(a.cq)
			wait(b.cq)
		},
		"wr_rdma_write": func() {
			a.x.WRStart()
			a.x.WRID, a.x.WRFlags = 4, verbs.SendSignaled
			a.x.WRRDMAWrite(rkey, raddr)
			a.x.WRSetUDAddr(a.ah, b.qp.QPN(), qkey)
			a.x.WRSetSGE(lkey, laddr, 4096)
			a.x.WRComplete()
			wait(a.cq)
		},
	}
	for name, op := range ops {
		op() // warm up: first use may grow internal slices
		if n := testing.AllocsPerRun(500, op); n != 0 {
			t.Errorf("%s: %.2f allocations per WR, want 0", name, n)
		}
	}
}

// A CQ that fills up loses the entry that does not fit: it is marked overrun, CQ_ERR is raised,
// and the entries already in it can still be polled.
func TestCQOverrun(t *testing.T) {
	a, b := newLoop(t, loopOpts{access: verbs.AccessRemoteWrite, cqe: 16,
		cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	for i := range 20 {
		check(t, a.post(uint64(i), b, func(x *verbs.QPEx) {
			x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr())
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 8)
		}))
	}
	ev, err := a.ctx.GetAsyncEvent(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if ev.Type != verbs.EventCQErr || ev.CQ != a.cq {
		t.Fatalf("event %+v, want CQ_ERR on the full CQ", ev)
	}
	if !a.cq.Overrun() || a.ctx.Counters().CQOverruns == 0 {
		t.Fatal("CQ not marked overrun")
	}
	for i, wc := range waitWC(t, a.cq, 16) {
		wantWC(t, wc, uint64(i), verbs.WCSuccess, verbs.WCRDMAWrite)
	}
	a.empty()
}

// RTS→SQD with EN_SQD_ASYNC_NOTIFY raises SQ_DRAINED once nothing is in flight.
func TestSQDrained(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := newLoop(t, loopOpts{rnrRetry: -1})
		a.send(1, b, 0, 64) // waits for a receive
		synctest.Wait()
		check(t, a.qp.Modify(&verbs.QPAttr{QPState: verbs.QPSSQD, EnSQDAsyncNotify: true},
			verbs.QPAttrState|verbs.QPAttrEnSQDAsyncNotify))
		if at, _, _ := a.qp.Query(verbs.QPAttrState); !at.SQDraining {
			t.Fatal("SQD with a WR in flight is not draining")
		}
		b.recv(2, 0, 64)
		ev, err := a.ctx.GetAsyncEvent(t.Context())
		if err != nil || ev.Type != verbs.EventSQDrained || ev.QP != a.qp {
			t.Fatalf("event %+v, %v", ev, err)
		}
		wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend)
	})
}

// A region deregistered while work requests still name it: they fail their key check.
func TestDeregisteredRegion(t *testing.T) {
	a, b := newLoop(t, loopOpts{access: verbs.AccessRemoteWrite})
	extra := must[*verbs.MR](t)(a.pd.RegMR(make([]byte, 64), verbs.AccessLocalWrite))
	lkey, addr := extra.LKey(), extra.Addr()
	check(t, extra.Dereg())
	b.recv(1, 0, 64)
	check(t, a.post(2, b, func(x *verbs.QPEx) { x.WRSend(); x.WRSetSGE(lkey, addr, 64) }))
	wantWC(t, a.one(), 2, verbs.WCLocProtErr, verbs.WCSend)
	b.empty()
}

// GetCQEvent waits until an armed CQ gets a completion, and returns when its context ends.
func TestCompletionChannel(t *testing.T) {
	a, b := newLoop(t, loopOpts{})
	ch := must[*verbs.CompChannel](t)(b.ctx.CreateCompChannel())
	cq := must[*verbs.CQ](t)(b.ctx.CreateCQ(8, nil, ch, 0))
	ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
	defer cancel()
	if _, err := ch.GetCQEvent(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("GetCQEvent on an idle channel: %v", err)
	}
	check(t, cq.ReqNotify(false))
	attr := verbs.QPInitAttrEx{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTDriver, PD: b.pd, CompMask: verbs.QPInitAttrPD,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}}
	qp := must[*verbs.QP](t)(efadv.CreateQPEx(b.ctx, &attr, &efadv.QPInitAttr{}))
	e := &end{t: t, qp: qp}
	e.toRTS(-1)
	must[int](t)(qp.PostRecv([]verbs.RecvWR{{WRID: 9, SGList: []verbs.SGE{b.mr.SGE(0, 64)}}}))
	a.send(1, &end{qp: qp}, 0, 64)
	got, err := ch.GetCQEvent(t.Context())
	if err != nil || got != cq {
		t.Fatalf("event for %p (%v), want %p", got, err, cq)
	}
	wantErrno(t, cq.Destroy(), syscall.EBUSY) // the event is not acknowledged yet
	cq.AckEvents(1)
	wantWC(t, waitWC(t, cq, 1)[0], 9, verbs.WCSuccess, verbs.WCRecv)
	wantWC(t, a.one(), 1, verbs.WCSuccess, verbs.WCSend)
	check(t, qp.Destroy())
	check(t, cq.Destroy())
	check(t, ch.Destroy())
}

// The extended CQ's read functions report what Poll's WC reports, at the same widths: two equal
// sends, one completion read each way.
func TestExtendedPollAgreesWithPoll(t *testing.T) {
	a, b := newLoop(t, loopOpts{})
	for i := range 2 {
		b.recv(uint64(10+i), 0, 100)
		a.send(uint64(i), b, 0, 100)
		wantWC(t, a.one(), uint64(i), verbs.WCSuccess, verbs.WCSend)
	}
	wc := b.one()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := b.cq.StartPoll(verbs.PollCQAttr{})
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.ENOENT) || time.Now().After(deadline) {
			t.Fatalf("start_poll: %v", err)
		}
		runtimeGosched()
	}
	defer b.cq.EndPoll()
	var slid uint16 = b.cq.ReadSLID() // the same type as WC.SLID
	if b.cq.WRID() != 11 || b.cq.Status() != wc.Status || b.cq.ReadOpcode() != wc.Opcode ||
		b.cq.ReadByteLen() != wc.ByteLen || b.cq.ReadSrcQP() != wc.SrcQP || b.cq.ReadQPNum() != wc.QPNum ||
		slid != wc.SLID || b.cq.ReadWCFlags() != wc.WCFlags {
		t.Fatalf("extended poll: wr_id %d status %v opcode %v len %d src_qp %d qp %d slid %d flags %v; Poll: %+v",
			b.cq.WRID(), b.cq.Status(), b.cq.ReadOpcode(), b.cq.ReadByteLen(), b.cq.ReadSrcQP(), b.cq.ReadQPNum(),
			slid, b.cq.ReadWCFlags(), wc)
	}
}
