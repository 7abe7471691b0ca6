// Package seal is softefa's authenticated encryption of datagrams (docs/wire.md, "Sealed
// datagrams"). With a key, every datagram is sealed with AES-256-GCM:
//
//	0x83 | nonce (12 bytes) | ciphertext of the whole plain datagram | tag (16 bytes)
//
// with the first 13 bytes, the sender's IP address and the receiver's GID as additional data:
// a sealed datagram authenticates only from the address that sent it and only at the device it
// was sent to, so it cannot be replayed from anywhere else. The nonce is 4 random bytes drawn at
// start (never 0) and an 8-byte counter that starts at a random value below 2^62 (so that it
// never wraps) and goes up by one per datagram, so that no nonce repeats under one key within a
// run, and runs collide only with negligible probability. A receiver keeps a Replay per sender: the latest salt with a window of Window
// counters below the highest, and the salts the sender used before. The package neither
// allocates per datagram nor keeps a reference to the buffers it is given.
package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"fmt"
	"io"
	"sync/atomic"
	"syscall"
)

const (
	// Version is the first byte of a sealed datagram.
	Version   = 0x83
	nonceSize = 12
	// Overhead is what sealing adds to a datagram.
	Overhead = 1 + nonceSize + 16
	// AADSize is the size of the additional data: the sealed prefix, the sender's IP, the
	// receiver's GID. Callers keep a scratch array of it per goroutine.
	AADSize = 1 + nonceSize + 16 + 16
	// Window is how many counters below the highest a Replay remembers (a multiple of 64): wide
	// because two receivers (the receive loop and a busy poller) read side by side, and one may
	// hold a batch while the other takes many newer datagrams.
	Window = 1024
)

// Sealer seals and opens datagrams under one key. Seal may be called from several goroutines at
// once (its counter is atomic); Open needs nothing but its arguments.
type Sealer struct {
	aead cipher.AEAD
	salt uint32
	ctr  atomic.Uint64
}

// CheckKey reports whether key can seal: EINVAL unless it has 32 bytes.
func CheckKey(key []byte) error {
	if len(key) != 32 {
		return fmt.Errorf("seal: key of %d bytes; AES-256-GCM takes 32: %w", len(key), syscall.EINVAL)
	}
	return nil
}

// New makes a Sealer for a 32-byte key, drawing its salt and first counter from rng; EINVAL for
// a key of another length.
func New(key []byte, rng io.Reader) (*Sealer, error) {
	if err := CheckKey(key); err != nil {
		return nil, err
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
	// The salt is never 0, which a Replay takes for "none known"; the counter starts below 2^62,
	// so that it never wraps (a receiver compares counters as plain integers).
	s := &Sealer{aead: aead, salt: max(binary.BigEndian.Uint32(r[:4]), 1)}
	s.ctr.Store(binary.BigEndian.Uint64(r[4:]) >> 2)
	return s, nil
}

// Seal writes the sealed form of plain, from our IP address from to the device with GID to, into
// dst's capacity and returns it; aad is the caller's scratch.
func (s *Sealer) Seal(dst, plain []byte, aad *[AADSize]byte, from, to *[16]byte) []byte {
	dst = append(dst[:0], Version)
	dst = binary.BigEndian.AppendUint32(dst, s.salt)
	dst = binary.BigEndian.AppendUint64(dst, s.ctr.Add(1))
	fillAAD(aad, dst, from, to)
	return s.aead.Seal(dst, dst[1:1+nonceSize], plain, aad[:])
}

func fillAAD(aad *[AADSize]byte, prefix []byte, from, to *[16]byte) {
	copy(aad[:1+nonceSize], prefix)
	copy(aad[1+nonceSize:], from[:])
	copy(aad[1+nonceSize+16:], to[:])
}

// Open authenticates and decrypts sealed datagram b, which came from IP address from to the
// device with GID to, into dst; it reports the nonce's salt and counter for the replay check.
func (s *Sealer) Open(dst, b []byte, aad *[AADSize]byte, from, to *[16]byte) (plain []byte, salt uint32, ctr uint64, ok bool) {
	if len(b) < Overhead || b[0] != Version {
		return nil, 0, 0, false
	}
	fillAAD(aad, b, from, to)
	plain, err := s.aead.Open(dst[:0], b[1:1+nonceSize], b[1+nonceSize:], aad[:])
	if err != nil {
		return nil, 0, 0, false
	}
	return plain, binary.BigEndian.Uint32(b[1:]), binary.BigEndian.Uint64(b[5:]), true
}

// Replay is a sender's replay window: the last Window counters below the highest seen, and the
// salts of its earlier runs.
// It is wide because two receivers (the receive loop and a busy poller) read side by side: one
// may hold a batch while the other takes many newer datagrams.
type Replay struct {
	salt uint32
	top  uint64
	win  [Window / 64]uint64 // bit c%Window: counter c in (top-Window, top] seen
	old  [4]uint32
}

func (r *Replay) bit(c uint64) (*uint64, uint64) {
	i := c % Window
	return &r.win[i/64], 1 << (i % 64)
}

// OtherRun reports whether salt is not the salt of the sender's run that r knows as current,
// or r knows none: the first datagram of a run may be a capture of an earlier one, and a
// receiver takes it only with proof that it is new (a fresh cookie).
func (r *Replay) OtherRun(salt uint32) bool { return salt != r.salt }

// Fresh reports whether (salt, ctr) has not been seen from this sender, and records it.
func (r *Replay) Fresh(salt uint32, ctr uint64) bool {
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
		// Every counter up to the first one taken counts as seen: what the run sent before it
		// cannot be told from a replay.
		r.salt, r.top = salt, ctr
		for i := range r.win {
			r.win[i] = ^uint64(0)
		}
		return true
	}
	switch {
	case ctr > r.top:
		if ctr-r.top >= Window {
			r.win = [Window / 64]uint64{}
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
	case r.top-ctr >= Window:
		return false
	}
	w, b := r.bit(ctr)
	if *w&b != 0 {
		return false
	}
	*w |= b
	return true
}

// State returns what a forgotten sender's replay window leaves behind: its salt, its highest
// counter and the salts of its earlier runs.
func (r *Replay) State() (salt uint32, top uint64, old [4]uint32) { return r.salt, r.top, r.old }

// Resume makes r the window of a sender that left State's values: every counter up to top
// counts as seen (what happened below it is no longer known), and the old salts stay refused.
func (r *Replay) Resume(salt uint32, top uint64, old [4]uint32) {
	r.salt, r.top, r.old = salt, top, old
	for i := range r.win {
		r.win[i] = ^uint64(0)
	}
}
