package main

import (
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"text/tabwriter"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

const demoQKey = 0x5eed

// side is one end of the demo: a context with a PD, CQ, MR and one SRD QP at RTS.
type side struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
	mr  *verbs.MR
	buf []byte
	qp  *verbs.QP
	x   *verbs.QPEx
	ah  *verbs.AH
}

func newSide(dev *verbs.Device, size int) (*side, error) {
	s := &side{}
	var err error
	if s.ctx, err = dev.Open(); err != nil {
		return nil, err
	}
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if s.cq, err = s.ctx.CreateCQ(1024, nil, nil, 0); err != nil {
		return nil, err
	}
	s.buf = make([]byte, size)
	access := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead
	if s.mr, err = s.pd.RegMR(s.buf, access); err != nil {
		return nil, err
	}
	attr := verbs.QPInitAttrEx{
		SendCQ: s.cq, RecvCQ: s.cq, QPType: verbs.QPTDriver, PD: s.pd,
		Cap:      verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 1, MaxRecvSGE: 1},
		CompMask: verbs.QPInitAttrPD | verbs.QPInitAttrSendOpsFlags,
		SendOpsFlags: verbs.SendOpsSend | verbs.SendOpsSendWithImm | verbs.SendOpsRDMAWrite |
			verbs.SendOpsRDMAWriteWithImm | verbs.SendOpsRDMARead,
	}
	if s.qp, err = efadv.CreateQPEx(s.ctx, &attr, &efadv.QPInitAttr{DriverQPType: efadv.QPDriverTypeSRD}); err != nil {
		return nil, err
	}
	s.x = s.qp.ToQPEx()
	steps := []struct {
		a verbs.QPAttr
		m verbs.QPAttrMask
	}{
		{verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: demoQKey},
			verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{QPState: verbs.QPSRTS, SQPSN: rand.Uint32() & 0xffffff}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	}
	for _, st := range steps {
		if err := s.qp.Modify(&st.a, st.m); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (s *side) connect(peer verbs.GID) error {
	var err error
	s.ah, err = s.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: peer}, PortNum: 1})
	return err
}

func (s *side) close() {
	for _, f := range []func() error{s.ah.Destroy, s.qp.Destroy, s.mr.Dereg, s.cq.Destroy, s.pd.Dealloc, s.ctx.Close} {
		if err := f(); err != nil {
			fmt.Fprintln(os.Stderr, "softefa demo: cleanup:", err)
		}
	}
}

// wait polls for one completion and checks its status.
func (s *side) wait(deadline time.Time) (verbs.WC, error) {
	var wc [1]verbs.WC
	for spins := 0; ; spins++ {
		n, err := s.cq.Poll(wc[:])
		if err != nil {
			return wc[0], err
		}
		if n == 1 {
			if wc[0].Status != verbs.WCSuccess {
				return wc[0], fmt.Errorf("completion of wr_id %d: %v (EFA status %d)", wc[0].WRID, wc[0].Status, wc[0].VendorErr)
			}
			return wc[0], nil
		}
		if time.Now().After(deadline) {
			return wc[0], errors.New("no completion within 10 s")
		}
		if spins > 100 {
			runtime.Gosched()
		}
	}
}

type demoOp struct {
	name string
	run  func(a, b *side, i, size int, deadline time.Time) error
}

func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	iters := fs.Int("n", 1000, "work requests per operation")
	size := fs.Int("s", 4096, "message size in bytes (SEND ≤ the 8 KiB MTU)")
	rdma := fs.Int("rdma", 1<<20, "RDMA transfer size in bytes")
	same := fs.Bool("same-device", false, "run both ends on one device (no network)")
	addr := fs.String("addr", "127.0.0.1:0", "UDP address each device binds (port 0: any)")
	paths := fs.Int("paths", 4, "paths (UDP source ports) per device")
	pathMTU := fs.Int("mtu", 1500, "path MTU: SRD segments fit it")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *size > 8192 || *size < 4 {
		return fmt.Errorf("-s %d: SEND messages are 4 to 8192 bytes", *size)
	}
	devs := make([]*verbs.Device, 2)
	for i := range devs {
		if *same && i == 1 {
			devs[1] = devs[0]
			break
		}
		cfg := config.Device{Name: fmt.Sprintf("efa_demo%d", i), Paths: *paths, PathMTU: *pathMTU}
		if !*same {
			cfg.Addr = netip.MustParseAddrPort(*addr)
		}
		dev, err := verbs.NewDevice(cfg)
		if err != nil {
			return err
		}
		defer dev.Close()
		devs[i] = dev
	}
	a, err := newSide(devs[0], max(*rdma, *size))
	if err != nil {
		return err
	}
	defer a.close()
	b, err := newSide(devs[1], max(*rdma, *size))
	if err != nil {
		return err
	}
	defer b.close()
	if err := a.connect(devs[1].GID()); err != nil {
		return err
	}
	if err := b.connect(devs[0].GID()); err != nil {
		return err
	}
	if *same {
		fmt.Printf("softefa demo: device %s, GID %v, QP %d -> QP %d (same device, two contexts)\n",
			devs[0].Name(), devs[0].GID(), a.qp.QPN(), b.qp.QPN())
	} else {
		fmt.Printf("softefa demo: SRD over UDP, %d paths, path MTU %d\n  %s %v QP %d  ->  %s %v QP %d\n",
			*paths, *pathMTU, devs[0].Name(), devs[0].Addr(), a.qp.QPN(), devs[1].Name(), devs[1].Addr(), b.qp.QPN())
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "operation\tWRs\tbytes/WR\ttotal µs\tµs/WR\tMB/s\tchecked\t")
	for _, op := range demoOps() {
		n, sz := *iters, *size
		if op.name == "RDMA_WRITE (large)" || op.name == "RDMA_READ (large)" {
			n, sz = max(*iters/100, 1), *rdma
		}
		start := time.Now()
		for i := range n {
			if err := op.run(a, b, i, sz, time.Now().Add(10*time.Second)); err != nil {
				tw.Flush()
				return fmt.Errorf("%s #%d: %w", op.name, i, err)
			}
		}
		el := time.Since(start)
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.2f\t%.1f\tyes\t\n", op.name, n, sz, float64(el.Microseconds()),
			float64(el.Nanoseconds())/float64(n)/1e3, float64(n*sz)/el.Seconds()/1e6)
	}
	tw.Flush()
	c := a.ctx.Counters()
	fmt.Printf("requester: send_wrs %d rdma_write_wrs %d rdma_read_wrs %d tx_pkts %d rx_pkts %d retrans_pkts %d, errors 0\n",
		c.SendWRs, c.RDMAWriteWRs, c.RDMAReadWRs, c.TxPkts, c.RxPkts, c.RetransPkts)
	return nil
}

