package verbs_test

import (
	"bufio"
	"fmt"
	"hash/crc32"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/verbs"
)

// Two OS processes exchange SEND, RDMA WRITE (with and without immediate) and RDMA READ over UDP
// on loopback; every payload carries its CRC32 as immediate data and the other side checks it.
// Then the server process is killed and the client's next WR fails with UNRESP_REMOTE.

const helperEnv = "SOFTEFA_TEST_SERVER"

// serverMsgs is how many SENDs and writes with immediate the server checks before it reports.
const serverMsgs = 200

// TestServerProcess is the server side, run in a child process by TestTwoProcesses.
func TestServerProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("runs as the child of TestTwoProcesses")
	}
	dev := newDevice(t, func(c *config.Device) { c.Addr = loopback })
	e := newEnd(t, openCtx(t, dev), loopOpts{size: 5 << 20, typ: verbs.QPTDriver,
		access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead,
		cap:    verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 256, MaxSendSGE: 1, MaxRecvSGE: 1}})
	// Each receive WR has its own 8 KiB slot in [0, 2 MiB); writes with immediate land in slot
	// imm&0xff of [2 MiB, 4 MiB). A slot is reused only after the server has checked it.
	for i := range 256 {
		e.recv(uint64(i), i*8192, 8192)
	}
	fmt.Printf("READY %d %d %d %d\n", dev.Addr().Port(), e.qp.QPN(), e.mr.RKey(), e.mr.Addr())
	good, bad := 0, 0
	for range 2 * serverMsgs {
		wc := e.one()
		var data []byte
		want := wc.ImmData
		switch wc.Opcode {
		case verbs.WCRecv:
			data = e.buf[wc.WRID*8192:][:wc.ByteLen]
		case verbs.WCRecvRDMAWithImm:
			data = e.buf[2<<20+(wc.ImmData&0xff)*8192:][:wc.ByteLen]
			want &^= 0xff
		}
		sum := crc32.ChecksumIEEE(data)
		if wc.Opcode == verbs.WCRecvRDMAWithImm {
			sum &^= 0xff
		}
		if wc.Status == verbs.WCSuccess && sum == want {
			good++
		} else {
			bad++
		}
		e.recv(wc.WRID, int(wc.WRID)*8192, 8192)
	}
	fmt.Printf("DONE %d %d\n", good, bad)
	select {} // until killed
}

func TestTwoProcesses(t *testing.T) {
	if os.Getenv(helperEnv) != "" {
		t.Skip("the child runs TestServerProcess only")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	next := func(prefix string) []string {
		for lines.Scan() {
			if f := strings.Fields(lines.Text()); len(f) > 0 && f[0] == prefix {
				return f[1:]
			}
		}
		t.Fatalf("server ended before %s: %v", prefix, lines.Err())
		return nil
	}
	var port, qpn, rkey uint32
	var raddr uint64
	ready := next("READY")
	fmt.Sscan(strings.Join(ready, " "), &port, &qpn, &rkey, &raddr)

	// A transport timeout short enough for the last check (a killed peer) to come soon, and long
	// enough that a server process starved of the processor for a while (CI runs beside other
	// work) is not taken for dead: 1 s was not, once, on a loaded machine.
	dev := newDevice(t, func(c *config.Device) { c.Addr = loopback; c.TransportTimeout = 3 * time.Second })
	a := newEnd(t, openCtx(t, dev), loopOpts{size: 1 << 20, typ: verbs.QPTDriver,
		cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	server := netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), uint16(port))
	gid := verbs.GID(config.GIDFromAddr(server))
	a.ah = a.makeAH(gid)
	post := func(wrid uint64, build func(x *verbs.QPEx)) verbs.WC {
		t.Helper()
		a.x.WRStart()
		a.x.WRID, a.x.WRFlags = wrid, verbs.SendSignaled
		build(a.x)
		a.x.WRSetUDAddr(a.ah, qpn, qkey)
		check(t, a.x.WRComplete())
		return a.one()
	}
	for i := range serverMsgs {
		n := 1 + i*41%8192
		pattern(a.buf[:n], byte(i))
		sum := crc32.ChecksumIEEE(a.buf[:n])
		wantWC(t, post(uint64(i), func(x *verbs.QPEx) {
			x.WRSendImm(sum)
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(n))
		}), uint64(i), verbs.WCSuccess, verbs.WCSend)
		// Write into the server's [4 MiB, 5 MiB), read it back, compare.
		m := 1 + i*997%(256<<10)
		pattern(a.buf[:m], byte(i+3))
		wantWC(t, post(uint64(i), func(x *verbs.QPEx) {
			x.WRRDMAWrite(rkey, raddr+4<<20)
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(m))
		}), uint64(i), verbs.WCSuccess, verbs.WCRDMAWrite)
		wantWC(t, post(uint64(i), func(x *verbs.QPEx) {
			x.WRRDMARead(rkey, raddr+4<<20)
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr()+512<<10, uint32(m))
		}), uint64(i), verbs.WCSuccess, verbs.WCSend)
		if crc32.ChecksumIEEE(a.buf[512<<10:512<<10+m]) != crc32.ChecksumIEEE(a.buf[:m]) {
			t.Fatalf("read back %d bytes: data differs", m)
		}
		// Write with immediate into slot i%256 of the server's [2 MiB, 4 MiB); the immediate is
		// the CRC with the slot in its low byte.
		k := 1 + i*13%8192
		pattern(a.buf[:k], byte(i+5))
		slot := uint32(i % 256)
		wantWC(t, post(uint64(i), func(x *verbs.QPEx) {
			x.WRRDMAWriteImm(rkey, raddr+2<<20+uint64(slot)*8192, crc32.ChecksumIEEE(a.buf[:k])&^0xff|slot)
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), uint32(k))
		}), uint64(i), verbs.WCSuccess, verbs.WCRDMAWrite)
	}
	done := next("DONE")
	if done[0] != fmt.Sprint(2*serverMsgs) || done[1] != "0" {
		t.Fatalf("server checked %s good, %s bad; want %d good", done[0], done[1], 2*serverMsgs)
	}

	// The server process dies: the next WR fails after the transport timeout.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	wc := post(99, func(x *verbs.QPEx) { x.WRSend(); x.WRSetSGE(a.mr.LKey(), a.mr.Addr(), 100) })
	if wc.WRID != 99 || efaio.Status(wc.VendorErr) != efaio.StatusLocalUnrespRemote || wc.Status != verbs.WCRespTimeoutErr {
		t.Fatalf("WR to the killed peer: %+v, want UNRESP_REMOTE (13)", wc)
	}
}
