package efaio

import (
	"bytes"
	"testing"
)

// Decoders take any bytes without panicking; whatever decodes cleanly encodes back to the same
// bytes (so the decoder accepts nothing the format cannot say).

func FuzzTxWQE(f *testing.F) {
	for _, d := range []TxDesc{
		{Op: OpSend, Length: 2, CompReq: true, SGL: [2]BufDesc{{1, 2, 3}, {4, 5, 6}}},
		{Op: OpRDMAWrite, Inline: true, Length: 3, Remote: RemoteMem{Length: 3}, InlineBuf: []byte{1, 2, 3}},
		{Op: OpRDMARead, Length: 1, Remote: RemoteMem{1, 2, 3}, SGL: [2]BufDesc{{1, 2, 3}}},
	} {
		for _, n := range []int{64, 128} {
			w := make(TxWQE, n)
			w.Encode(&d)
			f.Add([]byte(w))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var d TxDesc
		if err := TxWQE(b).Decode(&d); err != nil {
			return
		}
		w := make(TxWQE, len(b))
		w.Encode(&d)
		if d.Inline { // bytes after inline data are free to hold anything
			return
		}
		if !bytes.Equal(w, b) {
			t.Fatalf("round trip\n% x\n% x", b, []byte(w))
		}
	})
}

func FuzzRxDesc(f *testing.F) {
	f.Add(make([]byte, 16))
	f.Fuzz(func(t *testing.T, b []byte) {
		var d RxDescFields
		if err := RxDesc(b).Decode(&d); err != nil {
			return
		}
		w := make(RxDesc, 16)
		w.Encode(&d)
		if !bytes.Equal(w, b[:16]) {
			t.Fatalf("round trip % x % x", b[:16], []byte(w))
		}
	})
}

func FuzzCQE(f *testing.F) {
	c := Completion{QType: QTypeRecv, Op: OpRDMAWrite, Length: 70000}
	e := make(CQE, 32)
	e.Encode(&c)
	f.Add([]byte(e))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 4 {
			return
		}
		hdr := uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
		var c Completion
		_ = CQE(b).Decode(hdr, &c) // must not panic on any length or content
	})
}
