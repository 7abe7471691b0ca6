//go:build linux && cgo

package main

import (
	"os"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestBytesProtection registers nothing: it checks procMem.Bytes against this process's own
// mappings, one read-write, read-only and PROT_NONE in turn.
func TestBytesProtection(t *testing.T) {
	page := os.Getpagesize()
	b := anonPages(t, 2)
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	check := func(what string, n uint64, write bool, ok bool) {
		t.Helper()
		if _, err := (procMem{}).Span(addr, n, write); (err == nil) != ok {
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
	if _, err := (procMem{}).Span(addr+100, uint64(2*page), true); err != nil {
		t.Fatal(err)
	}
	if n := present(); n != 3 {
		t.Errorf("%d pages present after registering 2 pages from offset 100 (3 pages), want 3", n)
	}
	if err := unix.Mprotect(b[3*page:], unix.PROT_READ); err != nil {
		t.Fatal(err)
	}
	if _, err := (procMem{}).Span(addr+uint64(3*page), uint64(page), false); err != nil {
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
