package engine

import (
	"github.com/softefa/softefa/internal/seal"
	"github.com/softefa/softefa/link"
)

// With a key, every datagram leaves sealed (package seal) and only sealed ones are taken; a peer
// context is still made only through a cookie (admit.go), so a context forgotten with its replay
// window cannot be brought back by replayed datagrams.

// sealAll seals q's datagrams into its seal buffers and returns them.
func (d *Device) sealAll(q *txq, pkts []link.Packet) []link.Packet {
	if len(q.sealed) < len(pkts) {
		q.sealed = make([]link.Packet, len(q.pkts))
		for i := range q.sealed {
			q.sealed[i].Buf = make([]byte, 0, q.maxLen+seal.Overhead+64)
		}
	}
	out := q.sealed[:len(pkts)]
	for i := range pkts {
		p := &pkts[i]
		to := GIDFromAddr(p.Addr)
		b := d.seal.Seal(out[i].Buf[:0], p.Buf[:p.N], &q.aad, &d.ip, &to)
		out[i] = link.Packet{Buf: b, N: len(b), Addr: p.Addr, Path: p.Path}
	}
	return out
}
