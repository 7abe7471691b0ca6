//go:build linux

package uverbs

import (
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Memfd is a Regions over a memfd: the command fd a program holds. Region offsets are page
// aligned and handed out first-fit from a free list, so freed space is reused; freed pages are
// returned to the kernel with fallocate(PUNCH_HOLE). The device maps each region itself
// (MAP_SHARED), so its view and the program's mmap of the same offset are the same memory.
type Memfd struct {
	fd int

	mu    sync.Mutex // guards everything below
	size  int64      // file size
	free  []span     // free spans below size, by offset
	views map[uint64][]byte
}

type span struct{ off, n int64 }

// NewMemfd creates the memfd (close-on-exec).
func NewMemfd(name string) (*Memfd, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("uverbs: memfd_create: %w", err)
	}
	return &Memfd{fd: fd, views: make(map[uint64][]byte)}, nil
}

// FD returns the memfd.
func (m *Memfd) FD() int { return m.fd }

// Alloc returns a zeroed region of size bytes rounded up to pages.
func (m *Memfd) Alloc(size int) (uint64, []byte, error) {
	if size <= 0 || size > 1<<30 {
		return 0, nil, syscall.EINVAL
	}
	n := int64(roundPage(size))
	m.mu.Lock()
	defer m.mu.Unlock()
	off := int64(-1)
	for i, s := range m.free {
		if s.n >= n {
			off = s.off
			if s.n == n {
				m.free = append(m.free[:i], m.free[i+1:]...)
			} else {
				m.free[i] = span{s.off + n, s.n - n}
			}
			break
		}
	}
	if off < 0 {
		off = m.size
		if err := unix.Ftruncate(m.fd, m.size+n); err != nil {
			return 0, nil, syscall.ENOMEM
		}
		m.size += n
	}
	b, err := unix.Mmap(m.fd, off, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		m.release(off, n)
		return 0, nil, syscall.ENOMEM
	}
	m.views[uint64(off)] = b
	return uint64(off), b, nil
}

// Free unmaps the device's view of the region at key and punches its pages out of the file.
// A program's mapping of the region stays valid (and reads zeros).
func (m *Memfd) Free(key uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.views[key]
	if !ok {
		return
	}
	delete(m.views, key)
	n := int64(len(b))
	_ = unix.Munmap(b)
	_ = unix.Fallocate(m.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(key), n)
	m.release(int64(key), n)
}

// release puts [off, off+n) back on the free list, merging with its neighbours.
func (m *Memfd) release(off, n int64) {
	i := 0
	for i < len(m.free) && m.free[i].off < off {
		i++
	}
	m.free = append(m.free, span{})
	copy(m.free[i+1:], m.free[i:])
	m.free[i] = span{off, n}
	if i+1 < len(m.free) && m.free[i].off+m.free[i].n == m.free[i+1].off {
		m.free[i].n += m.free[i+1].n
		m.free = append(m.free[:i+1], m.free[i+2:]...)
	}
	if i > 0 && m.free[i-1].off+m.free[i-1].n == m.free[i].off {
		m.free[i-1].n += m.free[i].n
		m.free = append(m.free[:i], m.free[i+1:]...)
	}
}

// Close unmaps every view and closes the device's reference to the memfd.
func (m *Memfd) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, b := range m.views {
		_ = unix.Munmap(b)
		delete(m.views, k)
	}
	return unix.Close(m.fd)
}
