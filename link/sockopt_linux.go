package link

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// forceBuffers raises the socket buffers past net.core.rmem_max/wmem_max where the process may
// (CAP_NET_ADMIN); elsewhere the ordinary SetReadBuffer/SetWriteBuffer limits stay.
func forceBuffers(raw syscall.RawConn, size int) {
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size)
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, size)
	})
}
