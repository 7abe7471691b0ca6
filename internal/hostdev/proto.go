//go:build linux

// Package hostdev is softefa's host device: one engine device that the programs of a host share,
// as they share a NIC. The device runs in a process of its own (softefa device) and serves each
// program through a connection to its Unix socket (SOCK_SEQPACKET): the program's side (the
// preload shim, in C: no Go runtime runs in the program) forwards what it would ask the kernel's
// uverbs device (open, the write() commands, ioctl, close, RDMA
// netlink, sysfs counters) and the device answers them with a uverbs.File per open, reaching the
// program's memory itself (uverbs.ProcessMemory: process_vm_readv/writev) and sharing the rings
// with it through the open's memfd, which it passes over the socket (SCM_RIGHTS). Everything
// the program made is released when its connection closes, as the kernel releases a uverbs
// file when the program exits. docs/architecture.md, "The host device".
//
// # Protocol
//
// Every message is one datagram, little-endian. A request is op (u32), handle (u32, the open it
// is about), arg (u64) and a payload; every request but kick, arm and trap gets one reply: op (u32,
// the request's), 4 zero bytes, status (i64: a result ≥ 0, or -errno) and a payload. While the
// device carries out a request it may give the program an fd first (op give, the fd attached):
// the program answers with op give and, in status, the number the fd has in the program; then the
// reply comes.
package hostdev

import (
	"encoding/binary"
	"fmt"
	"syscall"

	"github.com/softefa/softefa/internal/uverbs"
)

// Operations.
const (
	opOpen    = 1 // → status: the open's handle; the open's memfd attached
	opWrite   = 2 // payload: a uverbs write() command → status: bytes taken
	opIoctl   = 3 // arg: the ioctl's argument (a program address); payload: u32 request
	opClose   = 4 // the open is closed
	opKick    = 5 // arg: a QP handle whose doorbell was rung (no reply)
	opArm     = 6 // arg: a CQ handle whose arm bit was stored (no reply)
	opInfo    = 7 // → payload: Info
	opCounter = 8 // payload: a hw_counters name → payload: u64; status -ENOENT for none
	opNetlink = 9 // arg: the program socket's port id; payload: chardev (u32 major, u32 minor,
	// u16 name length, name) and the request → payload: replies, each u32 length and bytes
	opStatus   = 10  // → payload: text: "programs N", "opens N", a line "NAME VALUE" per port counter
	opStop     = 11  // the device stops (after its reply)
	opDBPage   = 12  // arg: an mmap key of the open → status: the QP whose SQ doorbell page it is, or -ENOENT
	opTrap     = 13  // arg: a QP handle, and 1<<32 if the program's mapping of its SQ doorbell page traps every store (no reply)
	opDoorbell = 14  // → the program's doorbell socket attached (its kicks; docs/architecture.md, "Doorbells on the host device")
	opGive     = 100 // device → program, an fd attached; the program answers with its number
)

const (
	reqHeader   = 16
	replyHeader = 16
	// maxMessage bounds a message: a uverbs command (libibverbs' largest are a few KiB) or a
	// netlink exchange. It is each connection's buffer in the device.
	maxMessage = 64 << 10
)

// Info is what a program's side needs to show the device as the kernel would: its name, GID,
// part id and link speed (the sysfs tree a program reads).
type Info struct {
	Name      string
	GID       [16]byte
	PartID    uint32
	SpeedGbps uint32
}

func (i *Info) encode() []byte {
	b := make([]byte, 0, 26+len(i.Name))
	b = append(b, i.GID[:]...)
	b = binary.LittleEndian.AppendUint32(b, i.PartID)
	b = binary.LittleEndian.AppendUint32(b, i.SpeedGbps)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(i.Name)))
	return append(b, i.Name...)
}

func (i *Info) decode(b []byte) error {
	if len(b) < 26 || len(b) != 26+int(binary.LittleEndian.Uint16(b[24:])) {
		return fmt.Errorf("hostdev: info of %d bytes: %w", len(b), syscall.EPROTO)
	}
	copy(i.GID[:], b)
	i.PartID = binary.LittleEndian.Uint32(b[16:])
	i.SpeedGbps = binary.LittleEndian.Uint32(b[20:])
	i.Name = string(b[26:])
	return nil
}

func request(op, handle uint32, arg uint64, payload ...[]byte) []byte {
	n := reqHeader
	for _, p := range payload {
		n += len(p)
	}
	b := make([]byte, reqHeader, n)
	binary.LittleEndian.PutUint32(b, op)
	binary.LittleEndian.PutUint32(b[4:], handle)
	binary.LittleEndian.PutUint64(b[8:], arg)
	for _, p := range payload {
		b = append(b, p...)
	}
	return b
}

func reply(op uint32, status int64, payload []byte) []byte {
	b := make([]byte, replyHeader, replyHeader+len(payload))
	binary.LittleEndian.PutUint32(b, op)
	binary.LittleEndian.PutUint64(b[8:], uint64(status))
	return append(b, payload...)
}

// errnoStatus is the reply status for err: -errno (EIO for an error without one).
func errnoStatus(err error) int64 { return -int64(uverbs.Errno(err)) }
