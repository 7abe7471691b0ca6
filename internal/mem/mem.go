// Package mem is the memory a device reads and writes on behalf of work requests: a Span is either
// the device's own memory (a byte slice, as a Go program's registered region is) or a range of
// another process's address space, reached with process_vm_readv(2) and process_vm_writev(2), as
// a device serving the programs of a host reaches their regions (docs/architecture.md, "Program
// memory").
//
// A Span of another process's memory is an address and a length only: it is not mapped in this
// process, and nothing is read or written until ReadAt, WriteAt, Copy or Append is called. Each of
// those reports false instead of failing the caller when the memory is not there (the process
// unmapped it, made it read-only, or exited); part of the bytes may have been copied. Own memory
// cannot fail here: a device whose own spans may fault (a C program's buffer inside the device's
// process) guards these calls itself.
package mem

import "unsafe"

// Span is a range of bytes: own memory or another process's. The zero Span is empty own memory.
// (32 bytes: it is copied with every work request and segment.)
type Span struct {
	ptr  *byte    // own memory's first byte (p nil)
	n    int      // the length
	p    *Process // whose address space addr is in; nil for own memory
	addr uint64   // p's: the address of the first byte
}

// Own returns the span of b.
func Own(b []byte) Span { return Span{ptr: unsafe.SliceData(b), n: len(b)} }

// In returns the span of n bytes at addr in p's address space. The address range must not wrap.
func In(p *Process, addr uint64, n int) Span { return Span{p: p, addr: addr, n: n} }

// Len returns the span's length.
func (s Span) Len() int { return s.n }

// Bytes returns own memory's bytes, and false for another process's.
func (s Span) Bytes() ([]byte, bool) {
	if s.p != nil {
		return nil, false
	}
	return unsafe.Slice(s.ptr, s.n), true
}

// own is Bytes for a span known to be own memory.
func (s Span) own() []byte { return unsafe.Slice(s.ptr, s.n) }

// Process returns the process whose memory s is, nil for own memory.
func (s Span) Process() *Process { return s.p }

// Addr returns the address of another process's span.
func (s Span) Addr() uint64 { return s.addr }

// Slice returns bytes [off, off+n) of s; it panics if they are not all inside s, as slicing does.
func (s Span) Slice(off, n int) Span {
	if off < 0 || n < 0 || off > s.n || n > s.n-off {
		panic("mem: span slice out of range")
	}
	if s.p == nil {
		return Own(s.own()[off : off+n])
	}
	return Span{p: s.p, addr: s.addr + uint64(off), n: n}
}

// From returns s from byte off on.
func (s Span) From(off int) Span { return s.Slice(off, s.Len()-off) }

// ReadAt copies bytes [off, off+len(dst)) of s into dst, which must lie inside s.
func (s Span) ReadAt(dst []byte, off int) bool {
	if s.p == nil {
		copy(dst, s.own()[off:off+len(dst)])
		return true
	}
	if off < 0 || off > s.n || len(dst) > s.n-off {
		panic("mem: read out of range")
	}
	return s.p.read(dst, s.addr+uint64(off))
}

// WriteAt copies src into s at byte off; the bytes must lie inside s.
func (s Span) WriteAt(src []byte, off int) bool {
	if s.p == nil {
		copy(s.own()[off:off+len(src)], src)
		return true
	}
	if off < 0 || off > s.n || len(src) > s.n-off {
		panic("mem: write out of range")
	}
	return s.p.write(src, s.addr+uint64(off))
}

// Append appends bytes [off, off+n) of the concatenation of src to b, and reports false if
// another process's memory could not be read (b then holds the bytes up to it, and garbage in its
// place). The bytes must lie inside src.
func Append(b []byte, src []Span, off uint64, n int) ([]byte, bool) {
	ok := true
	for _, s := range src {
		if n == 0 {
			break
		}
		l := uint64(s.Len())
		if off >= l {
			off -= l
			continue
		}
		k := min(n, int(l-off))
		if s.p == nil {
			b = append(b, s.own()[off:int(off)+k]...)
		} else {
			at := len(b)
			b = grow(b, k)
			ok = s.p.read(b[at:], s.addr+off) && ok
		}
		n -= k
		off = 0
	}
	return b, ok
}

// grow extends b by n bytes (their values undefined).
func grow(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		b = append(b[:cap(b)], make([]byte, len(b)+n-cap(b))...)[:len(b)]
	}
	return b[:len(b)+n]
}

// Scatter copies src into the concatenation of dst from its start, as far as dst reaches, and
// returns what of dst is left after the bytes copied (dst's elements are advanced in place), and
// false if another process's memory could not be written.
func Scatter(dst []Span, src []byte) ([]Span, bool) {
	ok := true
	for len(src) > 0 && len(dst) > 0 {
		c := min(len(src), dst[0].Len())
		ok = dst[0].WriteAt(src[:c], 0) && ok
		src = src[c:]
		dst[0] = dst[0].From(c)
		if dst[0].Len() == 0 {
			dst = dst[1:]
		}
	}
	return dst, ok
}

// WriteAcross copies src into the concatenation of dst from byte off on, as far as dst reaches,
// and reports false if another process's memory could not be written. dst is left as it is.
func WriteAcross(dst []Span, off uint64, src []byte) bool {
	ok := true
	for _, s := range dst {
		if len(src) == 0 {
			break
		}
		l := uint64(s.Len())
		if off >= l {
			off -= l
			continue
		}
		c := min(len(src), int(l-off))
		if s.p == nil {
			copy(s.own()[off:], src[:c])
		} else {
			ok = s.p.write(src[:c], s.addr+off) && ok
		}
		src = src[c:]
		off = 0
	}
	return ok
}

// chunk is how many bytes Copy moves at a time between two other processes.
const chunk = 16 << 10

// Copy copies min(dst.Len(), src.Len()) bytes from src to dst: directly when either is own
// memory, through a buffer on the stack when both are other processes'.
func Copy(dst, src Span) bool {
	n := min(dst.Len(), src.Len())
	switch {
	case dst.p == nil:
		return src.ReadAt(dst.own()[:n], 0)
	case src.p == nil:
		return dst.WriteAt(src.own()[:n], 0)
	}
	var buf [chunk]byte
	for off := 0; off < n; off += chunk {
		k := min(chunk, n-off)
		if !src.ReadAt(buf[:k], off) || !dst.WriteAt(buf[:k], off) {
			return false
		}
	}
	return true
}
