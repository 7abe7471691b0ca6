package efaio

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// The byte images below are written out by hand from the tables of docs/descriptors.md (offsets,
// bit positions, little-endian), not produced by the encoders they check.

func TestTxWQESendImage(t *testing.T) {
	want := make([]byte, 64)
	copy(want, []byte{
		0x34, 0x12, // req_id 0x1234
		0x90,       // ctrl1: op SEND(0), has_imm (bit 4), meta_desc (bit 7)
		0x1d,       // ctrl2: phase 1, first (bit 2), last (bit 3), comp_req (bit 4)
		0xcd, 0xab, // dest_qp_num 0xabcd
		0x02, 0x00, // length: 2 SGL buffers
		0x78, 0x56, 0x34, 0x12, // immediate 0x12345678
		0x07, 0x00, // ah 7
		0x01,                   // ctrl3: processing hint BURST_PPS_SENSITIVE
		0x00,                   // reserved
		0x11, 0x11, 0x11, 0x11, // qkey
	})
	// sgl[0] @32: length 100, lkey 0x123456, addr 0x0000_0001_0000_2000
	copy(want[32:], []byte{100, 0, 0, 0, 0x56, 0x34, 0x12, 0x00, 0x00, 0x20, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00})
	// sgl[1] @48: length 0x10000, lkey 0xffffff, addr 0xdeadbeef
	copy(want[48:], []byte{0x00, 0x00, 0x01, 0x00, 0xff, 0xff, 0xff, 0x00, 0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0})
	d := TxDesc{
		ReqID: 0x1234, Op: OpSend, HasImm: true, Phase: 1, CompReq: true, DestQPN: 0xabcd, Length: 2,
		Imm: 0x12345678, AHN: 7, Hints: 1, QKey: 0x11111111,
		SGL: [2]BufDesc{{100, 0x123456, 0x100002000}, {0x10000, 0xffffff, 0xdeadbeef}},
	}
	got := make(TxWQE, 64)
	got.Encode(&d)
	if !bytes.Equal(got, want) {
		t.Fatalf("encoded\n% x\nwant\n% x", got, want)
	}
	var back TxDesc
	if err := TxWQE(want).Decode(&back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, d) {
		t.Fatalf("decoded %+v\nwant %+v", back, d)
	}
}

func TestTxWQERDMAImages(t *testing.T) {
	// RDMA read, 64 bytes: remote_mem @32, local_mem[0] @48, 64-bit request-id extension @26.
	want := make([]byte, 64)
	copy(want, []byte{0x01, 0x00, 0x81, 0x1c, 0x05, 0x00, 0x01, 0x00})
	copy(want[26:], []byte{0x22, 0x22, 0x33, 0x33, 0x44, 0x44}) // req_id_ex words
	copy(want[32:], []byte{0x00, 0x10, 0, 0, 0xef, 0xbe, 0xad, 0xde, 0x00, 0x00, 0x00, 0x40, 0x7f, 0, 0, 0})
	copy(want[48:], []byte{0x00, 0x10, 0, 0, 0x09, 0x01, 0x00, 0x00, 0x00, 0x80, 0, 0, 0, 0, 0, 0})
	d := TxDesc{ReqID: 1, Op: OpRDMARead, CompReq: true, DestQPN: 5, Length: 1, ReqIDEx: 0x444433332222,
		Remote: RemoteMem{Length: 4096, RKey: 0xdeadbeef, Addr: 0x7f40000000},
		SGL:    [2]BufDesc{{Length: 4096, LKey: 0x109, Addr: 0x8000}}}
	got := make(TxWQE, 64)
	got.Encode(&d)
	if !bytes.Equal(got, want) {
		t.Fatalf("read encoded\n% x\nwant\n% x", got, want)
	}
	// Inline RDMA write with immediate, 128 bytes: data @48, meta.length = remote.length = bytes.
	want = make([]byte, 128)
	copy(want, []byte{0x00, 0x00, 0xb2, 0x0c, 0x09, 0x00, 0x50, 0x00, 0xaa, 0, 0, 0})
	copy(want[32:], []byte{0x50, 0, 0, 0, 0x01, 0, 0, 0, 0x00, 0x01, 0, 0, 0, 0, 0, 0})
	data := bytes.Repeat([]byte{0xab}, 80)
	copy(want[48:], data)
	d = TxDesc{Op: OpRDMAWrite, HasImm: true, Inline: true, DestQPN: 9, Length: 80, Imm: 0xaa,
		Remote: RemoteMem{Length: 80, RKey: 1, Addr: 0x100}, InlineBuf: data}
	got = make(TxWQE, 128)
	got.Encode(&d)
	if !bytes.Equal(got, want) {
		t.Fatalf("inline write encoded\n% x\nwant\n% x", got, want)
	}
	var back TxDesc
	if err := TxWQE(want).Decode(&back); err != nil || !bytes.Equal(back.InlineBuf, data) || back.Remote != d.Remote {
		t.Fatalf("inline write decoded %+v, %v", back, err)
	}
}

