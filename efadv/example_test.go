package efadv_test

import (
	"fmt"
	"log"
	"sync/atomic"
	"unsafe"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/verbs"
)

// openDevice opens a context on a new device with the default configuration.
func openDevice() (*verbs.Device, *verbs.Context) {
	dev, err := verbs.NewDevice(config.Device{})
	if err != nil {
		log.Fatal(err)
	}
	ctx, err := dev.Open()
	if err != nil {
		log.Fatal(err)
	}
	return dev, ctx
}

// EFA's device attributes (efadv_query_device), with the defaults of config.Default.
func ExampleQueryDevice() {
	dev, ctx := openDevice()
	defer dev.Close()
	defer ctx.Close()

	a, err := efadv.QueryDevice(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("SQ %d WRs of %d SGEs, RQ %d descriptors of %d, inline %d/%d bytes, RDMA up to %d bytes\n",
		a.MaxSQWR, a.MaxSQSGE, a.MaxRQWR, a.MaxRQSGE, a.InlineBufSize, a.InlineBufSizeEx, a.MaxRDMASize)
	fmt.Println("RDMA read:", a.DeviceCaps&efadv.DeviceAttrCapsRDMARead != 0,
		"RDMA write:", a.DeviceCaps&efadv.DeviceAttrCapsRDMAWrite != 0,
		"source GIDs:", a.DeviceCaps&efadv.DeviceAttrCapsCQWithSGID != 0)
	// Output:
	// SQ 4096 WRs of 2 SGEs, RQ 8192 descriptors of 2, inline 32/80 bytes, RDMA up to 1073741824 bytes
	// RDMA read: true RDMA write: true source GIDs: true
}

// A program that drives the rings itself, as libfabric's EFA provider does: it writes an RX
// descriptor and a TX WQE in EFA's format (package efaio) into the rings efadv_query_qp_wqs
// returns, stores the producer counters into the doorbells, and reads the completions by phase
// bit from the ring efadv_query_cq returns. The QP sends to itself.
func ExampleQueryQPWQs() {
	dev, ctx := openDevice()
	defer dev.Close()
	defer ctx.Close()
	pd, err := ctx.AllocPD()
	if err != nil {
		log.Fatal(err)
	}
	defer pd.Dealloc()
	mr, err := pd.RegMR(make([]byte, 256), verbs.AccessLocalWrite)
	if err != nil {
		log.Fatal(err)
	}
	defer mr.Dereg()
	cq, err := ctx.CreateCQ(16, nil, nil, 0)
	if err != nil {
		log.Fatal(err)
	}
	defer cq.Destroy()
	attr := verbs.QPInitAttrEx{SendCQ: cq, RecvCQ: cq, QPType: verbs.QPTDriver, PD: pd, CompMask: verbs.QPInitAttrPD,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}}
	qp, err := efadv.CreateQPEx(ctx, &attr, &efadv.QPInitAttr{DriverQPType: efadv.QPDriverTypeSRD})
	if err != nil {
		log.Fatal(err)
	}
	defer qp.Destroy()
	const qkey = 0x22222222
	for _, m := range []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: qkey}, verbs.QPAttrState | verbs.QPAttrPKeyIndex | verbs.QPAttrPort | verbs.QPAttrQKey},
		{verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState},
		{verbs.QPAttr{QPState: verbs.QPSRTS}, verbs.QPAttrState | verbs.QPAttrSQPSN},
	} {
		if err := qp.Modify(&m.attr, m.mask); err != nil {
			log.Fatal(err)
		}
	}
	ah, err := pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: dev.GID()}, PortNum: 1})
	if err != nil {
		log.Fatal(err)
	}
	defer ah.Destroy()
	ahAttr, _ := efadv.QueryAH(ah)
	sq, rq, err := efadv.QueryQPWQs(qp) // from now on the device also polls the doorbells
	if err != nil {
		log.Fatal(err)
	}
	cqAttr, err := efadv.QueryCQ(cq)
	if err != nil {
		log.Fatal(err)
	}

	// One receive of 64 bytes at offset 128, then one SEND of the first 12 bytes.
	efaio.RxDesc(rq.Buffer[:rq.EntrySize]).Encode(&efaio.RxDescFields{
		Addr: mr.Addr() + 128, ReqID: 0x0505, Length: 64, LKey: mr.LKey(), First: true, Last: true})
	atomic.StoreUint32(rq.Doorbell, 1)
	copy(mr.Buf(), "raw and true")
	efaio.TxWQE(sq.Buffer[:sq.EntrySize]).Encode(&efaio.TxDesc{
		ReqID: 0x0042, Op: efaio.OpSend, Phase: 0, CompReq: true, DestQPN: uint16(qp.QPN()), Length: 1,
		AHN: ahAttr.AHN, QKey: qkey, SGL: [efaio.TxNumBufs]efaio.BufDesc{{Length: 12, LKey: mr.LKey(), Addr: mr.Addr()}}})
	atomic.StoreUint32(sq.Doorbell, 1) // efadv.RingDoorbell would have the device look at once

	// Completions: an entry is valid when its phase bit is the expected phase (1 on the first lap).
	for consumed := uint32(0); consumed < 2; {
		e := efaio.CQE(cqAttr.Buffer[consumed*cqAttr.EntrySize:][:cqAttr.EntrySize])
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&e[0])))
		if efaio.PhaseOf(hdr) != 1 {
			continue
		}
		var c efaio.Completion
		if err := e.Decode(hdr, &c); err != nil {
			log.Fatal(err)
		}
		consumed++
		atomic.StoreUint32(cqAttr.Doorbell, consumed) // the consumer count, for the device
		switch c.QType {
		case efaio.QTypeSend:
			fmt.Printf("send completion: req_id %#x, status %v\n", c.ReqID, c.Status)
		case efaio.QTypeRecv:
			fmt.Printf("receive completion: req_id %#x, status %v, %d bytes: %s\n", c.ReqID, c.Status, c.Length,
				mr.Buf()[128:128+c.Length])
		}
	}
	// Unordered output:
	// receive completion: req_id 0x505, status ok, 12 bytes: raw and true
	// send completion: req_id 0x42, status ok
}
