package mem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childPages is the size of the child's buffer, in pages.
const childPages = 32

// TestMain turns the test binary into the child whose memory the tests reach, when asked to.
func TestMain(m *testing.M) {
	if os.Getenv("MEM_TEST_CHILD") == "1" {
		child()
		return
	}
	os.Exit(m.Run())
}

// child maps a buffer, fills byte i with byte(i*7), prints its address and then answers
// commands on stdin: "dump OFF N" prints bytes in hex, "unmap PAGE" unmaps a page, "ro PAGE"
// makes one read-only, "exit" exits.
func child() {
	buf, err := unix.Mmap(-1, 0, childPages*4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	base := uintptr(0)
	if len(buf) > 0 {
		base = uintptr(unsafePointer(&buf[0]))
	}
	fmt.Println(base)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		arg := func(i int) int { v, _ := strconv.Atoi(f[i]); return v }
		switch f[0] {
		case "dump":
			fmt.Printf("%x\n", buf[arg(1):arg(1)+arg(2)])
		case "unmap":
			err = unix.MunmapPtr(unsafePointer(&buf[arg(1)*4096]), 4096) // (Munmap would unmap all of buf)
			fmt.Println("ok", err)
		case "ro":
			err = unix.Mprotect(buf[arg(1)*4096:(arg(1)+1)*4096], unix.PROT_READ)
			fmt.Println("ok", err)
		case "exit":
			os.Exit(0)
		}
	}
}

// kid is a running child and the way to talk to it.
type kid struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	base uint64
	p    *Process
}

func startKid(t *testing.T) *kid {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MEM_TEST_CHILD=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	k := &kid{cmd: cmd, in: in, out: bufio.NewReader(outPipe)}
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	base, err := strconv.ParseUint(k.line(t), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	k.base = base
	p, err := Open(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	k.p = p
	return k
}

func (k *kid) line(t *testing.T) string {
	t.Helper()
	s, err := k.out.ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	return strings.TrimSpace(s)
}

func (k *kid) do(t *testing.T, format string, args ...any) string {
	t.Helper()
	if _, err := fmt.Fprintf(k.in, format+"\n", args...); err != nil {
		t.Fatal(err)
	}
	return k.line(t)
}

// dump returns the child's bytes [off, off+n) as it sees them.
func (k *kid) dump(t *testing.T, off, n int) []byte {
	t.Helper()
	var b []byte
	if _, err := fmt.Sscanf(k.do(t, "dump %d %d", off, n), "%x", &b); err != nil {
		t.Fatal(err)
	}
	return b
}

func pattern(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((off + i) * 7)
	}
	return b
}

func TestProcessReadWrite(t *testing.T) {
	k := startKid(t)
	s := In(k.p, k.base, childPages*4096)
	got := make([]byte, 6000)
	if !s.ReadAt(got, 3000) || !bytes.Equal(got, pattern(3000, 6000)) {
		t.Fatalf("read across pages: %x…", got[:16])
	}
	if !s.WriteAt([]byte("hello, device"), 4090) {
		t.Fatal("write failed")
	}
	if got := k.dump(t, 4088, 16); !bytes.Equal(got, append(append(pattern(4088, 2), "hello, device"...), pattern(4103, 1)...)) {
		t.Fatalf("the child sees %q", got)
	}
	if err := k.p.Check(k.base, childPages*4096); err != nil {
		t.Fatalf("Check of a mapped buffer: %v", err)
	}
}

func TestProcessAppendScatterCopy(t *testing.T) {
	k := startKid(t)
	far := In(k.p, k.base, childPages*4096)
	own := []byte("own bytes|")
	b, ok := Append([]byte("pre:"), []Span{Own(own), far.Slice(100, 50), Own(own)}, 4, 60)
	if want := append(append([]byte("pre:bytes|"), pattern(100, 50)...), "own "...); !ok || !bytes.Equal(b, want) {
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
	if got := k.dump(t, 8192, 4); string(got) != "defg" {
		t.Fatalf("far part %q", got)
	}

	// Between two ranges of the child, longer than the bounce buffer.
	n := 2*chunk + 100
	if !Copy(far.Slice(12*4096+1, n), far.Slice(8200, n)) {
		t.Fatal("Copy failed")
	}
	if got := k.dump(t, 12*4096+1, n); !bytes.Equal(got, pattern(8200, n)) || !bytes.Equal(k.dump(t, 0, 4), pattern(0, 4)) {
		t.Fatal("Copy: the child's bytes differ")
	}
}

func TestProcessFaults(t *testing.T) {
	k := startKid(t)
	far := In(k.p, k.base, childPages*4096)
	if r := k.do(t, "unmap 5"); r != "ok <nil>" {
		t.Fatal(r)
	}
	if r := k.do(t, "ro 2"); r != "ok <nil>" {
		t.Fatal(r)
	}
	if err := k.p.Check(k.base, childPages*4096); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("Check over an unmapped page: %v, want EFAULT", err)
	}
	if err := k.p.Check(k.base, 5*4096); err != nil {
		t.Fatalf("Check before it: %v", err)
	}
	b := make([]byte, 100)
	if far.ReadAt(b, 5*4096+10) {
		t.Fatal("read of an unmapped page succeeded")
	}
	if far.WriteAt(b, 2*4096) {
		t.Fatal("write to a read-only page succeeded")
	}
	if got := k.dump(t, 2*4096, 4); !bytes.Equal(got, pattern(2*4096, 4)) {
		t.Fatalf("the read-only page changed: %x", got)
	}
	if !far.ReadAt(b, 2*4096) {
		t.Fatal("read of a read-only page failed")
	}
}

func TestProcessExit(t *testing.T) {
	k := startKid(t)
	far := In(k.p, k.base, childPages*4096)
	fmt.Fprintln(k.in, "exit")
	_ = k.cmd.Wait() // reaped: its pid may be handed out again
	select {
	case <-k.p.Exited():
	case <-time.After(time.Minute):
		t.Fatal("no exit seen in a minute")
	}
	if far.ReadAt(make([]byte, 8), 0) || far.WriteAt(make([]byte, 8), 0) {
		t.Fatal("an access after the exit succeeded")
	}
	if err := k.p.Check(k.base, 1); !errors.Is(err, unix.ESRCH) {
		t.Fatalf("Check after the exit: %v, want ESRCH", err)
	}
}

func TestProcessAccessDoesNotAllocate(t *testing.T) {
	k := startKid(t)
	far := In(k.p, k.base, childPages*4096)
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
