package efaio

import "encoding/binary"

// Sizes of completion entries. libefa always creates CQs with 32-byte entries (efa_io_rx_cdesc_ex);
// a send completion uses the first 16 bytes of its slot.
const (
	TxCQESize   = 16 // efa_io_tx_cdesc
	RxCQESize   = 16 // efa_io_rx_cdesc
	RxCQEExSize = 32 // efa_io_rx_cdesc_ex
	CQESize     = RxCQEExSize
)

// QType says which work queue a completion belongs to (CQE flags bits 2:1).
type QType uint8

// Queue types of efa_io_queue_type.
const (
	QTypeSend QType = 1
	QTypeRecv QType = 2
)

// UnknownAH is the RX CQE ah value for a sender for which the receiving QP's PD holds no AH.
const UnknownAH = 0xffff

// Bits of the CQE flags byte (efa_io_cdesc_common.flags).
const (
	cqePhase       = 1 << 0
	cqeQTypeShift  = 1
	cqeQTypeMask   = 0x3 << cqeQTypeShift
	cqeHasImm      = 1 << 3
	cqeOpShift     = 4
	cqeOpMask      = 0x7 << cqeOpShift
	cqeUnsolicited = 1 << 7
)

// Completion is a decoded CQE, send or receive.
type Completion struct {
	ReqID       uint16
	Status      Status
	Phase       uint8
	QType       QType
	HasImm      bool // receive only
	Op          OpType
	Unsolicited bool // receive only: an RDMA write with immediate that consumed no receive WR
	QPN         uint16

	ReqIDEx uint64 // send: wr_id bits 16..63 in 64-bit request-id mode

	Length  uint32   // receive: bytes; bits 31:16 only for RDMA write with immediate
	AHN     uint16   // receive: the receiver's AH number for the sender, or UnknownAH
	SrcQPN  uint16   // receive
	Imm     uint32   // receive, host order
	SrcAddr [16]byte // receive in a 32-byte entry when AHN is UnknownAH and op is not RDMA write
}

// CQE is a view of one completion slot (16 or 32 bytes).
type CQE []byte

// HeaderWord returns bytes 0..3 of the CQE for c as a little-endian word: req_id, status and the
// flags byte with the phase bit. A device stores this word last (atomically), after the body,
// so that a poller that sees the expected phase also sees the whole entry.
func HeaderWord(c *Completion) uint32 {
	flags := c.Phase&cqePhase | byte(c.QType)<<cqeQTypeShift&cqeQTypeMask | byte(c.Op)<<cqeOpShift&cqeOpMask
	if c.HasImm {
		flags |= cqeHasImm
	}
	if c.Unsolicited {
		flags |= cqeUnsolicited
	}
	return uint32(c.ReqID) | uint32(c.Status)<<16 | uint32(flags)<<24
}

// PhaseOf reports the phase bit of a header word.
func PhaseOf(word uint32) uint8 { return uint8(word>>24) & cqePhase }

// EncodeBody writes everything after the header word (bytes 4 to the end of e).
func (e CQE) EncodeBody(c *Completion) {
	clear(e[4:])
	binary.LittleEndian.PutUint16(e[4:], c.QPN)
	if c.QType == QTypeSend {
		binary.LittleEndian.PutUint16(e[6:], uint16(c.ReqIDEx))
		binary.LittleEndian.PutUint16(e[8:], uint16(c.ReqIDEx>>16))
		binary.LittleEndian.PutUint16(e[10:], uint16(c.ReqIDEx>>32))
		return
	}
	binary.LittleEndian.PutUint16(e[6:], uint16(c.Length))
	binary.LittleEndian.PutUint16(e[8:], c.AHN)
	binary.LittleEndian.PutUint16(e[10:], c.SrcQPN)
	binary.LittleEndian.PutUint32(e[12:], c.Imm)
	if len(e) < RxCQEExSize {
		return
	}
	if c.Op == OpRDMAWrite {
		binary.LittleEndian.PutUint16(e[16:], uint16(c.Length>>16))
	} else {
		copy(e[16:32], c.SrcAddr[:])
	}
}

// Encode writes the whole entry, header word included, with plain stores.
func (e CQE) Encode(c *Completion) {
	e.EncodeBody(c)
	binary.LittleEndian.PutUint32(e[0:], HeaderWord(c))
}

// Decode reads e, whose header word is hdr (loaded by the caller, atomically where the device
// may be writing), into c. It reports ErrReserved for a queue type or op no device writes.
func (e CQE) Decode(hdr uint32, c *Completion) error {
	if len(e) != TxCQESize && len(e) != RxCQEExSize {
		return ErrShort
	}
	flags := byte(hdr >> 24)
	*c = Completion{
		ReqID:       uint16(hdr),
		Status:      Status(hdr >> 16),
		Phase:       flags & cqePhase,
		QType:       QType(flags & cqeQTypeMask >> cqeQTypeShift),
		HasImm:      flags&cqeHasImm != 0,
		Op:          OpType(flags & cqeOpMask >> cqeOpShift),
		Unsolicited: flags&cqeUnsolicited != 0,
		QPN:         binary.LittleEndian.Uint16(e[4:]),
	}
	switch c.QType {
	case QTypeSend:
		c.ReqIDEx = uint64(binary.LittleEndian.Uint16(e[6:])) |
			uint64(binary.LittleEndian.Uint16(e[8:]))<<16 |
			uint64(binary.LittleEndian.Uint16(e[10:]))<<32
	case QTypeRecv:
		c.Length = uint32(binary.LittleEndian.Uint16(e[6:]))
		c.AHN = binary.LittleEndian.Uint16(e[8:])
		c.SrcQPN = binary.LittleEndian.Uint16(e[10:])
		c.Imm = binary.LittleEndian.Uint32(e[12:])
		if len(e) == RxCQEExSize {
			if c.Op == OpRDMAWrite {
				c.Length |= uint32(binary.LittleEndian.Uint16(e[16:])) << 16
			} else {
				copy(c.SrcAddr[:], e[16:32])
			}
		}
	default:
		return ErrReserved
	}
	if c.Op > OpRDMAWrite {
		return ErrOpType
	}
	return nil
}
