package engine

import "syscall"

// OSYield offers the calling thread's core to any other thread the kernel has ready to run
// (sched_yield), and returns at once when there is none. A raw system call: it never blocks, so
// the Go runtime need not know of it.
func OSYield() { syscall.RawSyscall(syscall.SYS_SCHED_YIELD, 0, 0, 0) }
