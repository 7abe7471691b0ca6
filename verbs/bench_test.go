package verbs_test

import (
	"runtime"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/verbs"
)

// BenchmarkUDPSendLatency is one 64-byte SEND and its completion at both ends, over UDP on
// loopback: a ping, not a ping-pong.
func BenchmarkUDPSendLatency(b *testing.B) {
	a, c := newRemotePair(b, config.Device{Addr: loopback}, config.Device{Addr: loopback}, loopOpts{size: 1 << 16})
	var wc [1]verbs.WC
	wait := func(cq *verbs.CQ) {
		for {
			if n, _ := cq.Poll(wc[:]); n == 1 {
				if wc[0].Status != verbs.WCSuccess {
					b.Fatalf("completion %+v", wc[0])
				}
				return
			}
			runtime.Gosched()
		}
	}
	recv := []verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{c.mr.SGE(0, benchSize)}}}
	send := []verbs.SendWR{{WRID: 2, SGList: []verbs.SGE{a.mr.SGE(0, benchSize)}, Opcode: verbs.WRSend,
		SendFlags: verbs.SendSignaled, AH: a.ah, RemoteQPN: c.qp.QPN(), RemoteQKey: qkey}}
	b.ResetTimer()
	for range b.N {
		c.qp.PostRecv(recv)
		a.qp.PostSend(send)
		wait(a.cq)
		wait(c.cq)
	}
	b.StopTimer()
	ca := a.ctx.Counters()
	b.ReportMetric(float64(ca.RetransPkts)/float64(b.N), "retrans/op")
	b.ReportMetric(float64(ca.RetransTimeoutEvents)/float64(b.N), "rto/op")
	b.ReportMetric(float64(ca.TxPkts)/float64(b.N), "txpkts/op")
}

var benchSize = 4096
