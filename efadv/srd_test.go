package efadv_test

import (
	"syscall"
	"testing"

	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

// Go ports of rdma-core's tests/test_efa_srd.py. Each checks what the original checks.

func sendEx(op verbs.WROpcode) func(r *srdRes, i int) {
	return func(r *srdRes, i int) { r.sentImm = op != verbs.WRSend; r.sendEx(i, op) }
}

func sendOld(op verbs.WROpcode) func(r *srdRes, i int) {
	return func(r *srdRes, i int) { r.sentImm = op != verbs.WRSend; r.sendOld(i, op) }
}

// CqEventsSRDTestCase.test_cq_events_srd: 8 QPs, a CQ with a completion channel armed up front,
// traffic with old and new sends, each poll after get_cq_event and req_notify.
func TestCQEventsSRD(t *testing.T) {
	for _, sub := range []struct {
		name string
		send func(*srdRes, int)
	}{{"old", sendOld(verbs.WRSend)}, {"new", sendEx(verbs.WRSend)}} {
		t.Run(sub.name, func(t *testing.T) {
			dev := newDevice(t, nil)
			client, server := pair(t, dev, srdOpts{msgSize: 1024, sendOps: verbs.SendOpsSend, channel: true})
			for _, r := range []*srdRes{client, server} {
				if err := r.cq.ReqNotify(false); err != nil {
					t.Fatal(err)
				}
			}
			traffic(t, client, server, 10, sub.send)
		})
	}
}

func TestQPExSRDSend(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{msgSize: 1024, sendOps: verbs.SendOpsSend})
	traffic(t, client, server, 100, sendEx(verbs.WRSend))
}

func TestQPExSRDSendImm(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{msgSize: 1024, sendOps: verbs.SendOpsSendWithImm})
	traffic(t, client, server, 100, sendEx(verbs.WRSendWithImm))
}

func TestQPExSRDOldSend(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{msgSize: 1024})
	traffic(t, client, server, 100, sendOld(verbs.WRSend))
}

func TestQPExSRDOldSendImm(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{msgSize: 1024})
	traffic(t, client, server, 100, sendOld(verbs.WRSendWithImm))
}

func TestQPExSRDZeroSize(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{msgSize: 0, sendOps: verbs.SendOpsSend})
	traffic(t, client, server, 10, sendEx(verbs.WRSend))
}

// rdmaTraffic is efa_base.py's rdma_traffic on QP 0: memory filled with 'c' (client) and 's'
// (server), an RDMA op from the client, only the initiator's CQ polled, then the reverse.
func rdmaTraffic(t *testing.T, client, server *srdRes, read bool) {
	for range 10 {
		for _, dir := range [][2]*srdRes{{client, server}, {server, client}} {
			a, b := dir[0], dir[1]
			fill(a.buf, 'c')
			fill(b.buf, 's')
			x, err := a.qps[0].ToQPEx()
			check(t, err)
			x.WRStart()
			x.WRID, x.WRFlags = 0x123, verbs.SendSignaled
			if read {
				x.WRRDMARead(b.mr.RKey(), b.mr.Addr())
			} else {
				x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr())
			}
			x.WRSetUDAddr(a.ahs[0], b.qps[0].QPN(), srdQKey)
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(len(a.buf)))
			if err := x.WRComplete(); err != nil {
				t.Fatal(err)
			}
			wc := waitWC(t, a.cq, 1)
			wantSuccess(t, wc)
			if read {
				if wc[0].Opcode != verbs.WCSend {
					t.Fatalf("RDMA read completed as %v, want SEND as libefa reports", wc[0].Opcode)
				}
				wantBuf(t, a.buf, 's')
			} else {
				if wc[0].Opcode != verbs.WCRDMAWrite {
					t.Fatalf("RDMA write completed as %v", wc[0].Opcode)
				}
				wantBuf(t, b.buf, 'c')
			}
		}
	}
}

