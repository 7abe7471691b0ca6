package verbs_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/link/memlink"
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

// BenchmarkDrivenStream64 is the CPU a 64-byte SEND costs both devices together, without system
// calls or scheduling: two devices driven by the benchmark's goroutine on an in-memory fabric
// that delivers at once, a window of 64 SENDs kept posted (each free slot filled by one post of a
// list), receives reposted as they complete. ns/op is per message, for both ends.
func BenchmarkDrivenStream64(b *testing.B) {
	f := memlink.NewSim(1)
	var devs []*verbs.Device
	drive := func(c *config.Device) {
		drivenConfig(c, f, 1, byte(len(devs)))
	}
	cap := verbs.QPCap{MaxSendWR: 128, MaxRecvWR: 128, MaxSendSGE: 1, MaxRecvSGE: 1}
	s, r := memPair(b, f, 1, loopOpts{cfg: drive, cap: cap, cqe: 1024, iova: 1 << 40})
	devs = append(devs, s.ctx.Device(), r.ctx.Device())
	const window = 64
	recv := []verbs.RecvWR{{SGList: []verbs.SGE{r.mr.SGE(0, 64)}}}
	for i := range 2 * window {
		recv[0].WRID = uint64(i)
		if _, err := r.qp.PostRecv(recv); err != nil {
			b.Fatal(err)
		}
	}
	send := make([]verbs.SendWR, window)
	for i := range send {
		send[i] = verbs.SendWR{SGList: []verbs.SGE{s.mr.SGE(0, 64)}, Opcode: verbs.WRSend,
			SendFlags: verbs.SendSignaled, AH: s.ah, RemoteQPN: r.qp.QPN(), RemoteQKey: qkey}
	}
	var wc [64]verbs.WC
	inFlight, sent, done := 0, 0, 0
	step := func() {
		// As many as the window has room for, in one post (one doorbell), as perftest posts
		// lists of them.
		if k := min(window-inFlight, b.N-sent); k > 0 {
			if _, err := s.qp.PostSend(send[:k]); err != nil {
				b.Fatal(err)
			}
			inFlight += k
			sent += k
		}
		worked := false
		for _, d := range devs {
			worked = d.Drive() || worked
		}
		if !worked {
			f.Advance(100 * time.Microsecond)
		}
		n, _ := s.cq.Poll(wc[:])
		for _, c := range wc[:n] {
			if c.Status != verbs.WCSuccess {
				b.Fatalf("send completion %+v", c)
			}
		}
		inFlight -= n
		done += n
		n, _ = r.cq.Poll(wc[:])
		for _, c := range wc[:n] {
			recv[0].WRID = c.WRID
			if _, err := r.qp.PostRecv(recv); err != nil {
				b.Fatal(err)
			}
		}
	}
	for range 1000 { // (the window and the peers' state grow first)
		step()
	}
	sent, done = 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	for done < b.N {
		step()
	}
	b.StopTimer()
	b.ReportMetric(float64(s.ctx.Counters().TxPkts)/float64(b.N), "txpkts/op")
}
