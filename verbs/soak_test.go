package verbs_test

import (
	"encoding/binary"
	"flag"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/link/memlink"
	"github.com/softefa/softefa/verbs"
)

// The soak: many messages of every operation, sizes from 0 to the MTU and large RDMA, through a
// fabric with 10% loss, reordering, 1% duplication and 0.1% corruption, in virtual time. Every
// WR must complete exactly once and successfully, and every byte must arrive as sent.
//
//	go test ./verbs -run Soak -soak.msgs=1000000   # the full run
var soakMsgs = flag.Int("soak.msgs", 3000, "messages in TestSoak")

const (
	soakSlots    = 32       // operations in flight
	soakSlotSize = 64 << 10 // each slot's region on each side
	soakRecvs    = 256
	soakRecvSize = 8192
)

type soakOp int

const (
	opSend soakOp = iota
	opSendImm
	opWrite // an RDMA write, checked by reading it back
	opWriteImm
	opRead
	opCount
)

type soakSlot struct {
	busy  bool
	op    soakOp
	size  int
	sum   uint32
	stage int // opWrite: 0 writing, 1 reading back
	wrid  uint64
	owed  bool // opWriteImm: b has not checked the write yet
	sent  bool // the WR has completed at a
}

func TestSoak(t *testing.T) {
	n := *soakMsgs
	synctest.Test(t, func(t *testing.T) {
		f := memlink.New(uint64(n))
		soakPaths(f)
		a, b := memPair(t, f, 4, soakOpts(nil))
		start := time.Now()
		posted := soak(t, a, b, n, uint64(n), soakHooks{idle: func() { time.Sleep(50 * time.Microsecond) }})
		st := f.Stats(0)
		t.Logf("%d messages (%d WRs) in %v of virtual time; path 0: %d datagrams, %d dropped, %d duplicated, %d corrupted; "+
			"bad packets seen %d, retransmitted %d",
			n, posted, time.Since(start), st.Sent, st.Dropped, st.Duplicated, st.Corrupted,
			a.ctx.Counters().BadPackets+b.ctx.Counters().BadPackets, a.ctx.Counters().RetransPkts)
	})
}

// soakImpairment is what each of the soak's four paths does.
var soakImpairment = memlink.Impairment{Loss: 0.1, Duplicate: 0.01, Corrupt: 0.001,
	Delay: 20 * time.Microsecond, Jitter: 200 * time.Microsecond}

// soakPaths gives f's four paths the soak's impairments.
func soakPaths(f *memlink.Fabric) {
	for i := range 4 {
		f.SetPath(i, soakImpairment)
	}
}

// soakOpts are the ends the soak needs, with cfg applied to both devices.
func soakOpts(cfg func(*config.Device)) loopOpts {
	return loopOpts{size: soakSlots*soakSlotSize + soakRecvs*soakRecvSize,
		cap:    verbs.QPCap{MaxSendWR: 2 * soakSlots, MaxRecvWR: soakRecvs, MaxSendSGE: 1, MaxRecvSGE: 1},
		access: verbs.AccessRemoteWrite | verbs.AccessRemoteRead, cfg: cfg}
}

// soakHooks adapt the soak to how the devices move: idle is called when a pass over both CQs
// found nothing (and must let time pass), step before every pass, and seen with every
// completion (for a trace).
type soakHooks struct {
	idle func()
	step func()
	seen func(side byte, wc *verbs.WC)
}