func TestQPExSRDRDMARead(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{qpCount: 1, msgSize: 1024, access: verbs.AccessRemoteRead,
		sendOps: verbs.SendOpsRDMARead})
	rdmaTraffic(t, client, server, true)
}

func TestQPExSRDRDMAWrite(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{qpCount: 1, msgSize: 1024, access: verbs.AccessRemoteWrite,
		sendOps: verbs.SendOpsRDMAWrite})
	rdmaTraffic(t, client, server, false)
}

// test_qp_ex_srd_rdma_write_with_imm: traffic() with RDMA_WRITE_WITH_IMM; data lands in the peer
// MR, the receive completion is RECV_RDMA_WITH_IMM with the immediate and consumes a receive WR.
func TestQPExSRDRDMAWriteWithImm(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{msgSize: 1024, access: verbs.AccessRemoteWrite,
		sendOps: verbs.SendOpsRDMAWriteWithImm})
	traffic(t, client, server, 10, sendEx(verbs.WRRDMAWriteWithImm))
}

// test_qp_ex_srd_rdma_unsolicited_write_with_imm: no receives on the server; its completion is
// successful, carries the immediate, is unsolicited, and its MR holds the client's data.
func TestQPExSRDRDMAUnsolicitedWriteWithImm(t *testing.T) {
	dev := newDevice(t, nil)
	o := srdOpts{qpCount: 1, msgSize: 1024, access: verbs.AccessRemoteWrite, sendOps: verbs.SendOpsRDMAWriteWithImm,
		qpFlags: efadv.QPFlagsUnsolicitedWriteRecv, cqWCFlags: efadv.WCExWithIsUnsolicited}
	client, server := pair(t, dev, o)
	fill(client.buf, 'c')
	client.sendEx(0, verbs.WRRDMAWriteWithImm)
	wantSuccess(t, waitWC(t, client.cq, 1))
	if err := pollStart(t, server.cq); err != nil {
		t.Fatal(err)
	}
	defer server.cq.EndPoll()
	switch {
	case server.cq.Status() != verbs.WCSuccess:
		t.Fatalf("status %v", server.cq.Status())
	case server.cq.ReadOpcode() != verbs.WCRecvRDMAWithImm:
		t.Fatalf("opcode %v", server.cq.ReadOpcode())
	case server.cq.ReadImmData() != immData || server.cq.ReadWCFlags()&verbs.WCWithImm == 0:
		t.Fatalf("immediate %#x", server.cq.ReadImmData())
	case !efadv.WCIsUnsolicited(efadv.CQFromIBVCQEx(server.cq)):
		t.Fatal("completion not flagged unsolicited")
	case server.cq.WRID() != 0:
		t.Fatalf("unsolicited completion has wr_id %#x, want 0", server.cq.WRID())
	case server.cq.ReadByteLen() != 1024:
		t.Fatalf("byte_len %d", server.cq.ReadByteLen())
	}
	wantBuf(t, server.buf, 'c')
}

// pollStart is poll_cq_ex's start_poll with retry on ENOENT.
func pollStart(t testing.TB, cq *verbs.CQ) error {
	t.Helper()
	b := newBackoff(t)
	for {
		err := cq.StartPoll(verbs.PollCQAttr{})
		if err != syscall.ENOENT {
			return err
		}
		b.wait("completion")
	}
}

