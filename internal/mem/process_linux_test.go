package mem

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/softefa/softefa/internal/mem/memtest"
	"golang.org/x/sys/unix"
)

// TestMain turns the test binary into the child whose memory the tests reach, when asked to.
func TestMain(m *testing.M) { memtest.Main(m) }

// start runs a child and opens its memory.
func start(t *testing.T) (*memtest.Child, *Process, Span) {
	c := memtest.Start(t)
	p, err := Open(c.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return c, p, In(p, c.Base, memtest.Pages*memtest.PageSize)
}

func TestProcessReadWrite(t *testing.T) {
	k, p, s := start(t)
	got := make([]byte, 6000)
	if !s.ReadAt(got, 3000) || !bytes.Equal(got, memtest.Pattern(3000, 6000)) {
		t.Fatalf("read across pages: %x…", got[:16])
	}
	if !s.WriteAt([]byte("hello, device"), 4090) {
		t.Fatal("write failed")
	}
	if got := k.Dump(t, 4088, 16); !bytes.Equal(got, append(append(memtest.Pattern(4088, 2), "hello, device"...), memtest.Pattern(4103, 1)...)) {
		t.Fatalf("the child sees %q", got)
	}
	if err := p.Check(k.Base, memtest.Pages*memtest.PageSize, true); err != nil {
		t.Fatalf("Check of a mapped buffer: %v", err)
	}
}

func TestProcessAppendScatterCopy(t *testing.T) {
	k, _, far := start(t)
	own := []byte("own bytes|")
	b, ok := Append([]byte("pre:"), []Span{Own(own), far.Slice(100, 50), Own(own)}, 4, 60)
	if want := append(append([]byte("pre:bytes|"), memtest.Pattern(100, 50)...), "own "...); !ok || !bytes.Equal(b, want) {
		t.Fatalf("Append = %q, %v; want %q", b, ok, want)
	}

	dst := []Span{Own(make([]byte, 3)), far.Slice(8192, 4), Own(make([]byte, 10))}
	ownDst := dst[0]
	rest, ok := Scatter(dst, []byte("abcdefgh"))
	if !ok || len(rest) != 1 || rest[0].Len() != 9 {
		t.Fatalf("Scatter left %d spans (%v)", len(rest), ok)
	}
	if b, _ := ownDst.Bytes(); string(b) != "abc" {
		t.Fatalf("own part %q", b)
	}
	if got := k.Dump(t, 8192, 4); string(got) != "defg" {
		t.Fatalf("far part %q", got)
	}

	// Between two ranges of the child, longer than the bounce buffer.
	n := 2*chunk + 100
	if !Copy(far.Slice(12*4096+1, n), far.Slice(8200, n)) {
		t.Fatal("Copy failed")
	}
	if got := k.Dump(t, 12*4096+1, n); !bytes.Equal(got, memtest.Pattern(8200, n)) || !bytes.Equal(k.Dump(t, 0, 4), memtest.Pattern(0, 4)) {
		t.Fatal("Copy: the child's bytes differ")
	}
}

func TestProcessFaults(t *testing.T) {
	k, p, far := start(t)
	k.Unmap(t, 5)
	k.Protect(t, 2)
	if err := p.Check(k.Base, memtest.Pages*memtest.PageSize, true); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("Check over an unmapped page: %v, want EFAULT", err)
	}
	if err := p.Check(k.Base, 5*4096, false); err != nil {
		t.Fatalf("Check before it: %v", err)
	}
	if err := p.Check(k.Base+2*4096, 4096, true); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("Check for writing of a read-only page: %v, want EFAULT", err)
	}
	if err := p.Check(k.Base+2*4096, 4096, false); err != nil {
		t.Fatalf("Check for reading of a read-only page: %v", err)
	}
	b := make([]byte, 100)
	if far.ReadAt(b, 5*4096+10) {
		t.Fatal("read of an unmapped page succeeded")
	}
	if far.WriteAt(b, 2*4096) {
		t.Fatal("write to a read-only page succeeded")
	}
	if got := k.Dump(t, 2*4096, 4); !bytes.Equal(got, memtest.Pattern(2*4096, 4)) {
		t.Fatalf("the read-only page changed: %x", got)
	}
	if !far.ReadAt(b, 2*4096) {
		t.Fatal("read of a read-only page failed")
	}
}

func TestProcessExit(t *testing.T) {
	k, p, far := start(t)
	k.Exit(t) // reaped: its pid may be handed out again
	select {
	case <-p.Exited():
	case <-time.After(time.Minute):
		t.Fatal("no exit seen in a minute")
	}
	if far.ReadAt(make([]byte, 8), 0) || far.WriteAt(make([]byte, 8), 0) {
		t.Fatal("an access after the exit succeeded")
	}
	if err := p.Check(k.Base, 1, false); !errors.Is(err, unix.ESRCH) {
		t.Fatalf("Check after the exit: %v, want ESRCH", err)
	}
}

func TestProcessAccessDoesNotAllocate(t *testing.T) {
	_, _, far := start(t)
	b := make([]byte, 64)
	dst := make([]byte, 0, 256)
	src := []Span{far.Slice(0, 100)}
	if n := testing.AllocsPerRun(100, func() {
		far.ReadAt(b, 10)
		far.WriteAt(b, 10)
		dst, _ = Append(dst[:0], src, 0, 100)
	}); n != 0 {
		t.Fatalf("%v allocations a round", n)
	}
}
