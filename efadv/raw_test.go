package efadv_test

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efadv"
	"github.com/softefa/softefa/verbs"
)

// A program that never calls post or poll: it writes WQEs and RX descriptors byte by byte in
// EFA's format into the rings efadv_query_qp_wqs returns, stores producer counters into the
// doorbells (plain atomic stores, no helper), and reads CQEs by phase bit from the rings
// efadv_query_cq returns. The device notices the stores by polling doorbells.

// rawCQ reads a CQ ring as libfabric's direct path does.
type rawCQ struct {
	a     efadv.CQAttr
	cc    uint32
	phase byte
}

func newRawCQ(t *testing.T, cq *verbs.CQ) *rawCQ {
	a, err := efadv.QueryCQ(cq)
	if err != nil {
		t.Fatal(err)
	}
	return &rawCQ{a: a, phase: 1}
}

// next returns the next CQE's bytes, or nil if the entry at the consumer index is not valid.
func (c *rawCQ) next() []byte {
	e := c.a.Buffer[int(c.cc%c.a.NumEntries)*int(c.a.EntrySize):][:c.a.EntrySize]
	hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&e[0])))
	if byte(hdr>>24)&1 != c.phase {
		return nil
	}
	c.cc++
	if c.cc%c.a.NumEntries == 0 {
		c.phase ^= 1
	}
	atomic.StoreUint32(c.a.Doorbell, c.cc&0xffff) // tell the device how far we have read
	return e
}

func (c *rawCQ) wait(t *testing.T) []byte {
	t.Helper()
	for range 100 {
		if e := c.next(); e != nil {
			return e
		}
		time.Sleep(time.Millisecond) // virtual time: let the device's doorbell poll come round
	}
	t.Fatal("no CQE after 100 ms")
	return nil
}

func le16(b []byte, v uint16) { binary.LittleEndian.PutUint16(b, v) }
func le32(b []byte, v uint32) { binary.LittleEndian.PutUint32(b, v) }

// writeWQE writes a 64-byte TX WQE by hand (docs/descriptors.md, "TX WQE").
func writeWQE(w []byte, reqID uint16, op byte, phase byte, dst uint16, ahn uint16, qkey uint32,
	lkey uint32, addr uint64, n uint32, rkey uint32, raddr uint64) {
	clear(w)
	le16(w[0:], reqID)
	w[2] = op | 0x80                  // op_type, meta_desc
	w[3] = phase | 1<<2 | 1<<3 | 1<<4 // phase, first, last, comp_req
	le16(w[4:], dst)                  // dest_qp_num
	le16(w[6:], 1)                    // one buffer
	le16(w[12:], ahn)                 // ah
	le32(w[16:], qkey)                // qkey
	buf := w[32:]
	if op != 0 { // RDMA: remote_mem @32, local_mem @48
		le32(w[32:], n)
		le32(w[36:], rkey)
		le32(w[40:], uint32(raddr))
		le32(w[44:], uint32(raddr>>32))
		buf = w[48:]
	}
	le32(buf[0:], n)
	le32(buf[4:], lkey)
	le32(buf[8:], uint32(addr))
	le32(buf[12:], uint32(addr>>32))
}