// test_post_receive_qp_state_bad_flow: a QP moved to RESET refuses receives with EINVAL.
func TestPostReceiveQPStateBadFlow(t *testing.T) {
	dev := newDevice(t, nil)
	_, server := pair(t, dev, srdOpts{qpCount: 1, msgSize: 1024})
	qp := server.qps[0]
	if err := qp.Modify(&verbs.QPAttr{QPState: verbs.QPSReset, CurQPState: verbs.QPSRTS}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	_, err := qp.PostRecv([]verbs.RecvWR{{SGList: []verbs.SGE{server.mr.SGE(0, 1024)}}})
	wantErrno(t, err, syscall.EINVAL)
}

// test_post_send_qp_state_bad_flow: a QP moved to RESET fails a new-API send with EINVAL.
func TestPostSendQPStateBadFlow(t *testing.T) {
	dev := newDevice(t, nil)
	client, _ := pair(t, dev, srdOpts{qpCount: 1, msgSize: 1024, sendOps: verbs.SendOpsSend})
	qp := client.qps[0]
	if err := qp.Modify(&verbs.QPAttr{QPState: verbs.QPSReset}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	x, err := qp.ToQPEx()
	check(t, err)
	x.WRStart()
	x.WRID, x.WRFlags = 0x123, verbs.SendSignaled
	x.WRSend()
	x.WRSetUDAddr(client.ahs[0], client.remote.qps[0].QPN(), srdQKey)
	x.WRSetSGE(client.mr.LKey(), client.mr.Addr(), 1024)
	wantErrno(t, x.WRComplete(), syscall.EINVAL)
}

// test_full_rq_bad_flow: max_recv_wr (rounded, read back with query_qp) receives fit, one more is
// ENOMEM.
func TestFullRQBadFlow(t *testing.T) {
	dev := newDevice(t, nil)
	_, server := pair(t, dev, srdOpts{qpCount: 1, msgSize: 1024})
	qp := server.qps[0]
	_, init, err := qp.Query(verbs.QPAttrCap)
	if err != nil {
		t.Fatal(err)
	}
	n := int(init.Cap.MaxRecvWR)
	if n != 1024 {
		t.Fatalf("max_recv_wr %d, want 1000 rounded to 1024", n)
	}
	var err2 error
	for i := range n + 1 {
		_, err2 = qp.PostRecv([]verbs.RecvWR{{SGList: []verbs.SGE{server.mr.SGE(0, 1024)}}})
		if err2 != nil && i < n {
			t.Fatalf("receive %d of %d: %v", i, n, err2)
		}
	}
	wantErrno(t, err2, syscall.ENOMEM)
}

// test_full_sq_bad_flow: max_send_wr new-API sends without polling fit, one more is ENOMEM.
func TestFullSQBadFlow(t *testing.T) {
	dev := newDevice(t, nil)
	client, server := pair(t, dev, srdOpts{qpCount: 1, msgSize: 1024, sendOps: verbs.SendOpsSend})
	qp := client.qps[0]
	_, init, err := qp.Query(verbs.QPAttrCap)
	if err != nil {
		t.Fatal(err)
	}
	n := int(init.Cap.MaxSendWR)
	for range n {
		server.postRecv(server.qps[0]) // not needed for the check; keeps the sends from waiting on RNR
	}
	var last error
	for i := range n + 1 {
		x, err := qp.ToQPEx()
		check(t, err)
		x.WRStart()
		x.WRID, x.WRFlags = uint64(i), verbs.SendSignaled
		x.WRSend()
		x.WRSetUDAddr(client.ahs[0], server.qps[0].QPN(), srdQKey)
		x.WRSetSGE(client.mr.LKey(), client.mr.Addr(), 1024)
		last = x.WRComplete()
		if last != nil && i < n {
			t.Fatalf("send %d of %d: %v", i, n, last)
		}
	}
	wantErrno(t, last, syscall.ENOMEM)
	wantSuccess(t, waitWC(t, client.cq, n)) // polling frees the slots
}

// test_rq_with_larger_sgl_bad_flow: a receive with max_recv_sge+1 SGEs is EINVAL.
func TestRQWithLargerSGLBadFlow(t *testing.T) {
	dev := newDevice(t, nil)
	_, server := pair(t, dev, srdOpts{qpCount: 1, msgSize: 1024})
	sge := server.mr.SGE(0, 512)
	_, err := server.qps[0].PostRecv([]verbs.RecvWR{{SGList: []verbs.SGE{sge, sge}}})
	wantErrno(t, err, syscall.EINVAL)
}