// fillSeq writes a pattern seeded by i and returns its CRC32.
func fillSeq(b []byte, i int) uint32 {
	r := rand.NewPCG(uint64(i), 0x5eed)
	for j := 0; j+8 <= len(b); j += 8 {
		v := r.Uint64()
		for k := range 8 {
			b[j+k] = byte(v >> (8 * k))
		}
	}
	return crc32.ChecksumIEEE(b)
}

func sendOp(withImm bool) func(a, b *side, i, size int, deadline time.Time) error {
	return func(a, b *side, i, size int, deadline time.Time) error {
		if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{b.mr.SGE(0, size)}}}); err != nil {
			return err
		}
		sum := fillSeq(a.buf[:size], i)
		a.x.WRStart()
		a.x.WRID, a.x.WRFlags = uint64(i), verbs.SendSignaled
		if withImm {
			a.x.WRSendImm(uint32(i))
		} else {
			a.x.WRSend()
		}
		a.x.WRSetUDAddr(a.ah, b.qp.QPN(), demoQKey)
		a.x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(size))
		if err := a.x.WRComplete(); err != nil {
			return err
		}
		if _, err := a.wait(deadline); err != nil {
			return err
		}
		wc, err := b.wait(deadline)
		if err != nil {
			return err
		}
		if int(wc.ByteLen) != size || crc32.ChecksumIEEE(b.buf[:size]) != sum || withImm && wc.ImmData != uint32(i) {
			return fmt.Errorf("received %d bytes, imm %d: data or immediate differ", wc.ByteLen, wc.ImmData)
		}
		return nil
	}
}

func rdmaOp(read, withImm bool) func(a, b *side, i, size int, deadline time.Time) error {
	return func(a, b *side, i, size int, deadline time.Time) error {
		var sum uint32
		if read {
			sum = fillSeq(b.buf[:size], i)
		} else {
			sum = fillSeq(a.buf[:size], i)
		}
		if withImm {
			if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{b.mr.SGE(0, 0)}}}); err != nil {
				return err
			}
		}
		a.x.WRStart()
		a.x.WRID, a.x.WRFlags = uint64(i), verbs.SendSignaled
		switch {
		case read:
			a.x.WRRDMARead(b.mr.RKey(), b.mr.Addr())
		case withImm:
			a.x.WRRDMAWriteImm(b.mr.RKey(), b.mr.Addr(), uint32(i))
		default:
			a.x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr())
		}
		a.x.WRSetUDAddr(a.ah, b.qp.QPN(), demoQKey)
		a.x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(size))
		if err := a.x.WRComplete(); err != nil {
			return err
		}
		if _, err := a.wait(deadline); err != nil {
			return err
		}
		if withImm {
			wc, err := b.wait(deadline)
			if err != nil {
				return err
			}
			if wc.ImmData != uint32(i) || int(wc.ByteLen) != size {
				return fmt.Errorf("write-with-imm completion %+v", wc)
			}
		}
		got := b.buf[:size]
		if read {
			got = a.buf[:size]
		}
		if crc32.ChecksumIEEE(got) != sum {
			return errors.New("data differs after the transfer")
		}
		return nil
	}
}

func demoOps() []demoOp {
	return []demoOp{
		{"SEND", sendOp(false)},
		{"SEND_WITH_IMM", sendOp(true)},
		{"RDMA_WRITE", rdmaOp(false, false)},
		{"RDMA_WRITE_WITH_IMM", rdmaOp(false, true)},
		{"RDMA_READ", rdmaOp(true, false)},
		{"RDMA_WRITE (large)", rdmaOp(false, false)},
		{"RDMA_READ (large)", rdmaOp(true, false)},
	}
}
