//go:build linux

package uverbs

import (
	"syscall"

	"github.com/softefa/softefa/internal/mem"
)

// ProcessMemory is the Memory of a program in another process than the device's: commands'
// responses are written, and their requests' pointers read, with process_vm_writev/readv, and a
// memory region is registered as a range of the program's address space (engine.RegProcessMR).
// The device must be allowed to reach the process (mem.Process).
type ProcessMemory struct{ p *mem.Process }

// NewProcessMemory returns the memory of p.
func NewProcessMemory(p *mem.Process) ProcessMemory { return ProcessMemory{p: p} }

// pid is the process's id (File.sameProcess).
func (m ProcessMemory) pid() int { return m.p.Pid() }

// Read copies len(b) bytes at addr into b; EFAULT if they are not all readable.
func (m ProcessMemory) Read(addr uint64, b []byte) error {
	if addr+uint64(len(b)) < addr || !mem.In(m.p, addr, len(b)).ReadAt(b, 0) {
		return syscall.EFAULT
	}
	return nil
}

// Write copies b to addr; EFAULT if the bytes are not all writable.
func (m ProcessMemory) Write(addr uint64, b []byte) error {
	if addr+uint64(len(b)) < addr || !mem.In(m.p, addr, len(b)).WriteAt(b, 0) {
		return syscall.EFAULT
	}
	return nil
}

// Span checks every page of [addr, addr+n) as a registration pins it (mem.Process.Check) and
// returns the range.
func (m ProcessMemory) Span(addr, n uint64, write bool) (mem.Span, error) {
	const maxInt = int(^uint(0) >> 1)
	if n == 0 || n > uint64(maxInt) || addr+n < addr {
		return mem.Span{}, syscall.EFAULT
	}
	if err := m.p.Check(addr, int(n), write); err != nil {
		return mem.Span{}, err
	}
	return mem.In(m.p, addr, int(n)), nil
}
