package efaio

import (
	"encoding/binary"
	"errors"
)

// Sizes of a TX work-queue entry (efa_io_tx_wqe, efa_io_tx_wqe_128) and of its parts.
const (
	TxWQESize        = 64  // the usual SQ entry
	TxWQESize128     = 128 // the entry of a QP with inline data over 32 bytes or INLINE_WRITE
	TxMetaSize       = 32  // efa_io_tx_meta_desc
	TxInlineMax      = 32  // EFA_IO_TX_DESC_INLINE_MAX_SIZE
	TxInlineMax128   = 80  // EFA_IO_TX_DESC_INLINE_MAX_SIZE_128
	TxNumBufs        = 2   // EFA_IO_TX_DESC_NUM_BUFS: SGEs in a SEND
	TxNumRDMABufs    = 1   // EFA_IO_TX_DESC_NUM_RDMA_BUFS: local SGEs in an RDMA op
	BufDescSize      = 16  // efa_io_tx_buf_desc and efa_io_remote_mem_addr
	LKeyMask         = 0x00ffffff
	ImmDataSize      = 4 // EFA_IO_TX_DESC_IMM_DATA_SIZE
	txRemoteMemOff   = 32
	txLocalMemOff    = 48
	txInlineWriteOff = 48
)

// OpType is the operation of a TX WQE (ctrl1 bits 3:0) and of a CQE (flags bits 6:4).
type OpType uint8

// Operation types, with the values of efa_io_send_op_type.
const (
	OpSend      OpType = 0
	OpRDMARead  OpType = 1
	OpRDMAWrite OpType = 2
)

func (o OpType) String() string {
	switch o {
	case OpSend:
		return "SEND"
	case OpRDMARead:
		return "RDMA_READ"
	case OpRDMAWrite:
		return "RDMA_WRITE"
	}
	return "op?"
}

// Bits of the control bytes of efa_io_tx_meta_desc.
const (
	ctrl1OpMask    = 0x0f
	ctrl1HasImm    = 1 << 4
	ctrl1Inline    = 1 << 5
	ctrl1MetaExt   = 1 << 6 // must be zero
	ctrl1MetaDesc  = 1 << 7 // must be one
	ctrl2Phase     = 1 << 0
	ctrl2First     = 1 << 2
	ctrl2Last      = 1 << 3
	ctrl2CompReq   = 1 << 4
	ctrl2Reserved  = 1<<1 | 0xe0
	ctrl3HintsMask = 0x03
)

// ProcessingHintBurstPPSSensitive is EFADV_WR_PROCESSING_HINT_BURST_PPS_SENSITIVE, carried in
// ctrl3 bits 1:0.
const ProcessingHintBurstPPSSensitive = 1 << 0

// Errors a decoder reports for bytes no well-formed descriptor contains.
var (
	ErrShort    = errors.New("efaio: descriptor shorter than its format")
	ErrNotMeta  = errors.New("efaio: meta_desc bit not set")
	ErrReserved = errors.New("efaio: reserved bits or bytes not zero")
	ErrOpType   = errors.New("efaio: unknown operation type")
	ErrLength   = errors.New("efaio: bad length or buffer count")
	ErrLKey     = errors.New("efaio: lkey wider than 24 bits")
	ErrInline   = errors.New("efaio: inline data not allowed here")
)

// BufDesc is a local buffer (efa_io_tx_buf_desc, 16 bytes): length, 24-bit lkey, address.
type BufDesc struct {
	Length uint32
	LKey   uint32
	Addr   uint64
}

// RemoteMem is the remote side of an RDMA operation (efa_io_remote_mem_addr, 16 bytes).
type RemoteMem struct {
	Length uint32 // total bytes of the operation
	RKey   uint32
	Addr   uint64
}

