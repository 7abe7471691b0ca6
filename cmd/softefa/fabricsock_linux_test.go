package main

import (
	"net"
	"testing"
)

// A fabric socket counts the datagrams the kernel dropped because its buffer was full.
func TestFabricSocketCountsOverflows(t *testing.T) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tuneFabricSocket(c)
	if err := c.SetReadBuffer(4096); err != nil { // the least the kernel allows: a few datagrams
		t.Fatal(err)
	}
	s, err := net.DialUDP("udp", nil, c.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const sent = 200
	msg := make([]byte, 1000)
	for range sent {
		if _, err := s.Write(msg); err != nil {
			t.Fatal(err)
		}
	}
	// The kernel stamps each datagram with the count at the time it was queued: the first ones
	// came before any drop, so make room and send a marker, which comes after them all.
	var o overflowCounter
	buf, oob := make([]byte, 2048), make([]byte, fabricOOBSize)
	for i := 0; ; i++ {
		n, _, err := o.read(c, buf, oob)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if i == 0 {
			if _, err := s.Write([]byte{1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := o.n.Load(); n == 0 || n >= sent {
		t.Fatalf("overflow count %d after %d datagrams into a 4 KiB buffer; want some, not all", n, sent)
	}
}