func TestTxWQEDecodeRejects(t *testing.T) {
	base := func() TxWQE {
		w := make(TxWQE, 64)
		w.Encode(&TxDesc{Op: OpSend, Length: 1, CompReq: true, SGL: [2]BufDesc{{Length: 1, LKey: 1}}})
		return w
	}
	for _, c := range []struct {
		name string
		mod  func(TxWQE)
		want error
	}{
		{"no meta_desc", func(w TxWQE) { w[2] &^= 0x80 }, ErrNotMeta},
		{"meta_extension", func(w TxWQE) { w[2] |= 0x40 }, ErrReserved},
		{"ctrl2 bit 1", func(w TxWQE) { w[3] |= 0x02 }, ErrReserved},
		{"ctrl2 bits 7:5", func(w TxWQE) { w[3] |= 0x80 }, ErrReserved},
		{"not first", func(w TxWQE) { w[3] &^= 0x04 }, ErrReserved},
		{"not last", func(w TxWQE) { w[3] &^= 0x08 }, ErrReserved},
		{"ctrl3 bits 7:2", func(w TxWQE) { w[14] = 0x04 }, ErrReserved},
		{"reserved byte 15", func(w TxWQE) { w[15] = 1 }, ErrReserved},
		{"reserved2", func(w TxWQE) { w[22] = 1 }, ErrReserved},
		{"op 3", func(w TxWQE) { w[2] = w[2]&^0x0f | 3 }, ErrOpType},
		{"3 SGL buffers", func(w TxWQE) { w[6] = 3 }, ErrLength},
		{"wide lkey", func(w TxWQE) { w[39] = 1 }, ErrLKey},
		{"inline past the WQE", func(w TxWQE) { w[2] |= 0x20; w[6] = 33 }, ErrLength},
		{"read with imm", func(w TxWQE) { w[2] = w[2]&^0x0f | 1 | 0x10 }, ErrReserved},
		{"inline read", func(w TxWQE) { w[2] = w[2]&^0x0f | 1 | 0x20 }, ErrInline},
		{"inline write in 64 bytes", func(w TxWQE) { w[2] = w[2]&^0x0f | 2 | 0x20 }, ErrInline},
		{"RDMA with 2 buffers", func(w TxWQE) { w[2] = w[2]&^0x0f | 2; w[6] = 2 }, ErrLength},
	} {
		w := base()
		c.mod(w)
		var d TxDesc
		if err := w.Decode(&d); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	var d TxDesc
	if err := TxWQE(make([]byte, 63)).Decode(&d); err != ErrShort {
		t.Fatalf("short WQE: %v", err)
	}
}

func TestRxDescImage(t *testing.T) {
	want := []byte{
		0x00, 0x30, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, // buf_addr 0x1_0000_3000
		0x05, 0x80, // req_id 0x8005
		0xff, 0xff, // length 65535
		0x56, 0x34, 0x12, 0xc0, // lkey 0x123456, first (bit 30), last (bit 31)
	}
	f := RxDescFields{Addr: 0x100003000, ReqID: 0x8005, Length: 0xffff, LKey: 0x123456, First: true, Last: true}
	got := make(RxDesc, 16)
	got.Encode(&f)
	if !bytes.Equal(got, want) {
		t.Fatalf("encoded % x, want % x", got, want)
	}
	var back RxDescFields
	if err := RxDesc(want).Decode(&back); err != nil || back != f {
		t.Fatalf("decoded %+v, %v", back, err)
	}
	want[15] = 0x01 // bit 24: must be zero
	if err := RxDesc(want).Decode(&back); err != ErrReserved {
		t.Fatalf("reserved bit: %v", err)
	}
}

func TestCQEImages(t *testing.T) {
	// TX CQE in 64-bit mode: req_id, status 10 (RNR), flags phase|q_type SEND (1<<1)|op RDMA_WRITE (2<<4).
	tx := make([]byte, 32)
	copy(tx, []byte{0x78, 0x56, 10, 0x23, 0x09, 0x00, 0x34, 0x12, 0xef, 0xbe, 0xad, 0xde})
	c := Completion{ReqID: 0x5678, Status: StatusRemoteRNR, Phase: 1, QType: QTypeSend, Op: OpRDMAWrite, QPN: 9,
		ReqIDEx: 0xdeadbeef1234}
	got := make(CQE, 32)
	got.Encode(&c)
	if !bytes.Equal(got, tx) {
		t.Fatalf("TX CQE % x, want % x", got, tx)
	}
	// RX CQE ex, SEND with imm from an unknown AH: src_addr @16.
	rx := make([]byte, 32)
	copy(rx, []byte{0x03, 0x00, 0, 0x0c, 0x02, 0x00, 0x00, 0x04, 0xff, 0xff, 0x07, 0x00, 0x44, 0x33, 0x22, 0x11})
	for i := range 16 {
		rx[16+i] = byte(i + 1)
	}
	c = Completion{ReqID: 3, Phase: 0, QType: QTypeRecv, HasImm: true, Op: OpSend, QPN: 2, Length: 1024,
		AHN: UnknownAH, SrcQPN: 7, Imm: 0x11223344, SrcAddr: [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}
	got.Encode(&c)
	if !bytes.Equal(got, rx) {
		t.Fatalf("RX CQE % x, want % x", got, rx)
	}
	var back Completion
	if err := CQE(rx).Decode(HeaderWord(&c), &back); err != nil || back != c {
		t.Fatalf("RX decoded %+v, %v", back, err)
	}
	// RX CQE for an unsolicited RDMA write with imm of 0x23456 bytes: length_hi @16, flags
	// q_type RECV (2<<1) | has_imm | op RDMA_WRITE (2<<4) | unsolicited (bit 7) | phase.
	w := make([]byte, 32)
	copy(w, []byte{0, 0, 0, 0xad, 0x02, 0x00, 0x56, 0x34, 0x01, 0x00, 0x03, 0x00, 1, 0, 0, 0, 0x02, 0x00})
	c = Completion{Phase: 1, QType: QTypeRecv, HasImm: true, Op: OpRDMAWrite, Unsolicited: true, QPN: 2,
		Length: 0x23456, AHN: 1, SrcQPN: 3, Imm: 1}
	got.Encode(&c)
	if !bytes.Equal(got, w) {
		t.Fatalf("write-imm CQE % x, want % x", got, w)
	}
	if err := CQE(w).Decode(HeaderWord(&c), &back); err != nil || back != c {
		t.Fatalf("write-imm decoded %+v, %v", back, err)
	}
	if err := CQE(w).Decode(0x3<<25, &back); err != ErrReserved {
		t.Fatalf("q_type 3: %v", err)
	}
}

func TestCQDoorbell(t *testing.T) {
	if v := CQDoorbell(0x1234, 2, true); v != 0x1234|2<<29|1<<31 {
		t.Fatalf("doorbell %#x", v)
	}
	if v := CQDoorbell(0xffff, 7, false); v != 0xffff|3<<29 {
		t.Fatalf("doorbell %#x", v)
	}
}

func TestStatusStrings(t *testing.T) {
	if StatusRemoteRNR.String() != "remote receiver not ready" || Status(99).String() != "status 99" {
		t.Fatal(StatusRemoteRNR.String(), Status(99).String())
	}
}
