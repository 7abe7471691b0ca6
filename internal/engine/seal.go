package engine

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"fmt"
	"io"
	"sync/atomic"
	"syscall"

	"github.com/softefa/softefa/link"
)

// Authenticated encryption. With a key, every datagram is sealed with AES-256-GCM:
//
//	0x83 | nonce (12 bytes) | ciphertext of the whole plain datagram | tag (16 bytes)
//
// with the first 13 bytes, the sender's IP address and the receiver's GID as additional data:
// a sealed datagram authenticates only from the address that sent it and only at the device it
// was sent to, so it cannot be replayed from anywhere else. The nonce is 4 random bytes drawn at
// start and an 8-byte counter that starts at a random value and goes up by one per datagram, so
// that no nonce repeats under one key within a run, and runs collide only with negligible
// probability. A receiver drops (and counts) datagrams that are not sealed, that fail
// authentication, and replays: per peer it keeps the latest salt with a window of replayWindow
// counters below the highest, and refuses salts the peer has used before. Sealing is no
// validation: a peer context is still made only through a cookie (admit.go), so a context
// forgotten and its replay window with it cannot be brought back by replayed datagrams.

const (
	sealedVersion = 0x83
	nonceSize     = 12
	sealOverhead  = 1 + nonceSize + 16
	aadSize       = 1 + nonceSize + 16 + 16 // the sealed prefix, the sender's IP, the receiver's GID
	replayWindow  = 1024                    // counters, a multiple of 64
)

type sealer struct {
	aead cipher.AEAD
	salt uint32
	ctr  atomic.Uint64
}

func newSealer(key []byte, rng io.Reader) (*sealer, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("engine: key of %d bytes; AES-256-GCM takes 32: %w", len(key), syscall.EINVAL)
	}
	blk, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	var r [12]byte
	_, _ = io.ReadFull(rng, r[:])
	s := &sealer{aead: aead, salt: binary.BigEndian.Uint32(r[:4])}
	s.ctr.Store(binary.BigEndian.Uint64(r[4:]))
	return s, nil
}

// seal writes the sealed form of plain, from our IP address from to the device with GID to, into
// dst's capacity and returns it; aad is the caller's scratch.
func (s *sealer) seal(dst, plain []byte, aad *[aadSize]byte, from, to *[16]byte) []byte {
	dst = append(dst[:0], sealedVersion)
	dst = binary.BigEndian.AppendUint32(dst, s.salt)
	dst = binary.BigEndian.AppendUint64(dst, s.ctr.Add(1))
	fillAAD(aad, dst, from, to)
	return s.aead.Seal(dst, dst[1:1+nonceSize], plain, aad[:])
}

func fillAAD(aad *[aadSize]byte, prefix []byte, from, to *[16]byte) {
	copy(aad[:1+nonceSize], prefix)
	copy(aad[1+nonceSize:], from[:])
	copy(aad[1+nonceSize+16:], to[:])
}

// open authenticates and decrypts sealed datagram b, which came from IP address from to the
// device with GID to, into dst; it reports the nonce's salt and counter for the replay check.
func (s *sealer) open(dst, b []byte, aad *[aadSize]byte, from, to *[16]byte) (plain []byte, salt uint32, ctr uint64, ok bool) {
	if len(b) < sealOverhead || b[0] != sealedVersion {
		return nil, 0, 0, false
	}
	fillAAD(aad, b, from, to)
	plain, err := s.aead.Open(dst[:0], b[1:1+nonceSize], b[1+nonceSize:], aad[:])
	if err != nil {
		return nil, 0, 0, false
	}
	return plain, binary.BigEndian.Uint32(b[1:]), binary.BigEndian.Uint64(b[5:]), true
}

// replayState is a peer's replay window: the last replayWindow counters below the highest seen.
// It is wide because two receivers (the receive loop and a busy poller) read side by side: one
// may hold a batch while the other takes many newer datagrams.
type replayState struct {
	salt uint32
	top  uint64
	win  [replayWindow / 64]uint64 // bit c%replayWindow: counter c in (top-replayWindow, top] seen
	old  [4]uint32
}

func (r *replayState) bit(c uint64) (*uint64, uint64) {
	i := c % replayWindow
	return &r.win[i/64], 1 << (i % 64)
}

// fresh reports whether (salt, ctr) has not been seen from this peer, and records it.
func (r *replayState) fresh(salt uint32, ctr uint64) bool {
	if salt != r.salt {
		for _, o := range r.old {
			if o == salt && salt != 0 {
				return false // a salt from an earlier run: replayed
			}
		}
		if r.salt != 0 {
			copy(r.old[1:], r.old[:])
			r.old[0] = r.salt
		}
		r.salt, r.top, r.win = salt, ctr, [replayWindow / 64]uint64{}
		w, b := r.bit(ctr)
		*w |= b
		return true
	}
	switch {
	case ctr > r.top:
		if ctr-r.top >= replayWindow {
			r.win = [replayWindow / 64]uint64{}
		} else {
			for c := r.top + 1; c < ctr; c++ { // counters skipped: not seen yet
				w, b := r.bit(c)
				*w &^= b
			}
		}
		r.top = ctr
		w, b := r.bit(ctr)
		*w |= b
		return true
	case r.top-ctr >= replayWindow:
		return false
	}
	w, b := r.bit(ctr)
	if *w&b != 0 {
		return false
	}
	*w |= b
	return true
}

// sealAll seals q's datagrams into its seal buffers and returns them.
func (d *Device) sealAll(q *txq, pkts []link.Packet) []link.Packet {
	if len(q.sealed) < len(pkts) {
		q.sealed = make([]link.Packet, len(q.pkts))
		for i := range q.sealed {
			q.sealed[i].Buf = make([]byte, 0, q.maxLen+sealOverhead+64)
		}
	}
	out := q.sealed[:len(pkts)]
	for i := range pkts {
		p := &pkts[i]
		to := GIDFromAddr(p.Addr)
		b := d.seal.seal(out[i].Buf[:0], p.Buf[:p.N], &q.aad, &d.ip, &to)
		out[i] = link.Packet{Buf: b, N: len(b), Addr: p.Addr, Path: p.Path}
	}
	return out
}