func TestRawRings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev := newDevice(t, nil)
		o := srdOpts{qpCount: 1, msgSize: 4096, access: verbs.AccessRemoteWrite, sendOps: verbs.SendOpsSend}
		client, server := pair(t, dev, o)
		sq, _, err := efadv.QueryQPWQs(client.qps[0])
		if err != nil {
			t.Fatal(err)
		}
		_, rq, _ := efadv.QueryQPWQs(server.qps[0])
		ccq, scq := newRawCQ(t, client.cq), newRawCQ(t, server.cq)
		clientAHN := ahn(t, client.ahs[0])
		dst := uint16(server.qps[0].QPN())

		// One receive descriptor: 64 bytes at offset 100, req_id 0x0505, first and last.
		d := rq.Buffer[:16]
		addr := server.mr.Addr() + 100
		le32(d[0:], uint32(addr))
		le32(d[4:], uint32(addr>>32))
		le16(d[8:], 0x0505)
		le16(d[10:], 64)
		le32(d[12:], server.mr.LKey()|1<<30|1<<31)
		atomic.StoreUint32(rq.Doorbell, 1)

		for i := range 64 {
			client.buf[i] = byte(i)
		}
		writeWQE(sq.Buffer[:64], 0x0042, 0, 0, dst, clientAHN, srdQKey, client.mr.LKey(), client.mr.Addr(), 64, 0, 0)
		atomic.StoreUint32(sq.Doorbell, 1)

		tx := ccq.wait(t)
		if tx[0] != 0x42 || tx[1] != 0 || tx[2] != 0 || tx[3]>>1&3 != 1 || binary.LittleEndian.Uint16(tx[4:]) != uint16(client.qps[0].QPN()) {
			t.Fatalf("TX CQE % x", tx[:16])
		}
		rx := scq.wait(t)
		if binary.LittleEndian.Uint16(rx[0:]) != 0x0505 || rx[2] != 0 || rx[3]>>1&3 != 2 ||
			binary.LittleEndian.Uint16(rx[6:]) != 64 || binary.LittleEndian.Uint16(rx[10:]) != uint16(client.qps[0].QPN()) {
			t.Fatalf("RX CQE % x", rx[:16])
		}
		for i := range 64 {
			if server.buf[100+i] != byte(i) {
				t.Fatalf("byte %d of the raw send is %d", i, server.buf[100+i])
			}
		}

		// Garbage in the ring: each entry yields an error completion echoing its req_id.
		pc := uint32(1)
		garbage := []struct {
			name   string
			write  func(w []byte)
			status byte
		}{
			{"all ones", func(w []byte) {
				for i := range w {
					w[i] = 0xff
				}
			}, 2},
			{"bad opcode", func(w []byte) {
				writeWQE(w, 0x0043, 0, 0, dst, clientAHN, srdQKey, client.mr.LKey(), client.mr.Addr(), 8, 0, 0)
				w[2] = 0x80 | 7
			}, 3},
			{"bad lkey", func(w []byte) {
				writeWQE(w, 0x0044, 0, 0, dst, clientAHN, srdQKey, client.mr.LKey()^0x700, client.mr.Addr(), 8, 0, 0)
			}, 5},
			{"three buffers", func(w []byte) {
				writeWQE(w, 0x0045, 0, 0, dst, clientAHN, srdQKey, client.mr.LKey(), client.mr.Addr(), 8, 0, 0)
				w[6] = 3
			}, 6},
			{"wrong phase", func(w []byte) {
				writeWQE(w, 0x0046, 0, 1, dst, clientAHN, srdQKey, client.mr.LKey(), client.mr.Addr(), 8, 0, 0)
			}, 2},
			{"unknown AH", func(w []byte) {
				writeWQE(w, 0x0047, 0, 0, dst, 999, srdQKey, client.mr.LKey(), client.mr.Addr(), 8, 0, 0)
			}, 4},
		}
		for _, g := range garbage {
			g.write(sq.Buffer[int(pc%sq.NumEntries)*64:][:64])
			pc++
			atomic.StoreUint32(sq.Doorbell, pc)
			e := ccq.wait(t)
			if e[2] != g.status {
				t.Fatalf("%s: status %d, want %d (CQE % x)", g.name, e[2], g.status, e[:16])
			}
		}

		// RDMA writes across several laps of the SQ and the CQ: the phase bits flip at each wrap.
		for lap := 0; lap < 3*int(sq.NumEntries); lap += 100 {
			for range 100 {
				phase := byte(pc / sq.NumEntries & 1)
				writeWQE(sq.Buffer[int(pc%sq.NumEntries)*64:][:64], uint16(pc), 2, phase, dst, clientAHN, srdQKey,
					client.mr.LKey(), client.mr.Addr(), 16, server.mr.RKey(), server.mr.Addr())
				pc++
			}
			atomic.StoreUint32(sq.Doorbell, pc&0xffff)
			for i := range 100 {
				e := ccq.wait(t)
				if e[2] != 0 || binary.LittleEndian.Uint16(e[0:]) != uint16(pc-100+uint32(i)) {
					t.Fatalf("lap %d entry %d: CQE % x", lap, i, e[:16])
				}
			}
		}
	})
}

// The helper doorbell (efadv.RingDoorbell) makes the device look at once, without waiting for a poll.
func TestRingDoorbellHelper(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dev := newDevice(t, func(c *config.Device) { c.PollMin, c.PollMax = time.Hour, time.Hour })
		client, server := pair(t, dev, srdOpts{qpCount: 1, msgSize: 64, access: verbs.AccessRemoteWrite})
		sq, _, _ := efadv.QueryQPWQs(client.qps[0])
		ccq := newRawCQ(t, client.cq)
		writeWQE(sq.Buffer[:64], 7, 2, 0, uint16(server.qps[0].QPN()), ahn(t, client.ahs[0]), srdQKey,
			client.mr.LKey(), client.mr.Addr(), 16, server.mr.RKey(), server.mr.Addr())
		if err := efadv.RingDoorbell(client.qps[0], sq.Doorbell, 1); err != nil {
			t.Fatal(err)
		}
		synctest.Wait() // no time passes: only the wake-up can have run the device
		if e := ccq.next(); e == nil || e[2] != 0 {
			t.Fatalf("no completion after RingDoorbell: % x", e)
		}
		if err := efadv.RingDoorbell(client.qps[0], new(uint32), 1); !errors.Is(err, syscall.EINVAL) {
			t.Fatal("RingDoorbell took a word that is not the QP's doorbell")
		}
	})
}
