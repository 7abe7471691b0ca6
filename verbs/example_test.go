package verbs_test

import (
	"fmt"
	"log"
	"net/netip"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

// node is one end of the examples: a context on a device, with a protection domain, a
// registered 4 KiB buffer, a completion queue and an SRD QP in RTS that offers SENDs and RDMA
// writes through its QPEx.
type node struct {
	ctx *verbs.Context
	pd  *verbs.PD
	mr  *verbs.MR
	cq  *verbs.CQ
	qp  *verbs.QP
	x   *verbs.QPEx
}

// exampleQKey is the Q_Key the examples' QPs share: a SEND must carry its destination's.
const exampleQKey = 0x11111111

func newNode(dev *verbs.Device) *node {
	n := &node{ctx: orFail(dev.Open())}
	n.pd = orFail(n.ctx.AllocPD())
	n.mr = orFail(n.pd.RegMR(make([]byte, 4096), verbs.AccessLocalWrite|verbs.AccessRemoteWrite))
	n.cq = orFail(n.ctx.CreateCQ(64, nil, nil, 0))
	attr := verbs.QPInitAttrEx{
		SendCQ: n.cq, RecvCQ: n.cq, QPType: verbs.QPTDriver, PD: n.pd,
		Cap:          verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1},
		CompMask:     verbs.QPInitAttrPD | verbs.QPInitAttrSendOpsFlags,
		SendOpsFlags: verbs.SendOpsSend | verbs.SendOpsRDMAWriteWithImm,
	}
	n.qp = orFail(efadv.CreateQPEx(n.ctx, &attr, &efadv.QPInitAttr{DriverQPType: efadv.QPDriverTypeSRD}))
	// RESET -> INIT -> RTR -> RTS, with what EFA needs at each step.
	modify(n.qp, &verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: exampleQKey},
		verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrQKey)
	modify(n.qp, &verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState)
	modify(n.qp, &verbs.QPAttr{QPState: verbs.QPSRTS}, verbs.QPAttrState|verbs.QPAttrSQPSN)
	n.x = orFail(n.qp.ToQPEx())
	return n
}

// pair is a client and a server node, and the client's address handle for the server's device.
type pair struct {
	client, server *node
	ah             *verbs.AH
}

func newPair(clientDev, serverDev *verbs.Device) *pair {
	p := &pair{client: newNode(clientDev), server: newNode(serverDev)}
	p.ah = orFail(p.client.pd.CreateAH(&verbs.AHAttr{IsGlobal: true,
		GRH: verbs.GlobalRoute{DGID: serverDev.GID()}, PortNum: 1}))
	return p
}

// send posts one signaled SEND of length bytes at offset off of the client's buffer to the
// server's QP, in a QPEx session of one WR.
func (p *pair) send(wrID uint64, off, length int) {
	x := p.client.x
	x.WRStart()
	x.WRID, x.WRFlags = wrID, verbs.SendSignaled
	x.WRSend()
	x.WRSetSGE(p.client.mr.LKey(), p.client.mr.Addr()+uint64(off), uint32(length))
	x.WRSetUDAddr(p.ah, p.server.qp.QPN(), exampleQKey)
	if err := x.WRComplete(); err != nil {
		log.Fatal(err)
	}
}

func (p *pair) close() {
	if err := p.ah.Destroy(); err != nil {
		log.Fatal(err)
	}
	p.client.close()
	p.server.close()
}

// wait polls n's CQ until it returns a completion.
func (n *node) wait() verbs.WC {
	wc := make([]verbs.WC, 1)
	for {
		if orFail(n.cq.Poll(wc)) == 1 {
			return wc[0]
		}
	}
}

// close destroys what newNode created, in the order libibverbs requires.
func (n *node) close() {
	for _, err := range []error{n.qp.Destroy(), n.cq.Destroy(), n.mr.Dereg(), n.pd.Dealloc(), n.ctx.Close()} {
		if err != nil {
			log.Fatal(err)
		}
	}
}

func modify(qp *verbs.QP, attr *verbs.QPAttr, mask verbs.QPAttrMask) {
	if err := qp.Modify(attr, mask); err != nil {
		log.Fatal(err)
	}
}

func orFail[T any](v T, err error) T {
	if err != nil {
		log.Fatal(err)
	}
	return v
}

// Two devices on UDP sockets of 127.0.0.1 (each on a free port) exchange a SEND over SRD.
func Example() {
	loopback := netip.MustParseAddrPort("127.0.0.1:0")
	devA := orFail(verbs.NewDevice(config.Device{Name: "efa_a", Addr: loopback}))
	defer devA.Close()
	devB := orFail(verbs.NewDevice(config.Device{Name: "efa_b", Addr: loopback}))
	defer devB.Close()
	p := newPair(devA, devB)
	defer p.close()
	client, server := p.client, p.server

	// The server posts a receive; the client sends 10 bytes of its buffer to the server's QP.
	orFail(server.qp.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{server.mr.SGE(0, 64)}}}))
	copy(client.mr.Buf(), "hello, SRD")
	p.send(1, 0, 10)

	sent, got := client.wait(), server.wait()
	fmt.Println("client:", sent.WRID, sent.Opcode, sent.Status)
	fmt.Println("server:", got.WRID, got.Opcode, got.ByteLen, string(server.mr.Buf()[:got.ByteLen]))
	// Output:
	// client: 1 SEND success
	// server: 7 RECV 10 hello, SRD
}
