// Package wireshark holds the Lua dissector for softefa's wire format and its test.
package wireshark

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
	"net/netip"
)

// TestDissector captures real softefa traffic on loopback with tshark and checks that the
// dissector names every header field. It needs tshark and the right to capture (root).
func TestDissector(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (CI installs it)")
	}
	if os.Geteuid() != 0 {
		t.Skip("capturing on loopback needs root")
	}
	pcap := filepath.Join(t.TempDir(), "softefa.pcap")
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	capture := exec.CommandContext(ctx, tshark, "-i", "lo", "-f", "udp and host 127.0.0.77", "-w", pcap)
	stderr, _ := capture.StderrPipe()
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan bool, 1)
	go func() {
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			if strings.Contains(s.Text(), "Capturing on") {
				ready <- true
			}
		}
		ready <- false
	}()
	if !<-ready {
		t.Fatal("tshark did not start capturing")
	}
	// dumpcap says "Capturing on" a moment before packets reach the file; run the traffic until
	// they do (a tool outside the test starting up, not the code under test being waited for).
	for i := 0; ; i++ {
		traffic(t)
		time.Sleep(200 * time.Millisecond)
		if raw, _ := exec.Command(tshark, "-r", pcap, "-c", "1").Output(); strings.Contains(string(raw), "UDP") || i == 10 {
			break
		}
	}
	// dumpcap writes behind the traffic: read the file until the dissection shows every field
	// (or 10 s pass), then stop the capture.
	names := []string{"Version", "Path", "Source device port", "Source incarnation",
		"Destination incarnation", "Tx stream epoch", "Rx stream epoch", "Checksum (CRC-32C)", "Cookie", "Frame type", "Frame flags", "Frame length",
		"PSN", "Message id", "Offset", "Message length", "Operation", "Data flags", "Immediate", "Source QPN",
		"Destination QPN", "Status", "QKey", "Immediate data", "RKey", "Remote address", "Payload",
		"Cumulative PSN", "Highest PSN", "Selective bits", "Answered path", "ACK flags", "Horizon PSN",
		"Operation: SEND", "Operation: WRITE", "Operation: READ_REQ", "Operation: READ_RESP", "Operation: RESP",
		"Frame type: DATA", "Frame type: ACK", "Frame type: CHALLENGE", "Frame type: COOKIE"}
	missing := func(text string) []string {
		var m []string
		for _, name := range names {
			if !strings.Contains(text, name+":") && !strings.Contains(text, name+" (") {
				m = append(m, name)
			}
		}
		return m
	}
	// A capture on a loaded machine may drop packets (dumpcap's buffer): when a kind is still
	// missing after a while, run the traffic again.
	var text string
	for deadline, again := time.Now().Add(30*time.Second), time.Now().Add(2*time.Second); ; {
		out, err := exec.Command(tshark, "-r", pcap, "-X", "lua_script:softefa.lua", "-Y", "softefa", "-V").CombinedOutput()
		if err != nil {
			// dumpcap may be in the middle of writing a packet ("cut short"): read again.
			if time.Now().Before(deadline) && strings.Contains(string(out), "cut short") {
				time.Sleep(100 * time.Millisecond) // polling another program's file
				continue
			}
			t.Fatalf("tshark: %v\n%s", err, out)
		}
		if text = string(out); len(missing(text)) == 0 || time.Now().After(deadline) {
			break
		}
		if time.Now().After(again) {
			traffic(t)
			again = time.Now().Add(2 * time.Second)
		}
		time.Sleep(100 * time.Millisecond) // polling another program's file
	}
	capture.Process.Signal(os.Interrupt)
	capture.Wait()
	for _, name := range missing(text) {
		t.Errorf("dissection shows no %q", name)
	}
	if t.Failed() {
		t.Logf("tshark -V output:\n%.4000s", text)
	}
}