// TxDesc is a decoded TX WQE. Inline refers into the WQE it was decoded from.
type TxDesc struct {
	ReqID     uint16
	Op        OpType
	HasImm    bool
	Inline    bool
	Phase     uint8 // 0 or 1
	CompReq   bool
	DestQPN   uint16
	Length    uint16 // inline: data bytes; otherwise the number of SGL buffers
	Imm       uint32 // host order
	AHN       uint16
	Hints     uint8
	QKey      uint32
	ReqIDEx   uint64 // wr_id bits 16..63 in 64-bit request-id mode (48 bits)
	SGL       [TxNumBufs]BufDesc
	Remote    RemoteMem // RDMA operations only
	InlineBuf []byte    // inline data (SEND or inline RDMA write)
}

// TxWQE is a view of one SQ entry of TxWQESize or TxWQESize128 bytes.
type TxWQE []byte

// Decode checks w and fills d. It reports an error wrapping one of the Err values for anything
// libefa could not have written: the device turns such a WQE into an error completion.
func (w TxWQE) Decode(d *TxDesc) error {
	if len(w) != TxWQESize && len(w) != TxWQESize128 {
		return ErrShort
	}
	ctrl1, ctrl2, ctrl3 := w[2], w[3], w[14]
	*d = TxDesc{
		ReqID:   binary.LittleEndian.Uint16(w[0:]),
		Op:      OpType(ctrl1 & ctrl1OpMask),
		HasImm:  ctrl1&ctrl1HasImm != 0,
		Inline:  ctrl1&ctrl1Inline != 0,
		Phase:   ctrl2 & ctrl2Phase,
		CompReq: ctrl2&ctrl2CompReq != 0,
		DestQPN: binary.LittleEndian.Uint16(w[4:]),
		Length:  binary.LittleEndian.Uint16(w[6:]),
		Imm:     binary.LittleEndian.Uint32(w[8:]),
		AHN:     binary.LittleEndian.Uint16(w[12:]),
		Hints:   ctrl3 & ctrl3HintsMask,
		QKey:    binary.LittleEndian.Uint32(w[16:]),
		ReqIDEx: uint64(binary.LittleEndian.Uint16(w[26:])) |
			uint64(binary.LittleEndian.Uint16(w[28:]))<<16 |
			uint64(binary.LittleEndian.Uint16(w[30:]))<<32,
	}
	switch {
	case ctrl1&ctrl1MetaDesc == 0:
		return ErrNotMeta
	case ctrl1&ctrl1MetaExt != 0, ctrl2&ctrl2Reserved != 0, ctrl3&^ctrl3HintsMask != 0,
		ctrl2&(ctrl2First|ctrl2Last) != ctrl2First|ctrl2Last, !allZero(w[15:16]), !allZero(w[20:26]):
		return ErrReserved
	case d.Op > OpRDMAWrite:
		return ErrOpType
	case d.HasImm && d.Op == OpRDMARead:
		return ErrReserved
	}
	if d.Op == OpSend {
		return w.decodeSend(d)
	}
	return w.decodeRDMA(d)
}

func (w TxWQE) decodeSend(d *TxDesc) error {
	if d.Inline {
		if int(d.Length) > len(w)-TxMetaSize {
			return ErrLength
		}
		d.InlineBuf = w[TxMetaSize : TxMetaSize+int(d.Length)]
		return nil
	}
	if d.Length > TxNumBufs {
		return ErrLength
	}
	for i := range int(d.Length) {
		if err := decodeBuf(w[TxMetaSize+i*BufDescSize:], &d.SGL[i]); err != nil {
			return err
		}
	}
	return nil
}

func (w TxWQE) decodeRDMA(d *TxDesc) error {
	r := w[txRemoteMemOff:]
	d.Remote = RemoteMem{
		Length: binary.LittleEndian.Uint32(r[0:]),
		RKey:   binary.LittleEndian.Uint32(r[4:]),
		Addr:   uint64(binary.LittleEndian.Uint32(r[8:])) | uint64(binary.LittleEndian.Uint32(r[12:]))<<32,
	}
	if d.Inline {
		// Only an RDMA write in a 128-byte WQE carries inline data (efa_io_tx_wqe_128).
		if d.Op != OpRDMAWrite || len(w) != TxWQESize128 {
			return ErrInline
		}
		if int(d.Length) > TxInlineMax128 || uint32(d.Length) != d.Remote.Length {
			return ErrLength
		}
		d.InlineBuf = w[txInlineWriteOff : txInlineWriteOff+int(d.Length)]
		return nil
	}
	if d.Length > TxNumRDMABufs {
		return ErrLength
	}
	if d.Length == 1 {
		return decodeBuf(w[txLocalMemOff:], &d.SGL[0])
	}
	return nil
}

