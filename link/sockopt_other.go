//go:build !linux

package link

import "syscall"

func forceBuffers(syscall.RawConn, int) {}