// traffic runs SEND with immediate, RDMA write and RDMA read between two devices on loopback,
// then a SEND that finds no receive posted (RNR, retries 0): its RESP frame is what a failure
// looks like (success needs none).
func traffic(t *testing.T) {
	lo := netip.MustParseAddrPort("127.0.0.77:0") // an address of its own: the capture sees no other test's traffic
	var ends [2]struct {
		dev *verbs.Device
		ctx *verbs.Context
		pd  *verbs.PD
		cq  *verbs.CQ
		mr  *verbs.MR
		qp  *verbs.QP
		ah  *verbs.AH
	}
	for i := range ends {
		e := &ends[i]
		var err error
		must := func(err error) {
			if err != nil {
				t.Fatal(err)
			}
		}
		// On loopback a GSO run crosses as one unsegmented packet, which a capture sees as one;
		// with offload off every datagram is its own packet.
		e.dev, err = verbs.NewDevice(config.Device{Addr: lo, NoOffload: true})
		must(err)
		e.ctx, err = e.dev.Open()
		must(err)
		e.pd, err = e.ctx.AllocPD()
		must(err)
		e.cq, err = e.ctx.CreateCQ(64, nil, nil, 0)
		must(err)
		e.mr, err = e.pd.RegMR(make([]byte, 8192), verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		must(err)
		attr := verbs.QPInitAttrEx{SendCQ: e.cq, RecvCQ: e.cq, QPType: verbs.QPTDriver, PD: e.pd,
			Cap:          verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1},
			CompMask:     verbs.QPInitAttrPD | verbs.QPInitAttrSendOpsFlags,
			SendOpsFlags: verbs.SendOpsSend | verbs.SendOpsSendWithImm | verbs.SendOpsRDMAWrite | verbs.SendOpsRDMARead}
		e.qp, err = efadv.CreateQPEx(e.ctx, &attr, &efadv.QPInitAttr{})
		must(err)
		must(e.qp.Modify(&verbs.QPAttr{QPState: verbs.QPSInit, PortNum: 1, QKey: 7},
			verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrQKey))
		must(e.qp.Modify(&verbs.QPAttr{QPState: verbs.QPSRTR}, verbs.QPAttrState))
		must(e.qp.Modify(&verbs.QPAttr{QPState: verbs.QPSRTS}, verbs.QPAttrState|verbs.QPAttrSQPSN|verbs.QPAttrRNRRetry)) // rnr_retry 0
		defer func() {
			e.ah.Destroy()
			e.qp.Destroy()
			e.mr.Dereg()
			e.cq.Destroy()
			e.pd.Dealloc()
			e.ctx.Close()
			e.dev.Close()
		}()
	}
	a, b := &ends[0], &ends[1]
	var err error
	if a.ah, err = a.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: b.dev.GID()}, PortNum: 1}); err != nil {
		t.Fatal(err)
	}
	if b.ah, err = b.pd.CreateAH(&verbs.AHAttr{IsGlobal: true, GRH: verbs.GlobalRoute{DGID: a.dev.GID()}, PortNum: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{b.mr.SGE(0, 4096)}}}); err != nil {
		t.Fatal(err)
	}
	x, err := a.qp.ToQPEx()
	if err != nil {
		t.Fatal(err)
	}
	for i, op := range []string{"send", "write", "read", "rnr"} {
		x.WRStart()
		x.WRID, x.WRFlags = uint64(i), verbs.SendSignaled
		want := verbs.WCSuccess
		switch op {
		case "rnr":
			want = verbs.WCRNRRetryExcErr
			x.WRSend()
		case "send":
			x.WRSendImm(0xabcd)
		case "write":
			x.WRRDMAWrite(b.mr.RKey(), b.mr.Addr())
		case "read":
			x.WRRDMARead(b.mr.RKey(), b.mr.Addr())
		}
		x.WRSetUDAddr(a.ah, b.qp.QPN(), 7)
		x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 3000)
		if err := x.WRComplete(); err != nil {
			t.Fatal(err)
		}
		var wc [1]verbs.WC
		deadline := time.Now().Add(5 * time.Second)
		for {
			if n, _ := a.cq.Poll(wc[:]); n == 1 {
				if wc[0].Status != want {
					t.Fatalf("%s: %+v", op, wc[0])
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: no completion", op)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
