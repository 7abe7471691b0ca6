package efaio

// The CQ doorbell word (efa_io_regs_defs.h): the consumer's running count of polled CQEs, a
// 2-bit command sequence number bumped on every event acknowledgement, and the arm bit that asks
// for a completion event.
const (
	CQDoorbellCIMask  = 0xffff
	CQDoorbellSNShift = 29
	CQDoorbellSNMask  = 0x3 << CQDoorbellSNShift
	CQDoorbellArm     = 1 << 31
)

// CQDoorbell builds a CQ doorbell value.
func CQDoorbell(consumed uint16, sn uint8, arm bool) uint32 {
	v := uint32(consumed) | uint32(sn&3)<<CQDoorbellSNShift
	if arm {
		v |= CQDoorbellArm
	}
	return v
}

// SQ and RQ doorbells hold the producer counter: the number of WQEs (SQ) or RX descriptors (RQ)
// written so far, modulo 2^16. The device consumes entries up to that count.
