package efaio

import (
	"bytes"
	"reflect"
	"testing"
)

// Decoders take any bytes without panicking. A TX WQE that decodes cleanly encodes to bytes that
// decode to the same descriptor: the meta descriptor's control bits and reserved bytes are checked,
// while data-area bytes the operation does not use are ignored, as a device ignores them.

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
		var again TxDesc
		if err := w.Decode(&again); err != nil {
			t.Fatalf("re-encoded WQE does not decode: %v\n% x", err, []byte(w))
		}
		if !reflect.DeepEqual(normal(d), normal(again)) {
			t.Fatalf("round trip\n%+v\n%+v", d, again)
		}
		if !bytes.Equal(w[:TxMetaSize], b[:TxMetaSize]) {
			t.Fatalf("meta descriptor changed\n% x\n% x", b[:TxMetaSize], []byte(w[:TxMetaSize]))
		}
	})
}

// normal drops what a descriptor's operation does not use, so that two decodings compare.
func normal(d TxDesc) TxDesc {
	if len(d.InlineBuf) == 0 {
		d.InlineBuf = nil
	}
	return d
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
