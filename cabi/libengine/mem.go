//go:build linux && cgo

package main

import (
	"os"
	"syscall"
	"unsafe"

	"github.com/softefa/softefa/internal/mem"
	"golang.org/x/sys/unix"
)

// procMem is the process's own address space, as the kernel's copy_{from,to}_user see it:
// accesses go through process_vm_readv/writev on the process itself, so an unmapped or
// protected address is EFAULT rather than a crash.
type procMem struct{}

var self = unix.Getpid()

func (procMem) Read(addr uint64, b []byte) error {
	return vm(addr, b, false)
}

func (procMem) Write(addr uint64, b []byte) error {
	return vm(addr, b, true)
}

func vm(addr uint64, b []byte, write bool) error {
	if len(b) == 0 {
		return nil
	}
	local := []unix.Iovec{{Base: &b[0]}}
	local[0].SetLen(len(b))
	remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
	var n int
	var err error
	if write {
		n, err = unix.ProcessVMWritev(self, local, remote, 0)
	} else {
		n, err = unix.ProcessVMReadv(self, local, remote, 0)
	}
	if err != nil || n != len(b) {
		return syscall.EFAULT
	}
	return nil
}

// Span returns the process memory [addr, addr+n) as own memory (a slice), after checking that every page of
// it is mapped readable and, with write, writable (/proc/self/maps), as the kernel's pinning of
// a memory region checks the mappings: EFAULT otherwise. As pinning does, it makes every page
// present (MADV_POPULATE_WRITE, or _READ): libfabric's userfaultfd monitor watches registered
// memory for missing pages, and leaves a thread that reads one asleep for ever (docs/cabi.md,
// "libfabric's MR cache monitor"). A page that cannot be made present is EFAULT, or ENOMEM for
// want of memory, as for pinning; a kernel without the advice (before 5.14: EINVAL) leaves the
// pages as they are (the launcher then keeps libfabric's own monitor: cabi.Prepare).
func (procMem) Span(addr, n uint64, write bool) (mem.Span, error) {
	if addr == 0 || n == 0 || addr+n < addr {
		return mem.Span{}, syscall.EFAULT
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil || !mem.Mapped(maps, addr&^4095, addr+n, write) {
		return mem.Span{}, syscall.EFAULT
	}
	advice := unix.MADV_POPULATE_READ
	if write {
		advice = unix.MADV_POPULATE_WRITE
	}
	first := addr &^ uint64(os.Getpagesize()-1)
	switch err := unix.Madvise(unsafe.Slice((*byte)(ptr(first)), addr+n-first), advice); err {
	case nil, syscall.EINVAL:
	case syscall.ENOMEM, syscall.EAGAIN:
		return mem.Span{}, syscall.ENOMEM
	default:
		return mem.Span{}, syscall.EFAULT
	}
	return mem.Own(unsafe.Slice((*byte)(ptr(addr)), n)), nil
}

// ptr turns an address outside the Go heap into a pointer.
func ptr(addr uint64) unsafe.Pointer {
	p := uintptr(addr)
	return *(*unsafe.Pointer)(unsafe.Pointer(&p))
}
