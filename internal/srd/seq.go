package srd

import "github.com/softefa/softefa/internal/wire"

// window is a receiver's record of the PSNs that arrived beyond its cumulative point: bit
// psn%rxWindow, for psn in [cum, cum+rxWindow). A PSN's bit is set when it arrives and cleared
// when the cumulative point moves past it, so the bits are ready for the PSNs rxWindow later.
type window []uint64

func (w window) has(psn wire.PSN) bool {
	i := uint32(psn) % rxWindow
	return w[i/64]&(1<<(i%64)) != 0
}

func (w window) flip(psn wire.PSN) {
	i := uint32(psn) % rxWindow
	w[i/64] ^= 1 << (i % 64)
}
