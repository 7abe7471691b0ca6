//go:build !linux

package mem

import (
	"fmt"
	"syscall"
)

// Process is another process's address space; only Linux reaches one (process_vm_readv(2)).
type Process struct{ exit chan struct{} }

// Open fails: no other process's memory is reachable on this system.
func Open(pid int) (*Process, error) {
	return nil, fmt.Errorf("mem: another process's memory: %w", syscall.ENOSYS)
}

// Exited returns a closed channel.
func (p *Process) Exited() <-chan struct{} { return p.exit }

// Pid returns 0: no process is reached here.
func (p *Process) Pid() int { return 0 }

// Close does nothing.
func (p *Process) Close() error { return nil }

// Check fails.
func (p *Process) Check(addr uint64, n int, write bool) error { return syscall.ENOSYS }

func (p *Process) read(dst []byte, addr uint64) bool  { return len(dst) == 0 }
func (p *Process) write(src []byte, addr uint64) bool { return len(src) == 0 }
