package wire

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"math"
	"reflect"
	"testing"
)

// The image is written out by hand from docs/wire.md: header, one DATA frame with 3 bytes of
// payload, one ACK.
var image = []byte{
	// datagram header
	0x04, 0x02, 0x12, 0xb7, // version 4, path 2, source port 4791
	0xde, 0xad, 0xbe, 0xef, // source incarnation
	0x00, 0x00, 0x00, 0x07, // destination incarnation
	0x00, 0x03, 0x00, 0x04, // tx epoch 3, rx epoch 4
	0x00, 0x00, 0x00, 0x00, // CRC-32C, filled in by init below
	// DATA frame: type 1, flags 0, length 4+44+3 = 51
	0x01, 0x00, 0x00, 0x33,
	0x00, 0x00, 0x00, 0x10, // PSN 16
	0x00, 0x00, 0x00, 0x05, // message 5
	0x00, 0x00, 0x05, 0x84, // offset 1412
	0x00, 0x00, 0x10, 0x00, // length 4096
	0x02, 0x01, // op WRITE, flags IMM
	0x00, 0x02, 0x00, 0x03, // src QPN 2, dst QPN 3
	0x00, 0x00, // status, reserved
	0x11, 0x11, 0x11, 0x11, // qkey
	0xca, 0xfe, 0xba, 0xbe, // imm
	0x01, 0x02, 0x03, 0x04, // rkey
	0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, 0x10, 0x00, // raddr 0x7f_0000_1000
	0xaa, 0xbb, 0xcc, // payload
	// ACK frame: type 2, length 4+48 = 52
	0x02, 0x00, 0x00, 0x34,
	0x00, 0x00, 0x00, 0x09, // cum 9
	0x00, 0x00, 0x00, 0x0c, // highest 12
	0, 0, 0, 0, 0, 0, 0, 0x05, // sack word 0: 10 and 12 arrived
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	0x01, 0, 0, 0, // path 1
	0x00, 0x00, 0x00, 0x21, // horizon 33
}

// The checksum of the image, computed here with hash/crc32 over the bytes above (checksum
// field zero), not by the package's encoder.
func init() {
	sum := crc32.Checksum(image, crc32.MakeTable(crc32.Castagnoli))
	image[16], image[17], image[18], image[19] = byte(sum>>24), byte(sum>>16), byte(sum>>8), byte(sum)
}

func TestImage(t *testing.T) {
	h := Header{Path: 2, SrcPort: 4791, SrcInc: 0xdeadbeef, DstInc: 7, TxEpoch: 3, RxEpoch: 4}
	d := Data{PSN: 16, MsgID: 5, Offset: 1412, Length: 4096, Op: OpWrite, Flags: FlagImm, SrcQPN: 2, DstQPN: 3,
		QKey: 0x11111111, Imm: 0xcafebabe, RKey: 0x01020304, RAddr: 0x7f00001000, Payload: []byte{0xaa, 0xbb, 0xcc}}
	a := Ack{Cum: 9, Highest: 12, Sack: [SackWords]uint64{5}, Path: 1, Horizon: 33, HasHorizon: true}
	b := AppendHeader(nil, &h)
	b = AppendData(b, &d)
	b = AppendAck(b, &a)
	PutChecksum(b)
	if !bytes.Equal(b, image) {
		t.Fatalf("encoded\n% x\nwant\n% x", b, image)
	}
	gh, frames, err := ParseHeader(image)
	if err != nil || gh != h {
		t.Fatalf("header %+v, %v", gh, err)
	}
	var f Frame
	frames, err = NextFrame(frames, &f)
	if err != nil || f.Type != TypeData || !reflect.DeepEqual(f.Data, d) {
		t.Fatalf("data frame %+v, %v", f.Data, err)
	}
	frames, err = NextFrame(frames, &f)
	if err != nil || f.Type != TypeAck || f.Ack != a || len(frames) != 0 {
		t.Fatalf("ack frame %+v, %v, %d left", f.Ack, err, len(frames))
	}
	// AppendDataHeader then the payload gives the same bytes as AppendData.
	b2 := AppendDataHeader(nil, &d, 3)
	b2 = append(b2, d.Payload...)
	if !bytes.Equal(b2, AppendData(nil, &d)) {
		t.Fatal("AppendDataHeader differs from AppendData")
	}
}

