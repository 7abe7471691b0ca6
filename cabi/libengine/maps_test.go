//go:build linux && cgo

package main

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

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
		if got := mapped(maps, c.start, c.end, c.write); got != c.want {
			t.Errorf("mapped(%#x, %#x, write %v) = %v, want %v", c.start, c.end, c.write, got, c.want)
		}
	}
}

// TestBytesProtection registers nothing: it checks procMem.Bytes against this process's own
// mappings, one read-write, read-only and PROT_NONE in turn.
func TestBytesProtection(t *testing.T) {
	page := os.Getpagesize()
	b := anonPages(t, 2)
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	check := func(what string, n uint64, write bool, ok bool) {
		t.Helper()
		if _, err := (procMem{}).Bytes(addr, n, write); (err == nil) != ok {
			t.Errorf("%s, write %v: %v", what, write, err)
		}
	}
	check("read-write", uint64(2*page), true, true)
	if err := unix.Mprotect(b[page:], unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	check("first page read-write", uint64(page), true, true)
	check("second page read-only", uint64(2*page), true, false)
	check("second page read-only", uint64(2*page), false, true)
	if err := unix.Mprotect(b[page:], unix.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	check("second page PROT_NONE", uint64(2*page), false, false)
	check("zero length", 0, false, false)
}

// TestBytesPopulates: the memory of a region is present once registered, as pinning leaves it
// (libfabric's userfaultfd monitor leaves a thread that reads a missing page of a registered
// region asleep): pages never touched before, from an offset into the first, read-only too.
func TestBytesPopulates(t *testing.T) {
	page := os.Getpagesize()
	b := anonPages(t, 4)
	present := func() (n int) {
		vec := make([]byte, 4)
		_, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0])))
		if errno != 0 {
			t.Fatal(errno)
		}
		for _, v := range vec {
			n += int(v & 1)
		}
		return n
	}
	if n := present(); n != 0 {
		t.Fatalf("%d pages present before any use", n)
	}
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	if _, err := (procMem{}).Bytes(addr+100, uint64(2*page), true); err != nil {
		t.Fatal(err)
	}
	if n := present(); n != 3 {
		t.Errorf("%d pages present after registering 2 pages from offset 100 (3 pages), want 3", n)
	}
	if err := unix.Mprotect(b[3*page:], unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	if _, err := (procMem{}).Bytes(addr+uint64(3*page), uint64(page), false); err != nil {
		t.Fatal(err)
	}
	if n := present(); n != 4 {
		t.Errorf("%d pages present after registering the read-only page, want 4", n)
	}
}

// anonPages maps n fresh read-write anonymous pages, unmapped when the test ends.
func anonPages(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n*os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}
