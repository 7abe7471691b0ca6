package srd

// The protocol's numbers wrap: PSNs are 32 bits and stream epochs 16 (docs/wire.md, "Packet
// streams"); a comparison holds while the two are less than half the space apart.

// psnLess reports whether PSN a comes before b.
func psnLess(a, b uint32) bool { return int32(a-b) < 0 }

// epochLess reports whether stream epoch a comes before b.
func epochLess(a, b uint16) bool { return int16(a-b) < 0 }

// window is a receiver's record of the PSNs that arrived beyond its cumulative point: bit
// psn%rxWindow, for psn in [cum, cum+rxWindow). A PSN's bit is set when it arrives and cleared
// when the cumulative point moves past it, so the bits are ready for the PSNs rxWindow later.
type window []uint64

func (w window) has(psn uint32) bool {
	i := psn % rxWindow
	return w[i/64]&(1<<(i%64)) != 0
}

func (w window) flip(psn uint32) {
	i := psn % rxWindow
	w[i/64] ^= 1 << (i % 64)
}
