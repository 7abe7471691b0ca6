//go:build !linux

package link

import (
	"errors"
	"os"
	"time"
)

// batch, superpacket and rxState are unused where datagrams move one per system call.
type (
	batch       struct{}
	superpacket struct{}
	rxState     struct{}
)

func (u *UDP) enableOffload() {}

func (u *UDP) sendPath(_ *batch, path int, pkts []Packet) error {
	for i := range pkts {
		p := &pkts[i]
		if _, err := u.socks[path].c.WriteToUDPAddrPort(p.Buf[:p.N], p.Addr); err != nil && !transient(err) {
			return err
		}
	}
	return nil
}

func (u *UDP) receive(pkts []Packet) (int, error) {
	n, addr, err := u.socks[0].c.ReadFromUDPAddrPort(pkts[0].Buf)
	if err != nil {
		return 0, err
	}
	pkts[0].N, pkts[0].Addr, pkts[0].Path = n, addr, 0
	return 1, nil
}

// TryReceive reads one queued datagram without waiting.
func (u *UDP) TryReceive(pkts []Packet) (int, error) {
	if err := u.socks[0].c.SetReadDeadline(time.Now()); err != nil {
		return 0, err
	}
	defer u.socks[0].c.SetReadDeadline(time.Time{})
	n, err := u.receive(pkts)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return 0, nil
	}
	return n, err
}

// NewPoller returns a receiver that finds nothing: where datagrams move one per system call, a
// read beside the parked Receive would have to share its deadline, so there is no busy polling.
func (u *UDP) NewPoller() Poller { return noPoller{} }

type noPoller struct{}

func (noPoller) TryReceive([]Packet) (int, error) { return 0, nil }
