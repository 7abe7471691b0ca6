package efaio

import "encoding/binary"

// RxDescSize is the size of an RX descriptor (efa_io_rx_desc). A receive WR is one descriptor
// per SGE; the first carries the WR's req_id and the first bit, the last carries the last bit.
const RxDescSize = 16

const (
	rxFirst    = 1 << 30
	rxLast     = 1 << 31
	rxReserved = 0x3f << 24
)

// RxDescFields is a decoded RX descriptor.
type RxDescFields struct {
	Addr   uint64
	ReqID  uint16 // meaningful in the first descriptor of a WR only; libefa writes 0 elsewhere
	Length uint16
	LKey   uint32 // 24 bits
	First  bool
	Last   bool
}

// RxDesc is a view of one 16-byte RQ entry.
type RxDesc []byte

// Decode checks r and fills f. RX descriptors have no phase bit.
func (r RxDesc) Decode(f *RxDescFields) error {
	if len(r) < RxDescSize {
		return ErrShort
	}
	ctrl := binary.LittleEndian.Uint32(r[12:])
	*f = RxDescFields{
		Addr:   uint64(binary.LittleEndian.Uint32(r[0:])) | uint64(binary.LittleEndian.Uint32(r[4:]))<<32,
		ReqID:  binary.LittleEndian.Uint16(r[8:]),
		Length: binary.LittleEndian.Uint16(r[10:]),
		LKey:   ctrl & LKeyMask,
		First:  ctrl&rxFirst != 0,
		Last:   ctrl&rxLast != 0,
	}
	if ctrl&rxReserved != 0 {
		return ErrReserved
	}
	return nil
}

// Encode writes f into r.
func (r RxDesc) Encode(f *RxDescFields) {
	binary.LittleEndian.PutUint32(r[0:], uint32(f.Addr))
	binary.LittleEndian.PutUint32(r[4:], uint32(f.Addr>>32))
	binary.LittleEndian.PutUint16(r[8:], f.ReqID)
	binary.LittleEndian.PutUint16(r[10:], f.Length)
	ctrl := f.LKey & LKeyMask
	if f.First {
		ctrl |= rxFirst
	}
	if f.Last {
		ctrl |= rxLast
	}
	binary.LittleEndian.PutUint32(r[12:], ctrl)
}
