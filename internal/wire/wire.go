// Package wire holds softefa's SRD-over-UDP wire format, version 4: a datagram header followed
// by one or more frames (DATA, ACK, PROBE, PROBE_ACK, RESET, CHALLENGE, COOKIE). docs/wire.md is
// the specification; this package is one implementation of it.
//
// Each frame type has an Append function that encodes a whole frame onto a buffer, and
// ParseHeader and NextFrame decode a datagram. They check every length before anything reads past
// it, so a datagram from the network can be handed to them as is; they never panic and never
// allocate.
package wire

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"strconv"
)

// Version is the wire format version this package speaks.
const Version = 4

// Sizes of the fixed parts.
const (
	DatagramHeaderSize = 20
	FrameHeaderSize    = 4
	DataHeaderSize     = 44 // after the frame header
	AckSize            = 48 // after the frame header
	ProbeSize          = 10 // a nonce and 6 zero bytes: a PROBE datagram is as long as a CHALLENGE's
	CookieSize         = 8  // a cookie; a COOKIE frame adds the source ports it is echoed from
	ChallengeSize      = 10 // a CHALLENGE's body: the cookie and the port it is for
	MaxPorts           = 255
	SackWords          = 4 // the ACK's selective-acknowledgement bitmap, in 64-bit words
)

// PSN is a DATA frame's place in its sender's packet stream. PSNs wrap at 2^32 and are
// compared in serial-number arithmetic (RFC 1982): a comes before b when b is less than 2^31
// ahead of it, so an order holds between PSNs less than half the space apart.
type PSN uint32

// Less reports whether a comes before b.
func (a PSN) Less(b PSN) bool { return int32(a-b) < 0 }

// Add is the PSN n after a.
func (a PSN) Add(n uint32) PSN { return a + PSN(n) }

// Dist is how far b is ahead of a (b - a, wrapping): the number of PSNs from a up to b.
func (a PSN) Dist(b PSN) uint32 { return uint32(b - a) }

// Epoch numbers a packet stream's restarts: 16 bits that wrap, compared as PSNs are.
type Epoch uint16

// Less reports whether epoch a comes before b.
func (a Epoch) Less(b Epoch) bool { return int16(a-b) < 0 }

// FrameType is a frame's first byte.
type FrameType uint8

// Frame types.
const (
	TypeData      FrameType = 1
	TypeAck       FrameType = 2
	TypeProbe     FrameType = 3
	TypeProbeAck  FrameType = 4
	TypeReset     FrameType = 5
	TypeChallenge FrameType = 6 // "prove that this port is yours": a cookie, and the port it is for
	TypeCookie    FrameType = 7 // the cookie echoed
)

var frameNames = [...]string{TypeData: "DATA", TypeAck: "ACK", TypeProbe: "PROBE", TypeProbeAck: "PROBE_ACK",
	TypeReset: "RESET", TypeChallenge: "CHALLENGE", TypeCookie: "COOKIE"}

// String is the frame type's name in docs/wire.md, or its number.
func (t FrameType) String() string {
	if int(t) < len(frameNames) && frameNames[t] != "" {
		return frameNames[t]
	}
	return "frame type " + strconv.Itoa(int(t))
}

// Op is the operation a DATA frame carries.
type Op uint8

// Operations a DATA frame carries.
const (
	OpSend     Op = 0 // a SEND's payload segment
	OpReadReq  Op = 1 // an RDMA read request (no payload)
	OpWrite    Op = 2 // an RDMA write's payload segment
	OpReadResp Op = 3 // a segment of RDMA read data, answering a READ_REQ
	OpResp     Op = 4 // the responder's result for a message (Status)
	OpAbort    Op = 5 // the requester abandoned message MsgID; this PSN carries nothing else
)

var opNames = [...]string{OpSend: "SEND", OpReadReq: "READ_REQ", OpWrite: "WRITE", OpReadResp: "READ_RESP",
	OpResp: "RESP", OpAbort: "ABORT"}

