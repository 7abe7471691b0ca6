//go:build linux

// Package memtest is a child process whose memory tests reach as a device reaches a program's: a
// test binary whose TestMain calls Serve becomes, when Start runs it, a process that maps a buffer
// of Pages pages, fills byte i with Pattern's value and then unmaps, protects, dumps or exits on
// request. It is for tests only.
package memtest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Pages is the size of the child's buffer in 4 KiB pages.
const Pages = 32

// PageSize is the size of the pages the child unmaps and protects.
const PageSize = 4096

const (
	env     = "MEMTEST_CHILD"
	envAddr = "MEMTEST_ADDR" // where the buffer goes (StartAt)
)

// Main is a TestMain that serves as the child when Start started the process (Serve) and runs
// the tests otherwise.
func Main(m *testing.M) {
	Serve()
	os.Exit(m.Run())
}

// Serve turns the process into the child if Start started it; otherwise it returns at once.
// Call it first in TestMain.
func Serve() {
	if os.Getenv(env) != "1" {
		return
	}
	addr, _ := strconv.ParseUint(os.Getenv(envAddr), 0, 64)
	flags := unix.MAP_PRIVATE | unix.MAP_ANON
	if addr != 0 {
		flags |= unix.MAP_FIXED_NOREPLACE
	}
	hint := uintptr(addr)
	p, err := unix.MmapPtr(-1, 0, *(*unsafe.Pointer)(unsafe.Pointer(&hint)), Pages*PageSize, unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil || addr != 0 && uintptr(p) != uintptr(addr) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	buf := unsafe.Slice((*byte)(p), Pages*PageSize)
	copy(buf, Pattern(0, len(buf)))
	fmt.Println(uintptr(unsafe.Pointer(&buf[0])))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		arg := func(i int) int { v, _ := strconv.Atoi(f[i]); return v }
		switch f[0] {
		case "dump":
			fmt.Printf("%x\n", buf[arg(1):arg(1)+arg(2)])
		case "unmap": // (unix.Munmap would unmap all of buf)
			fmt.Println("ok", unix.MunmapPtr(unsafe.Pointer(&buf[arg(1)*PageSize]), PageSize))
		case "ro":
			fmt.Println("ok", unix.Mprotect(buf[arg(1)*PageSize:(arg(1)+1)*PageSize], unix.PROT_READ))
		case "exit":
			os.Exit(0)
		}
	}
	os.Exit(0)
}

// Pattern returns the child's initial bytes [off, off+n).
func Pattern(off, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte((off + i) * 7)
	}
	return b
}

// Child is a running child: its process id and the address of its buffer.
type Child struct {
	Pid  int
	Base uint64
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
}

// Start runs the test binary as a child, killed when the test ends.
func Start(t testing.TB) *Child {
	t.Helper()
	return StartAt(t, 0)
}

// StartAt is Start with the child's buffer at addr (anywhere, for 0), which must be free in a
// new process.
func StartAt(t testing.TB, addr uint64) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"=1", fmt.Sprintf("%s=%#x", envAddr, addr))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &Child{Pid: cmd.Process.Pid, cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		_ = in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	if c.Base, err = strconv.ParseUint(c.line(t), 10, 64); err != nil {
		t.Fatalf("child: %v", err)
	}
	return c
}

func (c *Child) line(t testing.TB) string {
	t.Helper()
	s, err := c.out.ReadString('\n')
	if err != nil {
		t.Fatalf("child: %v", err)
	}
	return strings.TrimSpace(s)
}

func (c *Child) do(t testing.TB, format string, args ...any) string {
	t.Helper()
	if _, err := fmt.Fprintf(c.in, format+"\n", args...); err != nil {
		t.Fatal(err)
	}
	return c.line(t)
}

// Dump returns the child's bytes [off, off+n) as the child reads them.
func (c *Child) Dump(t testing.TB, off, n int) []byte {
	t.Helper()
	var b []byte
	if _, err := fmt.Sscanf(c.do(t, "dump %d %d", off, n), "%x", &b); err != nil {
		t.Fatal(err)
	}
	return b
}

// Unmap unmaps the child's page.
func (c *Child) Unmap(t testing.TB, page int) {
	t.Helper()
	if r := c.do(t, "unmap %d", page); r != "ok <nil>" {
		t.Fatalf("child: unmap: %s", r)
	}
}

// Protect makes the child's page read-only.
func (c *Child) Protect(t testing.TB, page int) {
	t.Helper()
	if r := c.do(t, "ro %d", page); r != "ok <nil>" {
		t.Fatalf("child: mprotect: %s", r)
	}
}

// Exit makes the child exit and reaps it: its process id may then be handed out again.
func (c *Child) Exit(t testing.TB) {
	t.Helper()
	if _, err := fmt.Fprintln(c.in, "exit"); err != nil {
		t.Fatal(err)
	}
	_ = c.cmd.Wait()
}
