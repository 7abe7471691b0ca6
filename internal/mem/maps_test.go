package mem

import "testing"

func TestMapped(t *testing.T) {
	maps := []byte(`00400000-00401000 r--p 00000000 fe:01 123 /bin/prog
00401000-00403000 rw-p 00000000 00:00 0
00403000-00404000 ---p 00000000 00:00 0
00500000-00502000 r-xp 00000000 fe:01 123 /bin/prog
7ffd0000-7ffd1000 rw-p 00000000 00:00 0                                  [stack]
`)
	for _, c := range []struct {
		start, end  uint64
		write, want bool
	}{
		{0x400000, 0x400001, false, true},
		{0x400000, 0x400001, true, false},  // read-only
		{0x401000, 0x403000, true, true},   // one writable mapping
		{0x400000, 0x403000, false, true},  // two adjacent mappings, both readable
		{0x400000, 0x403000, true, false},  // the first is read-only
		{0x402000, 0x404000, false, false}, // runs into PROT_NONE
		{0x403000, 0x403001, false, false}, // PROT_NONE
		{0x404000, 0x405000, false, false}, // a hole
		{0x402000, 0x501000, false, false}, // spans a hole
		{0x500000, 0x502000, false, true},
		{0x500000, 0x502001, false, false}, // past the last byte of a mapping, into a hole
		{0x7ffd0000, 0x7ffd1000, true, true},
		{0x10, 0x20, false, false}, // below every mapping
	} {
		if got := Mapped(maps, c.start, c.end, c.write); got != c.want {
			t.Errorf("Mapped(%#x, %#x, write %v) = %v, want %v", c.start, c.end, c.write, got, c.want)
		}
	}
}