// soak runs n operations from a to b, drawn from seed, soakSlots at a time, checking each as the
// soak's comment says; it returns the WRs posted.
func soak(t testing.TB, a, b *end, n int, seed uint64, h soakHooks) (posted int) {
	recvBase := soakSlots * soakSlotSize
	for i := range soakRecvs {
		b.recv(uint64(i), recvBase+i*soakRecvSize, soakRecvSize)
	}
	r := rand.New(rand.NewPCG(seed, 7))
	slots := make([]soakSlot, soakSlots)
	done := make(map[uint64]bool, n)
	var completed, received, nextID int
	expectRecv := 0 // receive completions owed by sends and writes with immediate
	var wc [16]verbs.WC
	var freed []int

	post := func(k int) {
		s := &slots[k]
		nextID++
		s.wrid = uint64(nextID)
		off := k * soakSlotSize // a's source: slot k's region
		dst := b.mr.Addr() + uint64(k*soakSlotSize)
		check(t, a.post(s.wrid, b, func(x *verbs.QPEx) {
			switch {
			case s.op == opSend:
				x.WRSend()
			case s.op == opSendImm:
				x.WRSendImm(s.sum)
			case s.op == opWriteImm:
				x.WRRDMAWriteImm(b.mr.RKey(), dst, s.sum&^0xff|uint32(k))
			case s.op == opWrite && s.stage == 0:
				x.WRRDMAWrite(b.mr.RKey(), dst)
			default: // the read back of an RDMA write, into a's otherwise unused receive area
				x.WRRDMARead(b.mr.RKey(), dst)
				off = readBack(k)
			}
			x.WRSetSGE(a.mr.LKey(), a.mr.Addr()+uint64(off), uint32(s.size))
		}))
		posted++
	}
	start1 := func(k int) {
		s := &slots[k]
		*s = soakSlot{busy: true, op: soakOp(r.IntN(int(opCount)))}
		switch {
		case s.op <= opSendImm:
			s.size = r.IntN(soakRecvSize + 1)
		case r.IntN(20) == 0:
			s.size = soakSlotSize/2 + r.IntN(soakSlotSize/2) // large RDMA: many packets
		default:
			s.size = r.IntN(8193)
		}
		if s.op == opRead {
			s.size = min(s.size, soakSlotSize/2)
		}
		if s.op == opWrite {
			s.size = min(s.size, soakSlotSize/2)
		}
		buf := a.buf[k*soakSlotSize:][:s.size]
		for i := range buf {
			buf[i] = byte(r.Uint32())
		}
		if s.op == opSend && s.size >= 4 {
			binary.LittleEndian.PutUint32(buf, crc32.ChecksumIEEE(buf[4:]))
		}
		s.sum = crc32.ChecksumIEEE(buf)
		if s.op == opSend || s.op == opSendImm || s.op == opWriteImm {
			expectRecv++
		}
		s.owed = s.op == opWriteImm
		if s.op == opRead { // read what an earlier op of this slot left at b: remember it by reading twice
			s.op, s.stage = opWrite, 0
		}
		post(k)
	}
	// finish frees slot k once a's WR has completed and b has checked what it owed, and
	// starts the next operation in it.
	finish := func(k int) {
		s := &slots[k]
		if !s.busy || !s.sent || s.owed {
			return
		}
		s.busy = false
		if completed+countBusy(slots) < n {
			start1(k)
		}
	}
	for k := range slots {
		start1(k)
	}
	for completed < n || received < expectRecv {
		if h.step != nil {
			h.step()
		}
		progress := false
		m, err := a.cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range wc[:m] {
			progress = true
			if h.seen != nil {
				h.seen('a', &w)
			}
			if w.Status != verbs.WCSuccess {
				t.Fatalf("WR %d: %v (EFA status %d)", w.WRID, w.Status, w.VendorErr)
			}
			if done[w.WRID] {
				t.Fatalf("WR %d completed twice", w.WRID)
			}
			done[w.WRID] = true
			k := -1
			for j := range slots {
				if slots[j].busy && slots[j].wrid == w.WRID {
					k = j
				}
			}
			if k < 0 {
				t.Fatalf("completion for unknown WR %d", w.WRID)
			}
			s := &slots[k]
			if s.op == opWrite && s.stage == 0 {
				s.stage = 1
				post(k)
				continue
			}
			if s.op == opWrite {
				back := a.buf[readBack(k):][:s.size]
				if crc32.ChecksumIEEE(back) != s.sum {
					t.Fatalf("RDMA write %d of %d bytes read back differently", w.WRID, s.size)
				}
			}
			s.sent = true
			completed++
			finish(k)
		}
		m, err = b.cq.Poll(wc[:])
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range wc[:m] {
			progress = true
			if h.seen != nil {
				h.seen('b', &w)
			}
			if w.Status != verbs.WCSuccess {
				t.Fatalf("receive %d: %v", w.WRID, w.Status)
			}
			var data []byte
			ok := false
			switch w.Opcode {
			case verbs.WCRecv:
				data = b.buf[recvBase+int(w.WRID)*soakRecvSize:][:w.ByteLen]
				if w.WCFlags&verbs.WCWithImm != 0 {
					ok = crc32.ChecksumIEEE(data) == w.ImmData
				} else {
					ok = len(data) < 4 || binary.LittleEndian.Uint32(data) == crc32.ChecksumIEEE(data[4:])
				}
			case verbs.WCRecvRDMAWithImm:
				k := int(w.ImmData & 0xff)
				data = b.buf[k*soakSlotSize:][:w.ByteLen]
				ok = crc32.ChecksumIEEE(data)&^0xff == w.ImmData&^0xff
				slots[k].owed = false
				freed = append(freed, k)
			}
			if !ok {
				t.Fatalf("receive of %d bytes (%v) corrupted", w.ByteLen, w.Opcode)
			}
			received++
			b.recv(w.WRID, recvBase+int(w.WRID)*soakRecvSize, soakRecvSize)
		}
		for _, k := range freed {
			finish(k)
		}
		freed = freed[:0]
		if !progress {
			h.idle()
		}
	}
	a.empty()
	b.empty()
	return posted
}

// readBack is where slot k's RDMA read lands in a's buffer: a's receive area, which a never uses.
func readBack(k int) int { return soakSlots*soakSlotSize + k*soakSlotSize/2 }

func countBusy(s []soakSlot) int {
	n := 0
	for _, x := range s {
		if x.busy {
			n++
		}
	}
	return n
}
