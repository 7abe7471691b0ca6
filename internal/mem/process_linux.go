package mem

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Process is another process's address space, reached with process_vm_readv(2) and
// process_vm_writev(2). The caller must be allowed to ptrace the process
// (PTRACE_MODE_ATTACH_REALCREDS: root, or the same user where Yama allows it or the process named
// the caller with PR_SET_PTRACER); without that every access fails.
//
// A Process holds a pidfd: once the process has exited (or Close was called) every access fails
// at once, and Exited's channel is closed. A process id is only reused after its process has
// exited and been reaped, so an access that finds the process alive reaches it and no other,
// short of the process exiting, being reaped and its id handed out again between that check and
// the system call that follows it.
type Process struct {
	pid   int
	pidfd *os.File
	gone  atomic.Bool
	exit  chan struct{} // closed when the process exits or Close is called
	once  sync.Once
	done  chan struct{} // closed when the watcher has returned
}

// Open returns pid's address space and starts watching for its exit.
func Open(pid int) (*Process, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("mem: pidfd_open(%d): %w", pid, err)
	}
	return FromPidfd(fd, pid), nil
}

// FromPidfd is Open for a process already held by a pidfd (SO_PEERPIDFD's, say, which names the
// process that connected even if it has since exited and its id been reused); p owns fd, which
// is made non-blocking and close-on-exec.
func FromPidfd(fd, pid int) *Process {
	_ = unix.SetNonblock(fd, true)
	unix.CloseOnExec(fd)
	p := &Process{pid: pid, pidfd: os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid)),
		exit: make(chan struct{}), done: make(chan struct{})}
	go p.watch()
	return p
}

// Pid returns the process's id.
func (p *Process) Pid() int { return p.pid }

// Exited returns a channel closed when the process has exited or p has been closed.
func (p *Process) Exited() <-chan struct{} { return p.exit }

// Close stops all access to the process's memory and waits for the watcher to end.
func (p *Process) Close() error {
	p.end()
	err := p.pidfd.Close()
	<-p.done
	return err
}

func (p *Process) end() {
	p.once.Do(func() {
		p.gone.Store(true)
		close(p.exit)
	})
}

// watch waits in the runtime's poller for the pidfd to turn readable, which it does when the
// process exits, or for Close.
func (p *Process) watch() {
	defer close(p.done)
	defer p.end()
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool {
		for {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, 0)
			if err == unix.EINTR { // (the runtime's preemption signals interrupt it)
				continue
			}
			return err != nil || n > 0 // readable: the process has exited
		}
	})
}

// read copies len(dst) bytes at addr into dst.
func (p *Process) read(dst []byte, addr uint64) bool {
	if len(dst) == 0 {
		return true
	}
	if p.gone.Load() {
		return false
	}
	local := [1]unix.Iovec{{Base: &dst[0]}}
	local[0].SetLen(len(dst))
	remote := [1]unix.RemoteIovec{{Base: uintptr(addr), Len: len(dst)}}
	n, err := unix.ProcessVMReadv(p.pid, local[:], remote[:], 0)
	return err == nil && n == len(dst)
}

// write copies src to addr.
func (p *Process) write(src []byte, addr uint64) bool {
	if len(src) == 0 {
		return true
	}
	if p.gone.Load() {
		return false
	}
	local := [1]unix.Iovec{{Base: &src[0]}}
	local[0].SetLen(len(src))
	remote := [1]unix.RemoteIovec{{Base: uintptr(addr), Len: len(src)}}
	n, err := unix.ProcessVMWritev(p.pid, local[:], remote[:], 0)
	return err == nil && n == len(src)
}

// pageProbes is how many pages Check reads with one system call.
const pageProbes = 512

// Check reads one byte of every page of [addr, addr+n), which brings each page in, and reports
// the first error: EFAULT where a page is not mapped readable or, with write, not mapped writable
// (the process's /proc/PID/maps says), ESRCH once the process is gone, EPERM where the caller may
// not reach it. Nothing is written. A registration checks its range so, as the kernel pins a
// region's pages for it.
func (p *Process) Check(addr uint64, n int, write bool) error {
	const page = 4096
	if n <= 0 {
		return nil
	}
	if addr+uint64(n) < addr {
		return fmt.Errorf("mem: range at %#x of %d bytes wraps: %w", addr, n, unix.EINVAL)
	}
	if write {
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.pid))
		switch {
		case p.gone.Load():
			return fmt.Errorf("mem: process %d: %w", p.pid, unix.ESRCH)
		case err != nil:
			return fmt.Errorf("mem: process %d: %w", p.pid, err)
		case !Mapped(maps, addr&^(page-1), addr+uint64(n), true):
			return fmt.Errorf("mem: process %d: [%#x, +%d) not all mapped writable: %w", p.pid, addr, n, unix.EFAULT)
		}
	}
	var sink [pageProbes]byte
	var local [1]unix.Iovec
	var remote [pageProbes]unix.RemoteIovec
	end := addr + uint64(n)
	for a := addr; a < end; {
		k := 0
		for ; k < pageProbes && a < end; k++ {
			remote[k] = unix.RemoteIovec{Base: uintptr(a), Len: 1}
			a = a&^(page-1) + page
		}
		local[0] = unix.Iovec{Base: &sink[0]}
		local[0].SetLen(k)
		if p.gone.Load() {
			return fmt.Errorf("mem: process %d: %w", p.pid, unix.ESRCH)
		}
		got, err := unix.ProcessVMReadv(p.pid, local[:], remote[:k], 0)
		switch {
		case err != nil:
			return fmt.Errorf("mem: process %d at %#x: %w", p.pid, remote[0].Base, err)
		case got < k:
			return fmt.Errorf("mem: process %d at %#x: %w", p.pid, remote[got].Base, unix.EFAULT)
		}
	}
	return nil
}
