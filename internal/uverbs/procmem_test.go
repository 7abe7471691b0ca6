//go:build linux

package uverbs

import (
	"os"
	"syscall"
	"testing"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/mem"
	"github.com/softefa/softefa/internal/mem/memtest"
)

// TestMain lets the test binary serve as the program process of TestFileOfAnotherProcess.
func TestMain(m *testing.M) { memtest.Main(m) }

// A File can serve a program in another process: the commands' responses land in the program's
// memory and its memory regions are ranges of its address space, checked page by page as the
// kernel pins them. The program is a child whose buffer sits where the harness's response and
// region addresses are.
func TestFileOfAnotherProcess(t *testing.T) {
	const page = memtest.PageSize
	child := memtest.StartAt(t, respAddr)
	if bufAddr+16*page > respAddr+memtest.Pages*page {
		t.Fatal("the child's buffer does not hold the harness's addresses")
	}
	p, err := mem.Open(child.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	e, err := engine.NewDevice(config.Device{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	d := NewDevice(e)
	defer d.Close()
	pm := NewProcessMemory(p)
	f := d.Open(pm, &heapRegions{}, nil)
	defer f.Close()

	do := func(b []byte) ([]byte, error) {
		t.Helper()
		n, err := f.Write(b)
		if err == nil && n != len(b) {
			t.Fatalf("Write returned %d for %d bytes", n, len(b))
		}
		r := make([]byte, 64)
		if rerr := pm.Read(respAddr, r); rerr != nil {
			t.Fatal(rerr)
		}
		return r, err
	}
	drv := make([]byte, 8)
	put32(drv, 0, efaAllocUcontextCmdTxBatch|efaAllocUcontextCmdMinSQWR)
	r, err := do(cmd(cmdGetContext, (8+24)/4, withResp(8), drv))
	if err != nil || u32(r, 4) != uint32(d.cfg.CompVectors) {
		t.Fatalf("GET_CONTEXT: %v, response % x", err, r[:8])
	}
	syscall.Close(int(u32(r, 0)))
	r, err = do(cmd(cmdAllocPD, (4+8)/4, withResp(8), nil))
	if err != nil {
		t.Fatal(err)
	}
	pd := u32(r, 0)

	reg := func(start, length uint64, access uint32) ([]byte, error) {
		return do(regMRCmd(start, length, start, pd, access))
	}
	r, err = reg(bufAddr, 8*page, 1|4) // LOCAL_WRITE | REMOTE_READ
	if err != nil {
		t.Fatal(err)
	}
	mrh, lkey := u32(r, 0), u32(r, 4)
	if lkey == 0 || u32(r, 8) == 0 {
		t.Fatalf("REG_MR keys % x", r[:12])
	}
	if got := child.Dump(t, 4, 4); u32(got, 0) != lkey {
		t.Fatalf("the program reads lkey %#x, want %#x", u32(got, 0), lkey)
	}
	if o, ok := f.objs[mrh].(*mrObj); !ok || o.mr.Len() != 8*page {
		t.Fatalf("the MR object %v", f.objs[mrh])
	}

	child.Unmap(t, 31)   // the last page of the buffer
	child.Protect(t, 30) // and the one before it
	last, ro := uint64(respAddr+31*page), uint64(respAddr+30*page)
	if _, err := reg(last, page, 0); err != syscall.EFAULT {
		t.Fatalf("REG_MR of an unmapped page: %v, want EFAULT", err)
	}
	if _, err := reg(ro, page, 1); err != syscall.EFAULT {
		t.Fatalf("REG_MR with LOCAL_WRITE of a read-only page: %v, want EFAULT", err)
	}
	if _, err := reg(ro, page, 4); err != nil {
		t.Fatalf("REG_MR with REMOTE_READ of a read-only page: %v", err)
	}
	core := make([]byte, 8)
	put64(core, 0, last) // a response address the program does not have
	if _, err := f.Write(cmd(cmdAllocPD, (4+8)/4, core, nil)); err != syscall.EFAULT {
		t.Fatalf("ALLOC_PD with its response at an unmapped page: %v, want EFAULT", err)
	}
}

// File.sameProcess: two opens reaching one process by two handles of it are one process's, as an
// open is its own; another process's, or an open whose memory is not another process's (the
// harness's), are not.
func TestSameProcess(t *testing.T) {
	open := func(pid int) *File {
		t.Helper()
		p, err := mem.Open(pid)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		return &File{mem: NewProcessMemory(p)}
	}
	a, b, other := open(os.Getpid()), open(os.Getpid()), open(os.Getppid())
	harness := &File{mem: &fakeMem{}}
	for _, c := range []struct {
		name string
		f, g *File
		want bool
	}{
		{"two opens of one process", a, b, true},
		{"an open and itself", a, a, true},
		{"two processes", a, other, false},
		{"another process's open and the harness's", a, harness, false},
		{"the harness's open and itself", harness, harness, true},
	} {
		if got := c.f.sameProcess(c.g); got != c.want {
			t.Errorf("%s: sameProcess %v, want %v", c.name, got, c.want)
		}
	}
}