func TestRejects(t *testing.T) {
	if _, _, err := ParseHeader(image[:19]); err != ErrShort {
		t.Fatalf("short header: %v", err)
	}
	bad := append([]byte{}, image...)
	bad[0] = 1
	if _, _, err := ParseHeader(bad); err != ErrVersion {
		t.Fatalf("version 1: %v", err)
	}
	for i := range image { // any flipped bit fails the checksum
		for bit := range 8 {
			bad := append([]byte{}, image...)
			bad[i] ^= 1 << bit
			if _, _, err := ParseHeader(bad); i > 0 && err != ErrChecksum {
				t.Fatalf("bit %d of byte %d flipped: %v", bit, i, err)
			}
		}
	}
	noFrame := append([]byte{}, image[:20]...)
	PutChecksum(noFrame)
	if _, _, err := ParseHeader(noFrame); err != ErrFrame {
		t.Fatalf("no frame: %v", err)
	}
	frame := func(mod func(b []byte)) error {
		b := append([]byte{}, image[20:20+51]...)
		mod(b)
		var f Frame
		_, err := NextFrame(b, &f)
		return err
	}
	for name, mod := range map[string]func([]byte){
		"length past the end":  func(b []byte) { b[3] = 52 },
		"length below header":  func(b []byte) { b[3] = 3 },
		"frame flags":          func(b []byte) { b[1] = 1 },
		"unknown type":         func(b []byte) { b[0] = 8 },
		"unknown op":           func(b []byte) { b[4+16] = 6 },
		"unknown data flag":    func(b []byte) { b[4+17] = 4 },
		"reserved byte":        func(b []byte) { b[4+23] = 1 },
		"payload past length":  func(b []byte) { b[4+14], b[4+15] = 0x05, 0x86 },
		"read request payload": func(b []byte) { b[4+16] = byte(OpReadReq) },
		"short data header":    func(b []byte) { b[3] = 40 },
	} {
		if err := frame(mod); !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A RESP answers a failure: one of status 0 would complete its request as a success.
	if _, err := NextFrame(AppendData(nil, &Data{MsgID: 3, Op: OpResp, Status: 0}), new(Frame)); err != ErrFrame {
		t.Errorf("RESP of status 0: %v", err)
	}
	if _, err := NextFrame(AppendData(nil, &Data{MsgID: 3, Op: OpResp, Status: 7}), new(Frame)); err != nil {
		t.Errorf("RESP of status 7: %v", err)
	}
	ack := append([]byte{}, image[20+51:]...)
	ack[len(ack)-5] = 1 // the last reserved byte, before the horizon
	var f Frame
	if _, err := NextFrame(ack, &f); err != ErrFrame {
		t.Fatalf("ack reserved byte: %v", err)
	}
	ack = append([]byte{}, image[20+51:]...)
	ack[len(ack)-7] = AckHorizonZero // the flag, with horizon 33
	if _, err := NextFrame(ack, &f); err != ErrFrame {
		t.Fatalf("ack flag for horizon 0 with horizon 33: %v", err)
	}
	for _, b := range [][]byte{AppendProbe(nil, 7, false), AppendProbe(nil, 7, true), AppendReset(nil),
		AppendChallenge(nil, 9, 4791), AppendCookie(nil, 9, []uint16{1, 2})} {
		if rest, err := NextFrame(b, &f); err != nil || len(rest) != 0 {
			t.Fatalf("control frame % x: %v", b, err)
		}
	}
}

// A PROBE frame written out by hand from docs/wire.md: the nonce, then 6 bytes that must be zero.
func TestProbeFrame(t *testing.T) {
	want := []byte{0x03, 0x00, 0x00, 0x0e, 0x00, 0x00, 0x01, 0x02, 0, 0, 0, 0, 0, 0} // PROBE, 14 bytes, nonce 258
	if got := AppendProbe(nil, 258, false); !bytes.Equal(got, want) {
		t.Fatalf("PROBE % x, want % x", got, want)
	}
	var f Frame
	if _, err := NextFrame(want, &f); err != nil || f.Nonce != 258 {
		t.Fatalf("parsed %+v, %v", f, err)
	}
	for i := 8; i < len(want); i++ {
		bad := append([]byte(nil), want...)
		bad[i] = 1
		if _, err := NextFrame(bad, &f); err != ErrFrame {
			t.Fatalf("a PROBE with byte %d of its zeros set: %v, want ErrFrame", i, err)
		}
	}
}

// A CHALLENGE frame written out by hand from docs/wire.md: the cookie, then the port it is for;
// any other length is malformed.
func TestChallengeFrame(t *testing.T) {
	want := []byte{
		0x06, 0x00, 0x00, 0x0e, // CHALLENGE, length 4+8+2 = 14
		0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x09, // cookie
		0x9c, 0x40, // port 40000
	}
	got := AppendChallenge(nil, 0x0102030405060709, 40000)
	if !bytes.Equal(got, want) {
		t.Fatalf("CHALLENGE % x, want % x", got, want)
	}
	var f Frame
	if _, err := NextFrame(want, &f); err != nil || f.Cookie != 0x0102030405060709 || f.Port != 40000 {
		t.Fatalf("parsed %+v, %v", f, err)
	}
	for _, n := range []int{12, 13, 15} { // the version 3 form (no port), a short port, a byte more
		bad := append(append([]byte(nil), want...), 0)[:n]
		bad[3] = byte(n)
		if _, err := NextFrame(bad, &f); err != ErrFrame {
			t.Fatalf("a CHALLENGE of %d bytes: %v, want ErrFrame", n, err)
		}
	}
}

// A COOKIE frame written out by hand from docs/wire.md: the cookie, then the sender's source
// ports; an empty or odd list is malformed. RewriteSource names one port everywhere.
func TestCookieFrame(t *testing.T) {
	want := []byte{
		0x07, 0x00, 0x00, 0x12, // COOKIE, length 4+8+6 = 18
		0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x09, // cookie
		0x12, 0xb7, 0x9c, 0x40, 0x9c, 0x41, // ports 4791, 40000, 40001
	}
	got := AppendCookie(nil, 0x0102030405060709, []uint16{4791, 40000, 40001})
	if !bytes.Equal(got, want) {
		t.Fatalf("COOKIE % x, want % x", got, want)
	}
	var f Frame
	if _, err := NextFrame(want, &f); err != nil || f.Cookie != 0x0102030405060709 || f.Ports.Len() != 3 ||
		f.Ports.At(1) != 40000 || !f.Ports.Has(40001) || f.Ports.Has(4792) {
		t.Fatalf("parsed %+v, %v", f, err)
	}
	for _, bad := range [][]byte{want[:12], append(append([]byte{}, want...), 0x01)} { // no port; an odd byte
		bad = append([]byte(nil), bad...)
		bad[3] = byte(len(bad))
		if _, err := NextFrame(bad, &f); err != ErrFrame {
			t.Fatalf("% x: %v, want ErrFrame", bad, err)
		}
	}
	d := AppendHeader(nil, &Header{SrcPort: 4791})
	d = AppendProbe(d, 1, false)
	d = append(d, want...)
	PutChecksum(d)
	if !RewriteSource(d, 5000) {
		t.Fatal("RewriteSource refused a good datagram")
	}
	h, frames, err := ParseHeader(d)
	if err != nil || h.SrcPort != 5000 {
		t.Fatalf("header %+v, %v", h, err)
	}
	frames, _ = NextFrame(frames, &f)
	if _, err := NextFrame(frames, &f); err != nil || f.Ports.At(0) != 5000 || f.Ports.At(2) != 5000 {
		t.Fatalf("rewritten ports % x, %v", []byte(f.Ports), err)
	}
}

// FuzzParse: any bytes parse without panicking, and every frame that parses encodes back to
// the same bytes.
func FuzzParse(f *testing.F) {
	f.Add(image)
	f.Add(append(AppendHeader(nil, &Header{}), AppendProbe(nil, 1, true)...))
	f.Add(append(AppendHeader(nil, &Header{}), AppendReset(nil)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		ParseHeader(b) // any bytes at all: no panic
		// The fuzzer rarely hits a checksum, so check the rest with a correct one.
		b = append([]byte(nil), b...)
		PutChecksum(b)
		h, frames, err := ParseHeader(b)
		if err != nil {
			return
		}
		if got := AppendHeader(nil, &h); !bytes.Equal(got[:16], b[:16]) {
			t.Fatalf("header round trip % x", got)
		}
		var fr Frame
		for len(frames) > 0 {
			rest, err := NextFrame(frames, &fr)
			if err != nil {
				return
			}
			raw := frames[:len(frames)-len(rest)]
			var enc []byte
			switch fr.Type {
			case TypeData:
				enc = AppendData(nil, &fr.Data)
			case TypeAck:
				enc = AppendAck(nil, &fr.Ack)
			case TypeProbe, TypeProbeAck:
				enc = AppendProbe(nil, fr.Nonce, fr.Type == TypeProbeAck)
			case TypeReset:
				enc = AppendReset(nil)
			case TypeChallenge:
				enc = AppendChallenge(nil, fr.Cookie, fr.Port)
			case TypeCookie:
				ports := make([]uint16, fr.Ports.Len())
				for i := range ports {
					ports[i] = fr.Ports.At(i)
				}
				enc = AppendCookie(nil, fr.Cookie, ports)
			}
			if !bytes.Equal(enc, raw) {
				t.Fatalf("frame round trip\n% x\n% x", raw, enc)
			}
			frames = rest
		}
	})
}

// docs/wire.md "ACK": a horizon of 0 is "no RESP" on the wire unless the flag says it is PSN 0 (a
// RESP at PSN 2^32-1); both decode as they were encoded.
func TestAckHorizonZero(t *testing.T) {
	for _, a := range []Ack{{Cum: 3}, {Cum: 3, HasHorizon: true}, {Cum: 3, Horizon: 7, HasHorizon: true}} {
		b := AppendAck(nil, &a)
		if flag := b[FrameHeaderSize+41]; (flag == AckHorizonZero) != (a.HasHorizon && a.Horizon == 0) {
			t.Errorf("%+v: flags byte %d", a, flag)
		}
		var f Frame
		if _, err := NextFrame(b, &f); err != nil || f.Ack != a {
			t.Errorf("%+v decoded as %+v, %v", a, f.Ack, err)
		}
	}
}

// Frame types and ops print as docs/wire.md names them; unknown values by number.
func TestNames(t *testing.T) {
	for v, want := range map[fmt.Stringer]string{TypeData: "DATA", TypeProbeAck: "PROBE_ACK", TypeCookie: "COOKIE",
		FrameType(0): "frame type 0", FrameType(8): "frame type 8", OpSend: "SEND", OpReadResp: "READ_RESP",
		OpAbort: "ABORT", Op(6): "op 6"} {
		if got := v.String(); got != want {
			t.Errorf("%#v prints %q, want %q", v, got, want)
		}
	}
}

func TestPSNLessWraps(t *testing.T) {
	for _, c := range []struct {
		a, b PSN
		want bool
	}{
		{0, 1, true}, {1, 0, false}, {5, 5, false},
		{math.MaxUint32, 0, true}, {0, math.MaxUint32, false}, // across the wrap
		{math.MaxUint32 - 10, 10, true}, {10, math.MaxUint32 - 10, false},
		{0, 1<<31 - 1, true}, {0, 1<<31 + 1, false}, // half the space: the limit
	} {
		if got := c.a.Less(c.b); got != c.want {
			t.Errorf("%d.Less(%d) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}

func TestEpochLessWraps(t *testing.T) {
	for _, c := range []struct {
		a, b Epoch
		want bool
	}{
		{0, 1, true}, {1, 0, false}, {7, 7, false},
		{math.MaxUint16, 0, true}, {0, math.MaxUint16, false},
		{0, 1<<15 - 1, true}, {0, 1<<15 + 1, false},
	} {
		if got := c.a.Less(c.b); got != c.want {
			t.Errorf("%d.Less(%d) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
