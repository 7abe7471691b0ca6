// Package qpn allocates QP numbers the way rdmavt's QPN table does (rdmavt qp.c, alloc_qpn),
// narrowed to EFA's 16-bit QPN fields:
//
//   - 0 and 1 are never handed out (they are IB's special QPs);
//   - a configured reserved range is never handed out (rdmavt reserves ranges for non-verbs use,
//     such as hfi1's PSM/KDETH range);
//   - every number is below the table's limit, at most 65536, since TX WQEs and CQEs carry 16 bits;
//   - allocation walks forward from the last number handed out and wraps, so a freed number comes
//     back only after every other free number has been used once;
//   - each number has a generation, bumped on every allocation, so that a completion that names a
//     reused number can be told from one for the QP that held it before (libefa's qp_gen_table).
//
// A Table is safe for concurrent use.
package qpn

import (
	"fmt"
	"math/bits"
	"sync"
	"syscall"
)

// Limit is the largest table size: EFA descriptors carry 16-bit QP numbers.
const Limit = 1 << 16

// first is the lowest number handed out: 0 and 1 belong to IB's SMI and GSI QPs.
const first = 2

// Table is a QPN allocator.
type Table struct {
	mu       sync.Mutex
	used     []uint64 // bitmap of numbers in use or reserved
	gen      []uint16 // generation per number
	size     uint32   // numbers are < size
	last     uint32   // last number handed out
	resStart uint32
	resEnd   uint32 // inclusive; resEnd < resStart means no reserved range
	free     int    // numbers that can still be handed out
}

// New returns a table of numbers below size (at most Limit) with [resStart, resEnd] reserved.
// Pass resEnd < resStart for no reserved range. It fails with EINVAL, as init_qpn_table does,
// when the reserved range is malformed or leaves nothing to hand out.
func New(size int, resStart, resEnd uint32) (*Table, error) {
	if size <= first || size > Limit {
		return nil, fmt.Errorf("qpn: table size %d outside (%d, %d]: %w", size, first, Limit, syscall.EINVAL)
	}
	t := &Table{
		used:     make([]uint64, (size+63)/64),
		gen:      make([]uint16, size),
		size:     uint32(size),
		last:     first - 1,
		resStart: resStart,
		resEnd:   resEnd,
	}
	t.setUsed(0)
	t.setUsed(1)
	if resEnd >= resStart {
		if resEnd >= uint32(size) {
			return nil, fmt.Errorf("qpn: reserved range [%#x, %#x] beyond table size %#x: %w",
				resStart, resEnd, size, syscall.EINVAL)
		}
		for q := resStart; q <= resEnd; q++ {
			t.setUsed(q)
		}
	}
	for i, w := range t.used {
		n := 64 - bits.OnesCount64(w)
		if i == len(t.used)-1 && size%64 != 0 {
			n -= 64 - size%64
		}
		t.free += n
	}
	if t.free == 0 {
		return nil, fmt.Errorf("qpn: reserved range leaves no number to hand out: %w", syscall.EINVAL)
	}
	return t, nil
}

// Alloc hands out the next free number after the last one handed out, and its new generation.
// It fails with ENOMEM when every number is in use.
func (t *Table) Alloc() (qpn uint32, gen uint16, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.free == 0 {
		return 0, 0, fmt.Errorf("qpn: all %d QP numbers in use: %w", t.size, syscall.ENOMEM)
	}
	q := t.last
	for {
		q++
		if q >= t.size {
			q = first
		}
		if !t.isUsed(q) {
			break
		}
	}
	t.setUsed(q)
	t.free--
	t.last = q
	t.gen[q]++
	return q, t.gen[q], nil
}

// Free returns q to the table. Freeing a number that is not in use, or a reserved one, does
// nothing.
func (t *Table) Free(q uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if q < first || q >= t.size || t.Reserved(q) || !t.isUsed(q) {
		return
	}
	t.used[q/64] &^= 1 << (q % 64)
	t.free++
}

// Gen returns the generation of q: the number of times it has been handed out, modulo 2^16.
func (t *Table) Gen(q uint32) uint16 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if q >= t.size {
		return 0
	}
	return t.gen[q]
}

// Reserved reports whether q is in the reserved range.
func (t *Table) Reserved(q uint32) bool {
	return t.resEnd >= t.resStart && q >= t.resStart && q <= t.resEnd
}

// Size returns the table's limit: every number is below it.
func (t *Table) Size() uint32 { return t.size }

func (t *Table) isUsed(q uint32) bool { return t.used[q/64]&(1<<(q%64)) != 0 }
func (t *Table) setUsed(q uint32)     { t.used[q/64] |= 1 << (q % 64) }
