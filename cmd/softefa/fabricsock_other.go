//go:build !linux

package main

import "net"

// tuneFabricSocket gives a fabric socket fabricSocketBuffer bytes each way, as far as the
// system allows; only Linux counts the datagrams a full socket drops.
func tuneFabricSocket(c *net.UDPConn) {
	_ = c.SetReadBuffer(fabricSocketBuffer)
	_ = c.SetWriteBuffer(fabricSocketBuffer)
}

var fabricOOBSize = 0

func socketOverflows([]byte) (uint32, bool) { return 0, false }
