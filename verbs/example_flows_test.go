package verbs_test

import (
	"errors"
	"fmt"
	"log"
	"syscall"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/verbs"
)

// An RDMA write with immediate data between two contexts of one device (same-device loopback):
// the bytes land in the server's region, and the immediate data consumes one of its receives.
func ExampleQPEx_WRRDMAWriteImm() {
	dev := orFail(verbs.NewDevice(config.Device{}))
	defer dev.Close()
	p := newPair(dev, dev)
	defer p.close()
	client, server := p.client, p.server

	orFail(server.qp.PostRecv([]verbs.RecvWR{{WRID: 9}}))
	copy(client.mr.Buf(), "written remotely")
	x := client.x
	x.WRStart()
	x.WRID, x.WRFlags = 2, verbs.SendSignaled
	x.WRRDMAWriteImm(server.mr.RKey(), server.mr.Addr()+128, 0xcafe)
	x.WRSetSGE(client.mr.LKey(), client.mr.Addr(), 16)
	x.WRSetUDAddr(p.ah, server.qp.QPN(), exampleQKey)
	if err := x.WRComplete(); err != nil {
		log.Fatal(err)
	}

	sent, got := client.wait(), server.wait()
	fmt.Println("client:", sent.WRID, sent.Opcode, sent.Status)
	fmt.Printf("server: %d %v %d %#x %q\n", got.WRID, got.Opcode, got.ByteLen, got.ImmData,
		server.mr.Buf()[128:128+got.ByteLen])
	// Output:
	// client: 2 RDMA_WRITE success
	// server: 9 RECV_RDMA_WITH_IMM 16 0xcafe "written remotely"
}

// Reading completions one field at a time (ibv_start_poll, ibv_next_poll, ibv_end_poll): the
// CQ's lock is held from StartPoll to EndPoll, and an empty CQ is ENOENT.
func ExampleCQ_StartPoll() {
	dev := orFail(verbs.NewDevice(config.Device{}))
	defer dev.Close()
	p := newPair(dev, dev)
	defer p.close()
	client, server := p.client, p.server

	for i, msg := range []string{"first", "second"} {
		orFail(server.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{server.mr.SGE(64*i, 64)}}}))
		copy(client.mr.Buf()[64*i:], msg)
		p.send(uint64(i), 64*i, len(msg))
	}

	cq := server.cq
	for seen := 0; seen < 2; {
		err := cq.StartPoll(verbs.PollCQAttr{})
		if errors.Is(err, syscall.ENOENT) {
			continue // nothing yet, and nothing to end
		} else if err != nil {
			log.Fatal(err)
		}
		for ; err == nil; err = cq.NextPoll() {
			n := cq.ReadByteLen()
			fmt.Println(cq.WRID(), cq.Status(), cq.ReadOpcode(), n, string(server.mr.Buf()[64*cq.WRID():][:n]))
			seen++
		}
		cq.EndPoll()
	}
	for range 2 {
		client.wait()
	}
	// Output:
	// 0 success RECV 5 first
	// 1 success RECV 6 second
}

// A device's attributes and its port's (ibv_query_device, ibv_query_port), with the defaults of
// config.Default.
func ExampleContext_QueryDevice() {
	dev := orFail(verbs.NewDevice(config.Device{Name: "efa_query"}))
	defer dev.Close()
	ctx := orFail(dev.Open())
	defer ctx.Close()

	a := ctx.QueryDevice()
	fmt.Printf("%s: vendor %#x part %#x, %d QPs of %d WRs, %d CQs of %d entries, %d send SGEs\n",
		dev.Name(), a.VendorID, a.VendorPartID, a.MaxQP, a.MaxQPWR, a.MaxCQ, a.MaxCQE, a.MaxSendSGE)
	p := orFail(ctx.QueryPort(1))
	fmt.Printf("port 1: state %d (active), MTU enum %d (4096), messages up to %d bytes\n",
		p.State, p.ActiveMTU, p.MaxMsgSz)
	// Output:
	// efa_query: vendor 0x1d0f part 0xefa2, 4096 QPs of 4096 WRs, 4096 CQs of 32768 entries, 2 send SGEs
	// port 1: state 4 (active), MTU enum 5 (4096), messages up to 8192 bytes
}
