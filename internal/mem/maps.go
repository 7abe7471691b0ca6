package mem

import (
	"bytes"
	"strconv"
)

// Mapped reports whether the mappings maps lists (the text of /proc/PID/maps: one mapping a
// line, "start-end perms …" in hex, in address order) cover [start, end) without a hole, every
// one readable and, with write, writable.
func Mapped(maps []byte, start, end uint64, write bool) bool {
	for line := range bytes.Lines(maps) {
		f := bytes.Fields(line)
		if len(f) < 2 || len(f[1]) < 2 {
			return false
		}
		lo, hi, ok := bytes.Cut(f[0], []byte("-"))
		if !ok {
			return false
		}
		from, err1 := strconv.ParseUint(string(lo), 16, 64)
		to, err2 := strconv.ParseUint(string(hi), 16, 64)
		if err1 != nil || err2 != nil {
			return false
		}
		switch {
		case to <= start:
			continue
		case from > start: // a hole before this mapping
			return false
		case f[1][0] != 'r', write && f[1][1] != 'w':
			return false
		}
		if start = to; start >= end {
			return true
		}
	}
	return false
}
