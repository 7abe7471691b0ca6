//go:build !linux

package engine

import "runtime"

// osYield offers the processor to other goroutines (the threads of other programs are the
// kernel's business here).
func osYield() { runtime.Gosched() }
