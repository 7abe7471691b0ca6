//go:build linux

package uverbs

import (
	"sync/atomic"
	"unsafe"
)

func unsafeBytes(w []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), len(w)*8)
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

func atomicStore(p *uint32, v uint32) { atomic.StoreUint32(p, v) }