func decodeBuf(b []byte, bd *BufDesc) error {
	lkey := binary.LittleEndian.Uint32(b[4:])
	*bd = BufDesc{
		Length: binary.LittleEndian.Uint32(b[0:]),
		LKey:   lkey & LKeyMask,
		Addr:   uint64(binary.LittleEndian.Uint32(b[8:])) | uint64(binary.LittleEndian.Uint32(b[12:]))<<32,
	}
	if lkey&^LKeyMask != 0 {
		return ErrLKey
	}
	return nil
}

// Encode zeroes w and writes d into it, as libefa builds a WQE: meta_desc, first and last are
// always set. The caller has checked d against the QP's limits; Encode writes only what fits.
func (w TxWQE) Encode(d *TxDesc) {
	clear(w)
	binary.LittleEndian.PutUint16(w[0:], d.ReqID)
	ctrl1 := byte(d.Op)&ctrl1OpMask | ctrl1MetaDesc
	if d.HasImm {
		ctrl1 |= ctrl1HasImm
	}
	if d.Inline {
		ctrl1 |= ctrl1Inline
	}
	ctrl2 := d.Phase&ctrl2Phase | ctrl2First | ctrl2Last
	if d.CompReq {
		ctrl2 |= ctrl2CompReq
	}
	w[2], w[3], w[14] = ctrl1, ctrl2, d.Hints&ctrl3HintsMask
	binary.LittleEndian.PutUint16(w[4:], d.DestQPN)
	binary.LittleEndian.PutUint16(w[6:], d.Length)
	binary.LittleEndian.PutUint32(w[8:], d.Imm)
	binary.LittleEndian.PutUint16(w[12:], d.AHN)
	binary.LittleEndian.PutUint32(w[16:], d.QKey)
	binary.LittleEndian.PutUint16(w[26:], uint16(d.ReqIDEx))
	binary.LittleEndian.PutUint16(w[28:], uint16(d.ReqIDEx>>16))
	binary.LittleEndian.PutUint16(w[30:], uint16(d.ReqIDEx>>32))
	if d.Op != OpSend {
		r := w[txRemoteMemOff:]
		binary.LittleEndian.PutUint32(r[0:], d.Remote.Length)
		binary.LittleEndian.PutUint32(r[4:], d.Remote.RKey)
		binary.LittleEndian.PutUint32(r[8:], uint32(d.Remote.Addr))
		binary.LittleEndian.PutUint32(r[12:], uint32(d.Remote.Addr>>32))
		if d.Inline {
			copy(w[txInlineWriteOff:], d.InlineBuf)
		} else if d.Length > 0 {
			encodeBuf(w[txLocalMemOff:], &d.SGL[0])
		}
		return
	}
	if d.Inline {
		copy(w[TxMetaSize:], d.InlineBuf)
		return
	}
	for i := range min(int(d.Length), TxNumBufs) {
		encodeBuf(w[TxMetaSize+i*BufDescSize:], &d.SGL[i])
	}
}

func encodeBuf(b []byte, bd *BufDesc) {
	binary.LittleEndian.PutUint32(b[0:], bd.Length)
	binary.LittleEndian.PutUint32(b[4:], bd.LKey&LKeyMask)
	binary.LittleEndian.PutUint32(b[8:], uint32(bd.Addr))
	binary.LittleEndian.PutUint32(b[12:], uint32(bd.Addr>>32))
}

// SetHints rewrites the processing hints of an encoded WQE (ctrl3 bits 1:0), as
// efadv_wr_set_processing_hints does after the opcode call.
func (w TxWQE) SetHints(h uint8) { w[14] = h & ctrl3HintsMask }

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
