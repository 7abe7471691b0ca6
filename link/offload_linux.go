package link

import (
	"encoding/binary"
	"unsafe"

	"golang.org/x/sys/unix"
)

// UDP segmentation offload (GSO) on send and generic receive offload (GRO) on receive, where the
// kernel has them. With GSO, consecutive datagrams to one address from one socket, all of one
// size but the last, leave in one sendmmsg entry (an iovec each, UDP_SEGMENT giving the size);
// the kernel cuts them apart, or hands the whole run across loopback in one piece. With GRO the
// kernel hands such runs to recvmmsg in one buffer, and UDP_GRO says where to cut. Either falls
// back to one datagram per entry when the kernel refuses it.

const (
	maxGSOSegments = 64    // UDP_MAX_SEGMENTS
	maxGSOBytes    = 65000 // under the 64 KiB limit of one UDP send
	groBufSize     = 65536
	groBufs        = 8 // superpacket buffers per Receive: 512 KiB
)

var cmsgSegSpace = unix.CmsgSpace(2)
var cmsgGROSpace = unix.CmsgSpace(4)

// enableOffload turns GRO on for socket 0 and GSO on for sends.
func (u *UDP) enableOffload() {
	u.gso.Store(true)
	u.gro = unix.SetsockoptInt(u.socks[0].fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil
}

// putSegCmsg writes a UDP_SEGMENT control message for segments of size bytes into c.
func putSegCmsg(c []byte, size int) {
	h := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(c[unix.CmsgLen(0):], uint16(size))
}

// groSize returns the segment size a UDP_GRO control message in c[:n] gives, or 0.
func groSize(c []byte, n int) int {
	for off := 0; off+unix.CmsgLen(0) <= n; {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&c[off]))
		l := int(h.Len)
		if l < unix.CmsgLen(0) || off+l > n {
			return 0
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && l >= unix.CmsgLen(4) {
			return int(binary.NativeEndian.Uint32(c[off+unix.CmsgLen(0):]))
		}
		off += unix.CmsgSpace(l - unix.CmsgLen(0))
	}
	return 0
}

// gsoRun returns how many packets from the front of pkts can leave in one GSO entry: same
// address, the size of the first, the last possibly shorter.
func gsoRun(pkts []Packet) int {
	size, total := pkts[0].N, pkts[0].N
	k := 1
	for k < len(pkts) && k < maxGSOSegments {
		p := &pkts[k]
		if p.Addr != pkts[0].Addr || p.N > size || total+p.N > maxGSOBytes {
			break
		}
		total += p.N
		k++
		if p.N < size {
			break // a shorter datagram ends the run
		}
	}
	return k
}