// String is the operation's name in docs/wire.md, or its number.
func (o Op) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return "op " + strconv.Itoa(int(o))
}

// DATA frame flags.
const (
	FlagImm = 1 << 0 // the message carries immediate data
	FlagUD  = 1 << 1 // an unreliable datagram: not in the PSN stream, never acknowledged
)

// Errors Parse reports.
var (
	ErrShort    = errors.New("wire: datagram shorter than its headers")
	ErrVersion  = errors.New("wire: unknown version")
	ErrFrame    = errors.New("wire: malformed frame")
	ErrChecksum = errors.New("wire: checksum mismatch")
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Header is the datagram header: who sent it, on which path, the two incarnations, and the
// epochs of the two packet streams between the devices.
type Header struct {
	Path    uint8  // the sender's path index
	SrcPort uint16 // the sender's device port; with the source IP it names the sender's GID
	SrcInc  uint32 // the sender's incarnation
	DstInc  uint32 // the receiver's incarnation as the sender knows it; 0 if unknown
	TxEpoch Epoch  // epoch of the sender's packet stream, which this datagram's DATA frames are in
	RxEpoch Epoch  // epoch of the receiver's packet stream, which this datagram's ACK frames answer
}

// AppendHeader appends a datagram header.
func AppendHeader(b []byte, h *Header) []byte {
	b = append(b, Version, h.Path)
	b = binary.BigEndian.AppendUint16(b, h.SrcPort)
	b = binary.BigEndian.AppendUint32(b, h.SrcInc)
	b = binary.BigEndian.AppendUint32(b, h.DstInc)
	b = binary.BigEndian.AppendUint16(b, uint16(h.TxEpoch))
	b = binary.BigEndian.AppendUint16(b, uint16(h.RxEpoch))
	return append(b, 0, 0, 0, 0) // the checksum, filled in by PutChecksum
}

// PutChecksum fills in the header's checksum: CRC-32C of the whole datagram with the checksum
// field zero. Call it when the datagram is complete.
func PutChecksum(b []byte) {
	if len(b) < DatagramHeaderSize {
		return
	}
	clear(b[16:20])
	binary.BigEndian.PutUint32(b[16:], crc32.Checksum(b, castagnoli))
}

// checksumOK checks b's checksum. It zeroes the field while it computes and puts it back.
func checksumOK(b []byte) bool {
	want := binary.BigEndian.Uint32(b[16:])
	clear(b[16:20])
	ok := crc32.Checksum(b, castagnoli) == want
	binary.BigEndian.PutUint32(b[16:], want)
	return ok
}

// Data is a DATA frame's header fields; Payload follows them.
type Data struct {
	PSN     PSN    // position in the sender's packet stream (unused with FlagUD)
	MsgID   uint32 // the message (for READ_RESP and RESP: the message answered)
	Offset  uint32 // the segment's byte offset in the message
	Length  uint32 // the message's total payload (READ_REQ, READ_RESP: the bytes read)
	Op      Op
	Flags   uint8
	SrcQPN  uint16
	DstQPN  uint16
	Status  uint8 // RESP: the EFA completion status of the message answered
	QKey    uint32
	Imm     uint32
	RKey    uint32
	RAddr   uint64
	Payload []byte
}

// Whole reports whether the frame carries its whole message: offset 0 and every byte of it.
func (d *Data) Whole() bool { return d.Offset == 0 && len(d.Payload) == int(d.Length) }

// AppendData appends a DATA frame with d's fields and payload.
func AppendData(b []byte, d *Data) []byte {
	b = appendFrameHeader(b, TypeData, FrameHeaderSize+DataHeaderSize+len(d.Payload))
	b = binary.BigEndian.AppendUint32(b, uint32(d.PSN))
	b = binary.BigEndian.AppendUint32(b, d.MsgID)
	b = binary.BigEndian.AppendUint32(b, d.Offset)
	b = binary.BigEndian.AppendUint32(b, d.Length)
	b = append(b, byte(d.Op), d.Flags)
	b = binary.BigEndian.AppendUint16(b, d.SrcQPN)
	b = binary.BigEndian.AppendUint16(b, d.DstQPN)
	b = append(b, d.Status, 0)
	b = binary.BigEndian.AppendUint32(b, d.QKey)
	b = binary.BigEndian.AppendUint32(b, d.Imm)
	b = binary.BigEndian.AppendUint32(b, d.RKey)
	b = binary.BigEndian.AppendUint64(b, d.RAddr)
	return append(b, d.Payload...)
}

// Ack acknowledges a receiver's packet stream: every PSN below Cum has arrived, bit i of Sack
// (word i/64, bit i%64) says whether Cum+1+i has, and Highest is the highest PSN seen. Path is
// the path of the newest DATA frame the ACK answers, so that the sender credits that path.
//
// Horizon is the PSN after the latest RESP the acknowledger had put in its own packet stream (of
// the datagram's tx epoch) when it wrote the ACK, sent or still queued; HasHorizon is false (and
// Horizon 0) if it has put none. A message is answered with a RESP only when it fails; one whose
// every segment an ACK covers has succeeded unless a RESP for it lies below that ACK's Horizon.
//
// On the wire a horizon of 0 means none, unless the flag AckHorizonZero says it is PSN 0 (a RESP
// ended the PSN space, at 2^32-1): docs/wire.md, "ACK".
type Ack struct {
	Cum        PSN
	Highest    PSN
	Sack       [SackWords]uint64
	Path       uint8
	Horizon    PSN
	HasHorizon bool
}

// AckHorizonZero is the ACK flag (byte 41) saying that its horizon 0 is PSN 0, not "none".
const AckHorizonZero = 1

// AppendAck appends an ACK frame.
func AppendAck(b []byte, a *Ack) []byte {
	b = appendFrameHeader(b, TypeAck, FrameHeaderSize+AckSize)
	b = binary.BigEndian.AppendUint32(b, uint32(a.Cum))
	b = binary.BigEndian.AppendUint32(b, uint32(a.Highest))
	for _, w := range a.Sack {
		b = binary.BigEndian.AppendUint64(b, w)
	}
	var flags uint8
	if a.HasHorizon && a.Horizon == 0 {
		flags = AckHorizonZero
	}
	b = append(b, a.Path, flags, 0, 0)
	return binary.BigEndian.AppendUint32(b, uint32(a.Horizon))
}

// AppendProbe appends a PROBE (or, with ack, a PROBE_ACK) frame carrying nonce.
func AppendProbe(b []byte, nonce uint32, ack bool) []byte {
	typ := TypeProbe
	if ack {
		typ = TypeProbeAck
	}
	b = appendFrameHeader(b, typ, FrameHeaderSize+ProbeSize)
	b = binary.BigEndian.AppendUint32(b, nonce)
	return append(b, 0, 0, 0, 0, 0, 0)
}

// AppendChallenge appends a CHALLENGE frame carrying cookie, to be echoed from UDP source port
// port.
func AppendChallenge(b []byte, cookie uint64, port uint16) []byte {
	b = appendFrameHeader(b, TypeChallenge, FrameHeaderSize+ChallengeSize)
	b = binary.BigEndian.AppendUint64(b, cookie)
	return binary.BigEndian.AppendUint16(b, port)
}

// CookieFrameSize is the size of a COOKIE frame naming n source ports.
func CookieFrameSize(n int) int { return FrameHeaderSize + CookieSize + 2*n }

// AppendCookie appends a COOKIE frame: the cookie echoed, and the UDP source ports the sender
// sends from (1 to MaxPorts of them; more are left out).
func AppendCookie(b []byte, cookie uint64, ports []uint16) []byte {
	ports = ports[:min(len(ports), MaxPorts)]
	b = appendFrameHeader(b, TypeCookie, CookieFrameSize(len(ports)))
	b = binary.BigEndian.AppendUint64(b, cookie)
	for _, p := range ports {
		b = binary.BigEndian.AppendUint16(b, p)
	}
	return b
}

// Ports is a COOKIE frame's list of source ports, as it lies in the datagram.
type Ports []byte

// Len is the number of ports.
func (p Ports) Len() int { return len(p) / 2 }

// At returns port i.
func (p Ports) At(i int) uint16 { return binary.BigEndian.Uint16(p[2*i:]) }

// Has reports whether port is in the list.
func (p Ports) Has(port uint16) bool {
	for i := range p.Len() {
		if p.At(i) == port {
			return true
		}
	}
	return false
}

// RewriteSource names port as the sender's endpoint port in datagram b, in the header and in
// every COOKIE frame's port list, and puts the checksum right: what a relay does that gives the
// sender an address of its own (softefa fabric). It reports false, changing nothing, if b is not
// a well-formed datagram.
func RewriteSource(b []byte, port uint16) bool {
	_, frames, err := ParseHeader(b)
	if err != nil {
		return false
	}
	for off := DatagramHeaderSize; len(frames) > 0; {
		var f Frame
		rest, err := NextFrame(frames, &f)
		if err != nil {
			return false
		}
		if f.Type == TypeCookie {
			for i := range f.Ports.Len() {
				binary.BigEndian.PutUint16(b[off+FrameHeaderSize+CookieSize+2*i:], port)
			}
		}
		off += len(frames) - len(rest)
		frames = rest
	}
	binary.BigEndian.PutUint16(b[2:], port)
	PutChecksum(b)
	return true
}

// AppendReset appends a RESET frame: "I am not the incarnation you addressed".
func AppendReset(b []byte) []byte { return appendFrameHeader(b, TypeReset, FrameHeaderSize) }

func appendFrameHeader(b []byte, typ FrameType, n int) []byte {
	b = append(b, byte(typ), 0)
	return binary.BigEndian.AppendUint16(b, uint16(n))
}

// Frame is one parsed frame: its type and, for the types that have them, its fields. Payload
// refers into the datagram.
type Frame struct {
	Type   FrameType
	Data   Data
	Ack    Ack
	Nonce  uint32
	Cookie uint64
	Port   uint16 // CHALLENGE: the UDP source port the cookie is to be echoed from
	Ports  Ports  // COOKIE: the sender's source ports (refers into the datagram)
}

// ParseHeader checks a datagram's header and checksum and returns the header with the bytes of
// its frames. (It writes b's checksum field while it checks it, and restores it.)
func ParseHeader(b []byte) (Header, []byte, error) {
	var h Header
	if len(b) < DatagramHeaderSize {
		return h, nil, ErrShort
	}
	if b[0] != Version {
		return h, nil, ErrVersion
	}
	if !checksumOK(b) {
		return h, nil, ErrChecksum
	}
	h = Header{Path: b[1], SrcPort: binary.BigEndian.Uint16(b[2:]), SrcInc: binary.BigEndian.Uint32(b[4:]),
		DstInc: binary.BigEndian.Uint32(b[8:]), TxEpoch: Epoch(binary.BigEndian.Uint16(b[12:])),
		RxEpoch: Epoch(binary.BigEndian.Uint16(b[14:]))}
	if len(b) == DatagramHeaderSize {
		return h, nil, ErrFrame // a datagram carries at least one frame
	}
	return h, b[DatagramHeaderSize:], nil
}

// NextFrame parses the first frame of b into f and returns the bytes after it. A malformed frame
// is ErrFrame; the frames after it cannot be found and are lost with it.
func NextFrame(b []byte, f *Frame) ([]byte, error) {
	if len(b) < FrameHeaderSize {
		return nil, ErrFrame
	}
	n := int(binary.BigEndian.Uint16(b[2:]))
	if n < FrameHeaderSize || n > len(b) || b[1] != 0 {
		return nil, ErrFrame
	}
	if err := parseFrame(b[:n], f); err != nil {
		return nil, err
	}
	return b[n:], nil
}

// AppendDataHeader appends a DATA frame whose payload of n bytes the caller appends next (from
// several buffers, say); d.Payload is ignored.
func AppendDataHeader(b []byte, d *Data, n int) []byte {
	p := d.Payload
	d.Payload = nil
	b = AppendData(b, d)
	d.Payload = p
	binary.BigEndian.PutUint16(b[len(b)-FrameHeaderSize-DataHeaderSize+2:], uint16(FrameHeaderSize+DataHeaderSize+n))
	return b
}

func parseFrame(b []byte, f *Frame) error {
	f.Type = FrameType(b[0])
	body := b[FrameHeaderSize:]
	switch f.Type {
	case TypeData:
		if len(body) < DataHeaderSize {
			return ErrFrame
		}
		f.Data = Data{
			PSN:     PSN(binary.BigEndian.Uint32(body[0:])),
			MsgID:   binary.BigEndian.Uint32(body[4:]),
			Offset:  binary.BigEndian.Uint32(body[8:]),
			Length:  binary.BigEndian.Uint32(body[12:]),
			Op:      Op(body[16]),
			Flags:   body[17],
			SrcQPN:  binary.BigEndian.Uint16(body[18:]),
			DstQPN:  binary.BigEndian.Uint16(body[20:]),
			Status:  body[22],
			QKey:    binary.BigEndian.Uint32(body[24:]),
			Imm:     binary.BigEndian.Uint32(body[28:]),
			RKey:    binary.BigEndian.Uint32(body[32:]),
			RAddr:   binary.BigEndian.Uint64(body[36:]),
			Payload: body[DataHeaderSize:],
		}
		d := &f.Data
		noPayload := d.Op == OpReadReq || d.Op == OpResp || d.Op == OpAbort
		switch {
		case d.Op > OpAbort, d.Flags&^(FlagImm|FlagUD) != 0, body[23] != 0,
			noPayload && len(d.Payload) != 0,
			d.Op == OpResp && d.Status == 0, // a RESP carries a failure: 0 would complete the request as a success
			!noPayload && uint64(d.Offset)+uint64(len(d.Payload)) > uint64(d.Length):
			return ErrFrame
		}
	case TypeAck:
		if len(body) != AckSize || body[41]&^AckHorizonZero != 0 || body[42] != 0 || body[43] != 0 {
			return ErrFrame
		}
		a := &f.Ack
		a.Cum = PSN(binary.BigEndian.Uint32(body[0:]))
		a.Highest = PSN(binary.BigEndian.Uint32(body[4:]))
		for i := range SackWords {
			a.Sack[i] = binary.BigEndian.Uint64(body[8+8*i:])
		}
		a.Path = body[40]
		a.Horizon = PSN(binary.BigEndian.Uint32(body[44:]))
		if body[41] != 0 && a.Horizon != 0 {
			return ErrFrame // the flag speaks of a horizon 0 only
		}
		a.HasHorizon = a.Horizon != 0 || body[41] != 0
	case TypeProbe, TypeProbeAck:
		if len(body) != ProbeSize || binary.BigEndian.Uint16(body[4:]) != 0 || binary.BigEndian.Uint32(body[6:]) != 0 {
			return ErrFrame
		}
		f.Nonce = binary.BigEndian.Uint32(body)
	case TypeReset:
		if len(body) != 0 {
			return ErrFrame
		}
	case TypeChallenge:
		if len(body) != ChallengeSize {
			return ErrFrame
		}
		f.Cookie = binary.BigEndian.Uint64(body)
		f.Port = binary.BigEndian.Uint16(body[CookieSize:])
	case TypeCookie:
		n := len(body) - CookieSize
		if n < 2 || n%2 != 0 || n > 2*MaxPorts {
			return ErrFrame
		}
		f.Cookie = binary.BigEndian.Uint64(body)
		f.Ports = Ports(body[CookieSize:])
	default:
		return ErrFrame
	}
	return nil
}
