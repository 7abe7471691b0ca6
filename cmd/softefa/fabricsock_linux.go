package main

import (
	"encoding/binary"
	"net"

	"golang.org/x/sys/unix"
)

// tuneFabricSocket gives a fabric socket fabricSocketBuffer bytes each way, past
// net.core.rmem_max where the process may (CAP_NET_ADMIN), and asks the kernel to count the
// datagrams it drops because the socket's buffer is full (SO_RXQ_OVFL), so that the fabric can
// tell its own losses from the ones it was asked to make.
func tuneFabricSocket(c *net.UDPConn) {
	_ = c.SetReadBuffer(fabricSocketBuffer)
	_ = c.SetWriteBuffer(fabricSocketBuffer)
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, fabricSocketBuffer)
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, fabricSocketBuffer)
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1)
	})
}

// fabricOOBSize is room for the SO_RXQ_OVFL control message.
var fabricOOBSize = unix.CmsgSpace(4)

// socketOverflows reads the socket's count of dropped datagrams from a read's control
// messages; ok is false when the kernel sent none (it sends one once the count is non-zero).
func socketOverflows(oob []byte) (n uint32, ok bool) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, false
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_RXQ_OVFL && len(m.Data) >= 4 {
			return binary.NativeEndian.Uint32(m.Data), true
		}
	}
	return 0, false
}
