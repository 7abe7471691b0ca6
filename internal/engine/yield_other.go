//go:build !linux

package engine

import "runtime"

// OSYield offers the processor to other goroutines (the threads of other programs are the
// kernel's business here).
func OSYield() { runtime.Gosched() }
