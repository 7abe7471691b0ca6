//go:build !linux

package link

import (
	"net"
	"net/netip"
)

// A socket is one of the link's UDP sockets.
type socket struct{ c *net.UDPConn }

func openSocket(a netip.AddrPort, size int) (socket, error) {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(a))
	if err != nil {
		return socket{}, err
	}
	_ = c.SetReadBuffer(size)
	_ = c.SetWriteBuffer(size)
	return socket{c}, nil
}

func (s socket) port() uint16 { return uint16(s.c.LocalAddr().(*net.UDPAddr).Port) }

// close closes the socket, which ends a read waiting on it; again, it does nothing.
func (s socket) close() { s.c.Close() }

func (u *UDP) initWait() error { return nil }
func (u *UDP) closeWait()      {}

// interrupt ends the calls waiting on the sockets, for Close, which then waits for them: here
// by closing the sockets.
func (u *UDP) interrupt() {
	for _, s := range u.socks {
		s.close()
	}
}
