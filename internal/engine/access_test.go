package engine

import (
	"bytes"
	"net/netip"
	"testing"
	"unsafe"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/efaio"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/uapi"
)

// No crafted message or WQE reads or writes outside a region it was granted: the regions sit
// inside a larger buffer whose other bytes are guards, and every access the engine makes through
// a key is checked to stay within the region the key names.

type accessRig struct {
	d        *Device
	pd, pd2  *PD
	mem      []byte // guard | region A | guard | region B (in pd2) | guard
	a, b     *MR
	q        *QP
	inA, inB []byte
}

const guard = 0xee

func newAccessRig(t testing.TB) *accessRig {
	return newAccessRigOn(t, config.Device{Addr: netip.MustParseAddrPort("127.0.0.1:1")})
}

// newAccessRigOn is newAccessRig on a device configured by cfg.
func newAccessRigOn(t testing.TB, cfg config.Device) *accessRig {
	d, err := NewDevice(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	r := &accessRig{d: d, mem: bytes.Repeat([]byte{guard}, 4*4096)}
	r.pd, _ = d.AllocPD()
	r.pd2, _ = d.AllocPD()
	r.inA, r.inB = r.mem[4096:8192], r.mem[12288:14336]
	clear(r.inA)
	clear(r.inB)
	if r.a, err = d.RegMR(r.pd, r.inA, 0x10000, uapi.AccessLocalWrite|uapi.AccessRemoteWrite|uapi.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	if r.b, err = d.RegMR(r.pd2, r.inB, 0x20000, uapi.AccessLocalWrite|uapi.AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
	r.q = readyQP(t, d, r.pd)
	return r
}

// readyQP makes an SRD-like driver QP of pd on d, with a CQ of its own, and brings it to RTS
// (qkey 9).
func readyQP(t testing.TB, d *Device, pd *PD) *QP {
	t.Helper()
	cq, err := d.CreateCQ(CQInit{Entries: 64})
	if err != nil {
		t.Fatal(err)
	}
	q, err := d.CreateQP(QPInit{Type: uapi.QPTypeDriver, PD: pd, SendCQ: cq, RecvCQ: cq, SQEntries: 16,
		SQEntrySize: 64, RQEntries: 16, Caps: QPCaps{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 2, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []struct {
		a    QPAttr
		mask int
	}{
		{QPAttr{State: uapi.QPSInit, Port: 1, QKey: 9}, uapi.QPAttrState | uapi.QPAttrPKeyIndex | uapi.QPAttrPort | uapi.QPAttrQKey},
		{QPAttr{State: uapi.QPSRTR}, uapi.QPAttrState},
		{QPAttr{State: uapi.QPSRTS}, uapi.QPAttrState | uapi.QPAttrSQPSN},
	} {
		if err := d.ModifyQP(q, &st.a, st.mask); err != nil {
			t.Fatal(err)
		}
	}
	return q
}

// guardsIntact checks every byte outside the two regions.
func (r *accessRig) guardsIntact(t *testing.T) {
	for _, g := range [][]byte{r.mem[:4096], r.mem[8192:12288], r.mem[14336:]} {
		for i, c := range g {
			if c != guard {
				t.Fatalf("guard byte %d changed to %#x", i, c)
			}
		}
	}
}

// within reports whether b lies inside region.
func within(s mem.Span, region []byte) bool {
	b, own := s.Bytes()
	if !own {
		return false
	}
	if len(b) == 0 {
		return true
	}
	start := uintptr(unsafe.Pointer(&region[0]))
	p := uintptr(unsafe.Pointer(&b[0]))
	return p >= start && p+uintptr(len(b)) <= start+uintptr(len(region))
}

func FuzzRemoteAccess(f *testing.F) {
	f.Add(uint8(efaio.OpRDMAWrite), uint32(0), uint64(0x10000), uint64(100), uint64(0), []byte("data"))
	f.Add(uint8(efaio.OpRDMARead), uint32(1), uint64(0x20000), uint64(2048), uint64(0), []byte{})
	f.Add(uint8(efaio.OpRDMAWrite), uint32(0), uint64(0x10ff0), uint64(0x20), uint64(8), []byte("0123456789abcdef"))
	f.Add(uint8(efaio.OpRDMAWrite), uint32(0), ^uint64(0)-4, uint64(10), uint64(0), []byte("x"))
	f.Fuzz(func(t *testing.T, op uint8, keySel uint32, raddr, length, off uint64, payload []byte) {
		r := newAccessRig(t)
		r.d.mu.Lock()
		defer r.d.mu.Unlock()
		rkey := keySel
		switch keySel % 4 {
		case 0:
			rkey = r.a.rkey
		case 1:
			rkey = r.b.rkey // a region of another PD
		}
		m := message{op: efaio.OpType(op % 3), typ: uapi.QPTypeDriver, qkey: 9, srcGID: r.d.gid, dstGID: r.d.gid,
			dstQPN: uint16(r.q.qpn), length: length % (1 << 20), raddr: raddr, rkey: rkey}
		sink := make([]byte, m.length)
		if m.op == efaio.OpRDMARead {
			m.sink = mem.Own(sink)
		}
		// Whole-message delivery, as for a same-device requester...
		m.src[0], m.nsrc = mem.Own(payload), 1
		if uint64(len(payload)) <= m.length {
			r.d.respond(&m)
		}
		// ...and segment by segment, as from the network, at any offset.
		var in inbound
		if r.d.accept(&m, &in) == efaio.StatusOK && m.op != efaio.OpRDMARead {
			if off+uint64(len(payload)) <= m.length {
				r.d.place(&in, off, payload)
			}
			r.d.finish(&in)
		}
		if m.op == efaio.OpRDMARead {
			if src, ok := r.d.remoteSpan(r.pd, rkey, raddr, m.length, uapi.AccessRemoteRead); ok && !within(src, r.inA) {
				t.Fatalf("a read span outside its region")
			}
		}
		r.guardsIntact(t)
	})
}

func FuzzLocalAccess(f *testing.F) {
	f.Add(uint32(0), uint64(0x10000), uint32(100), uint8(0))
	f.Add(uint32(1), uint64(0x20000), uint32(10), uint8(1))
	f.Add(uint32(0), uint64(0x10fff), uint32(2), uint8(2))
	f.Fuzz(func(t *testing.T, keySel uint32, addr uint64, n uint32, op uint8) {
		r := newAccessRig(t)
		ah, err := r.d.CreateAH(r.pd, r.d.gid)
		if err != nil {
			t.Fatal(err)
		}
		r.d.mu.Lock()
		defer r.d.mu.Unlock()
		lkey := keySel & efaio.LKeyMask
		switch keySel % 3 {
		case 0:
			lkey = r.a.lkey
		case 1:
			lkey = r.b.lkey
		}
		w := efaio.TxDesc{Op: efaio.OpType(op % 3), Length: 1, AHN: 0, QKey: 9, DestQPN: uint16(r.q.qpn),
			SGL: [2]efaio.BufDesc{{Length: n % 8192, LKey: lkey, Addr: addr}}}
		w.Remote = efaio.RemoteMem{Length: n % 8192, RKey: r.a.rkey, Addr: 0x10000}
		w.AHN = ah.ahn
		var m message
		if r.d.prepare(r.q, &w, &m) == efaio.StatusOK {
			for _, s := range m.src[:m.nsrc] {
				if !within(s, r.inA) {
					t.Fatal("a local source outside the QP's regions")
				}
			}
			if !within(m.sink, r.inA) {
				t.Fatal("a local sink outside the QP's regions")
			}
			r.d.respond(&m)
		}
		r.guardsIntact(t)
	})
}
