//go:build linux

package hostdev

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/softefa/softefa/config"
	"github.com/softefa/softefa/internal/engine"
	"github.com/softefa/softefa/internal/uverbs"
	"golang.org/x/sys/unix"
)

// The tests speak the uverbs commands libibverbs writes (ib_user_verbs.h), as a program's side
// forwards them: a header (command, in_words, out_words), the core request with its response
// address first, and EFA's driver data.

const (
	cmdGetContext        = 0
	cmdAllocPD           = 3
	cmdRegMR             = 9
	cmdCreateCompChannel = 17
)

func command(cmd uint32, outWords int, core, drv []byte) []byte {
	b := make([]byte, 8, 8+len(core)+len(drv))
	b = append(append(b, core...), drv...)
	binary.LittleEndian.PutUint32(b, cmd)
	binary.LittleEndian.PutUint16(b[4:], uint16(len(b)/4))
	binary.LittleEndian.PutUint16(b[6:], uint16(outWords))
	return b
}

// withResp is a core request of n bytes whose first 8 point at resp.
func withResp(n int, resp []byte) []byte {
	b := make([]byte, n)
	binary.LittleEndian.PutUint64(b, uint64(uintptr(unsafe.Pointer(&resp[0]))))
	return b
}

// program is what a program does first on the device: GET_CONTEXT (the async fd), ALLOC_PD,
// REG_MR of buf and CREATE_COMP_CHANNEL; it returns the fds the device gave.
func program(c *Client, h uint32, buf []byte) (asyncFD, channelFD int, err error) {
	resp := make([]byte, 64)
	drv := make([]byte, 8)
	binary.LittleEndian.PutUint32(drv, 3) // TX batch and min SQ WR understood
	if _, err := c.Write(h, command(cmdGetContext, (8+24)/4, withResp(8, resp), drv)); err != nil {
		return -1, -1, fmt.Errorf("GET_CONTEXT: %w", err)
	}
	asyncFD = int(int32(binary.LittleEndian.Uint32(resp)))
	if _, err := c.Write(h, command(cmdAllocPD, (4+8)/4, withResp(8, resp), nil)); err != nil {
		return -1, -1, fmt.Errorf("ALLOC_PD: %w", err)
	}
	pd := binary.LittleEndian.Uint32(resp)
	reg := withResp(40, resp)
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
	binary.LittleEndian.PutUint64(reg[8:], addr)
	binary.LittleEndian.PutUint64(reg[16:], uint64(len(buf)))
	binary.LittleEndian.PutUint64(reg[24:], addr)
	binary.LittleEndian.PutUint32(reg[32:], pd)
	binary.LittleEndian.PutUint32(reg[36:], 1) // LOCAL_WRITE
	if _, err := c.Write(h, command(cmdRegMR, 3, reg, nil)); err != nil {
		return -1, -1, fmt.Errorf("REG_MR: %w", err)
	}
	if binary.LittleEndian.Uint32(resp[4:]) == 0 {
		return -1, -1, fmt.Errorf("REG_MR: no lkey")
	}
	if _, err := c.Write(h, command(cmdCreateCompChannel, 1, withResp(8, resp), nil)); err != nil {
		return -1, -1, fmt.Errorf("CREATE_COMP_CHANNEL: %w", err)
	}
	return asyncFD, int(int32(binary.LittleEndian.Uint32(resp))), nil
}

// serve starts a device without a link serving a socket in a temporary directory.
func serve(t *testing.T) (*Server, *uverbs.Device) {
	t.Helper()
	return serveWith(t, config.Device{Name: "efa_7", VendorPartID: 0xefa1})
}

// serveWith is serve with the device's configuration cfg.
func serveWith(t *testing.T, cfg config.Device) (*Server, *uverbs.Device) {
	t.Helper()
	e, err := engine.NewDevice(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := uverbs.NewDevice(e)
	s, err := Listen(d, filepath.Join(t.TempDir(), "efa_7.sock"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		d.Close()
		e.Close()
	})
	return s, d
}

func status(t testing.TB, path string) string {
	t.Helper()
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	st, err := c.Status()
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A program's opens, its commands' responses and the fds its commands make reach it over the
// socket; closing an open destroys what was made through it.
func TestServeProgram(t *testing.T) {
	s, d := serve(t)
	c, err := Dial(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	info, err := c.Info()
	if err != nil || info.Name != "efa_7" || info.PartID != 0xefa1 || info.GID != d.Engine().GID() {
		t.Fatalf("Info %+v, %v", info, err)
	}
	h, mfd, err := c.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if link, _ := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", mfd)); !strings.HasPrefix(link, "/memfd:softefa-uverbs") {
		t.Fatalf("the open's fd is %q, not the device's memfd", link)
	}
	buf := make([]byte, 3*4096)
	async, channel, err := program(c, h, buf)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range []int{async, channel} {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			t.Fatalf("fd %d the device gave is not a socket here (%v)", fd, err)
		}
		unix.Close(fd)
	}
	if st := status(t, s.Path()); !strings.Contains(st, "programs 1\nopens 1\n") {
		t.Fatalf("status:\n%s", st)
	}
	if _, err := c.Write(h+1, command(cmdAllocPD, 3, withResp(8, buf), nil)); err != unix.EBADF {
		t.Fatalf("a write to an open the program does not have: %v, want EBADF", err)
	}
	if err := c.CloseFile(h); err != nil {
		t.Fatal(err)
	}
	if d.Files() != 0 {
		t.Fatalf("%d opens after the close", d.Files())
	}
}

// TestMain runs TestProgramKilled's program, TestProgramQuota's or TestOtherUserRefused's, when
// the test binary is started as it.
func TestMain(m *testing.M) {
	if path := os.Getenv("HOSTDEV_TEST_SOCKET"); path != "" {
		killedProgram(path)
	}
	if path := os.Getenv("HOSTDEV_TEST_PDS"); path != "" {
		pdProgram(path)
	}
	if path := os.Getenv("HOSTDEV_TEST_OTHER_USER"); path != "" {
		c, err := Dial(path)
		if err == nil {
			_, err = c.Info()
		}
		fmt.Println(err != nil)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// killedProgram opens the device at path, makes a context, a PD, an MR and a channel, says so,
// and waits to be killed.
func killedProgram(path string) {
	c, err := Dial(path)
	if err == nil {
		var h uint32
		if h, _, err = c.Open(); err == nil {
			_, _, err = program(c, h, make([]byte, 4096))
		}
	}
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {}
}

// A program killed with SIGKILL while it has an open: the device releases everything it made.
func TestProgramKilled(t *testing.T) {
	s, d := serve(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HOSTDEV_TEST_SOCKET="+s.Path())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		cmd.Process.Kill()
		t.Fatalf("the child said %q (%v)", line, err)
	}
	if d.Files() != 1 || s.Programs() != 1 {
		t.Fatalf("%d opens of %d programs before the kill, want 1 of 1", d.Files(), s.Programs())
	}
	start := time.Now()
	cmd.Process.Kill()
	if !s.AwaitPrograms(0) || d.Files() != 0 {
		t.Fatalf("%d opens of %d programs after the kill", d.Files(), s.Programs())
	}
	t.Logf("released %v after the kill", time.Since(start))
}

// A connection that sends what no program's side sends (a short message, an unknown operation,
// a message past the limit) is dropped, and releases what it made; the device serves the others.
func TestHostileConnection(t *testing.T) {
	s, d := serve(t)
	good, err := Dial(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	for _, msg := range [][]byte{
		{1, 2, 3},
		request(77, 0, 0),
		request(opWrite, 0, 0, make([]byte, maxMessage)),
	} {
		bad, err := Dial(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := bad.Open(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := bad.c.WriteMsgUnix(msg, nil, nil); err != nil {
			t.Fatal(err)
		}
		// The device hangs up: the next call fails instead of waiting for a reply.
		if _, err := bad.Info(); err == nil {
			t.Errorf("a %d-byte message of op %d: the device still answers", len(msg), msg[0])
		}
		bad.Close()
		if !s.AwaitPrograms(1) || d.Files() != 0 {
			t.Fatalf("%d programs, %d opens after a hostile one went", s.Programs(), d.Files())
		}
		if _, err := good.Info(); err != nil {
			t.Fatalf("the device stopped serving: %v", err)
		}
	}
}

// FuzzDecode: the payload decoders take any bytes without panicking, and what they accept
// encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add((&Info{Name: "efa_0", PartID: 0xefa1}).encode())
	f.Add(append(encodeChardev(uverbs.Chardev{Name: "uverbs0", Major: 231, Minor: 250}), 1, 2, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		var i Info
		if i.decode(b) == nil && string(i.encode()) != string(b) {
			t.Fatalf("Info %+v encodes to % x, decoded from % x", i, i.encode(), b)
		}
		if ch, rest, ok := decodeChardev(b); ok && string(append(encodeChardev(ch), rest...)) != string(b) {
			t.Fatalf("chardev %+v and % x from % x", ch, rest, b)
		}
	})
}

// Handles name objects of the open they were made through only: a program that names another's
// PD or MR is refused, and the other's objects stay.
func TestProgramsIsolated(t *testing.T) {
	s, _ := serve(t)
	var cs [2]*Client
	var hs [2]uint32
	for i := range cs {
		c, err := Dial(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if hs[i], _, err = c.Open(); err != nil {
			t.Fatal(err)
		}
		cs[i] = c
	}
	buf := make([]byte, 4096)
	resp := make([]byte, 64)
	if _, _, err := program(cs[0], hs[0], buf); err != nil { // PD 0 and MR 1 in the first open
		t.Fatal(err)
	}
	drv := binary.LittleEndian.AppendUint32(make([]byte, 0, 8), 3)
	if _, err := cs[1].Write(hs[1], command(cmdGetContext, (8+24)/4, withResp(8, resp), append(drv, 0, 0, 0, 0))); err != nil {
		t.Fatal(err)
	}
	unix.Close(int(int32(binary.LittleEndian.Uint32(resp))))
	reg := withResp(40, resp)
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
	binary.LittleEndian.PutUint64(reg[8:], addr)
	binary.LittleEndian.PutUint64(reg[16:], 4096)
	binary.LittleEndian.PutUint64(reg[24:], addr)
	// (pd handle 0: the first program's PD)
	if _, err := cs[1].Write(hs[1], command(cmdRegMR, 3, reg, nil)); err != unix.EINVAL {
		t.Fatalf("REG_MR in another program's PD: %v, want EINVAL", err)
	}
	dereg := binary.LittleEndian.AppendUint32(nil, 1) // the first program's MR
	const cmdDeregMR = 13
	if _, err := cs[1].Write(hs[1], command(cmdDeregMR, 0, dereg, nil)); err != unix.EINVAL {
		t.Fatalf("DEREG_MR of another program's MR: %v, want EINVAL", err)
	}
	if _, err := cs[0].Write(hs[0], command(cmdDeregMR, 0, dereg, nil)); err != nil {
		t.Fatalf("the owner's DEREG_MR: %v", err)
	}
}

func encodeChardev(ch uverbs.Chardev) []byte {
	b := binary.LittleEndian.AppendUint32(nil, ch.Major)
	b = binary.LittleEndian.AppendUint32(b, ch.Minor)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(ch.Name)))
	return append(b, ch.Name...)
}

// A doorbell kick that comes while a command waits for the program to take an fd is carried out
// after the command (it takes the File's lock the command holds): before, the device's goroutine
// for the program waited on itself for ever.
func TestKickDuringGive(t *testing.T) {
	s, _ := serve(t)
	c, h := dialOpen(t, s)
	resp := make([]byte, 64)
	drv := binary.LittleEndian.AppendUint32(make([]byte, 0, 8), 3)
	cmd := command(cmdGetContext, (8+24)/4, withResp(8, resp), append(drv, 0, 0, 0, 0))
	if _, _, err := c.c.WriteMsgUnix(request(opWrite, h, 0, cmd), nil, nil); err != nil {
		t.Fatal(err)
	}
	c.c.SetReadDeadline(time.Now().Add(time.Minute)) // (a hang guard: the device answers at once)
	n, oobn, _, _, err := c.c.ReadMsgUnix(c.buf, c.oob)
	if err != nil || n != replyHeader || binary.LittleEndian.Uint32(c.buf) != opGive {
		t.Fatalf("want a give: %d bytes, %v", n, err)
	}
	fd, err := rightsFD(c.oob[:oobn])
	if err != nil || fd < 0 {
		t.Fatalf("the give carried no fd: %v", err)
	}
	defer unix.Close(fd)
	if _, _, err := c.c.WriteMsgUnix(request(opKick, h, 0), nil, nil); err != nil { // (QP handle 0: none)
		t.Fatal(err)
	}
	if _, _, err := c.c.WriteMsgUnix(reply(opGive, int64(fd), nil), nil, nil); err != nil {
		t.Fatal(err)
	}
	n, _, _, _, err = c.c.ReadMsgUnix(c.buf, nil)
	if err != nil {
		t.Fatalf("no reply to the command: %v", err)
	}
	if st := int64(binary.LittleEndian.Uint64(c.buf[8:])); n != replyHeader || st != int64(len(cmd)) {
		t.Fatalf("the command's reply: %d bytes, status %d", n, st)
	}
	if got := int(int32(binary.LittleEndian.Uint32(resp))); got != fd {
		t.Fatalf("the response names fd %d, want the program's %d", got, fd)
	}
}

// A process of another user than the device's is refused, though it reaches the socket: the
// device would reach its memory, and write into what it execs, with the device's rights.
func TestOtherUserRefused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	s, _ := serve(t)
	if err := os.Chmod(filepath.Dir(s.Path()), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(s.Path(), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(filepath.Dir(s.Path())), 0o755); err != nil { // (t.TempDir's parent)
		t.Fatal(err)
	}
	exe, err := os.ReadFile(os.Args[0]) // a copy the other user can run (go test's directory is not theirs)
	if err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(filepath.Dir(s.Path()), "program")
	if err := os.WriteFile(prog, exe, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(prog, "-test.run=^$")
	cmd.Env = append(os.Environ(), "HOSTDEV_TEST_OTHER_USER="+s.Path())
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "true" {
		t.Fatalf("another user's program: refused %q (%v)", out, err)
	}
	if s.AwaitPrograms(0); s.Programs() != 0 {
		t.Fatalf("%d programs connected", s.Programs())
	}
}

// The doorbell socket (docs/architecture.md, "Doorbells on the host device"): one per program;
// a kick the program waits for is answered with its number, one it does not wait for (its QP not
// lingering) is not; anything but a kick on it drops the program.
func TestDoorbellSocket(t *testing.T) {
	s, d := serve(t)
	c, h := dialOpen(t, s)
	st, _, fd, err := c.call(request(opDoorbell, 0, 0))
	if err != nil || st != 0 || fd < 0 {
		t.Fatalf("opDoorbell: status %d, fd %d, %v", st, fd, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil { // (pollable: the read deadline below holds)
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "door")
	defer f.Close()
	if st, _, fd2, err := c.call(request(opDoorbell, 0, 0)); err != nil || st != -int64(syscall.EEXIST) || fd2 >= 0 {
		t.Fatalf("a second opDoorbell: status %d, fd %d, %v; want EEXIST", st, fd2, err)
	}
	kick := func(qp uint32, wait bool, n uint64) {
		arg := uint64(qp) | n<<33
		if wait {
			arg |= 1 << 32
		}
		if _, err := f.Write(request(opKick, h, arg)); err != nil {
			t.Fatal(err)
		}
	}
	kick(5, false, 1) // (QP handle 5: none; nothing to linger on)
	kick(5, true, 2)
	b := make([]byte, 64)
	f.SetReadDeadline(time.Now().Add(time.Minute)) // (a hang guard: the device answers at once)
	n, err := f.Read(b)
	if err != nil || n != replyHeader {
		t.Fatalf("the answer: %d bytes, %v", n, err)
	}
	if op, qp, st := binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), binary.LittleEndian.Uint64(b[8:]); op != opKick || qp != 5 || st != 2 {
		t.Fatalf("the answer: op %d, QP %d, status %#x; want the waited kick's: op %d, QP 5, status 2", op, qp, st, opKick)
	}
	if _, err := f.Write(request(opArm, h, 0)); err != nil {
		t.Fatal(err)
	}
	// The device hangs up: the doorbell socket ends (closed as the program is released), and the
	// main connection no longer answers.
	if n, err := f.Read(b); err == nil {
		t.Fatalf("the doorbell socket answered %d bytes to an arm", n)
	}
	if _, err := c.Info(); err == nil {
		t.Error("the device still answers a program that sent an arm on its doorbell socket")
	}
	if !s.AwaitPrograms(0) || d.Files() != 0 {
		t.Fatalf("%d programs, %d opens after the program was dropped", s.Programs(), d.Files())
	}
}

// The socket goes only into a directory no other user can change: one writable by others (not
// sticky) or belonging to another user is refused with EPERM, since its owner could put a socket
// of their own device in the socket's place; a sticky one (as /tmp) is taken.
func TestSocketDirChecked(t *testing.T) {
	e, err := engine.NewDevice(config.Device{Name: "efa_7", VendorPartID: 0xefa1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	d := uverbs.NewDevice(e)
	defer d.Close()
	dir := t.TempDir()
	listen := func(mode os.FileMode) error {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		s, err := Listen(d, filepath.Join(dir, "efa_7.sock"))
		if err == nil {
			s.Close()
		}
		return err
	}
	if err := listen(0o777); !errors.Is(err, syscall.EPERM) {
		t.Errorf("a directory writable by all: %v, want EPERM", err)
	}
	if err := listen(0o777 | os.ModeSticky); err != nil {
		t.Errorf("a sticky directory writable by all: %v", err)
	}
	if err := listen(0o700); err != nil {
		t.Errorf("a directory of this user's: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the directory to another user") // (CI runs as root)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := listen(0o755); !errors.Is(err, syscall.EPERM) {
		t.Errorf("a directory of another user's: %v, want EPERM", err)
	}
}

// An fd the device gives during a command that then fails (here CREATE_COMP_CHANNEL whose
// response address is unmapped) is closed by the program's side: the response that would name it
// never reaches the program, which could not know to close it.
func TestGivenFDOfFailedCommand(t *testing.T) {
	s, _ := serve(t)
	c, err := Dial(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h, err := openContext(c)
	if err != nil {
		t.Fatal(err)
	}
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	bad := make([]byte, 8)
	binary.LittleEndian.PutUint64(bad, 8) // (page 0: never mapped)
	if _, err := c.Write(h, command(cmdCreateCompChannel, 1, bad, nil)); !errors.Is(err, syscall.EFAULT) {
		t.Fatalf("CREATE_COMP_CHANNEL with its response at address 8: %v, want EFAULT", err)
	}
	if after := fds(); after != before {
		t.Errorf("%d fds open after the failed command, %d before", after, before)
	}
}

// dialOpen connects to s (closed when the test ends) and opens the device once; its memfd is
// closed.
func dialOpen(t *testing.T, s *Server) (*Client, uint32) {
	t.Helper()
	c, err := Dial(s.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	h, mfd, err := c.Open()
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(mfd)
	return c, h
}

// openContext opens the device and makes a context (its async fd closed); it returns the open.
func openContext(c *Client) (uint32, error) {
	h, mfd, err := c.Open()
	if err != nil {
		return 0, err
	}
	unix.Close(mfd)
	resp := make([]byte, 64)
	drv := binary.LittleEndian.AppendUint32(make([]byte, 0, 8), 3)
	if _, err := c.Write(h, command(cmdGetContext, (8+24)/4, withResp(8, resp), append(drv, 0, 0, 0, 0))); err != nil {
		return 0, err
	}
	unix.Close(int(int32(binary.LittleEndian.Uint32(resp)))) // (the async fd)
	return h, nil
}

func allocPD(c *Client, h uint32) error {
	resp := make([]byte, 64)
	_, err := c.Write(h, command(cmdAllocPD, (4+8)/4, withResp(8, resp), nil))
	return err
}

// pdProgram is TestProgramQuota's other program: it makes PDs on the device at path until one
// fails, and prints how many it made and the error.
func pdProgram(path string) {
	c, err := Dial(path)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	h, err := openContext(c)
	n := 0
	for err == nil {
		if err = allocPD(c, h); err == nil {
			n++
		}
	}
	fmt.Println(n, errors.Is(err, syscall.ENOMEM))
	os.Exit(0)
}

// A program (a process) holds at most its share of each of the device's maxima over all its
// opens and connections (here 2 of 8 PDs): past it, ENOMEM, while another process still gets its
// own; what a closed open held no longer counts. A process's opens at once are bounded too
// (EMFILE past maxOpens), and so are its connections (maxConns).
func TestProgramQuota(t *testing.T) {
	s, _ := serveWith(t, config.Device{Name: "efa_7", VendorPartID: 0xefa1, MaxPD: 8})
	dial := func() *Client {
		c, err := Dial(s.Path())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := dial(), dial() // (two connections of this process: one program)
	a1, err := openContext(a)
	if err != nil {
		t.Fatal(err)
	}
	b1, err := openContext(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := allocPD(a, a1); err != nil {
			t.Fatalf("PD %d of the program's 2: %v", i, err)
		}
	}
	if err := allocPD(b, b1); !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("a third PD, through the program's second connection: %v, want ENOMEM", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "HOSTDEV_TEST_PDS="+s.Path())
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil || string(out) != "2 true\n" {
		t.Fatalf("another process made PDs: %q (%v), want 2 and then ENOMEM", out, err)
	}
	if err := a.CloseFile(a1); err != nil {
		t.Fatal(err)
	}
	if err := allocPD(b, b1); err != nil {
		t.Fatalf("a PD after the open holding two was closed: %v", err)
	}

	c := dial()
	for i := 1; i < maxOpens; i++ { // (b1 is the process's first open)
		if _, mfd, err := c.Open(); err != nil {
			t.Fatalf("open %d: %v", i+1, err)
		} else {
			unix.Close(mfd)
		}
	}
	if _, _, err := c.Open(); !errors.Is(err, syscall.EMFILE) {
		t.Fatalf("open %d: %v, want EMFILE", maxOpens+1, err)
	}
	for i := 3; i < maxConns; i++ {
		if _, err := dial().Info(); err != nil { // (served: counted before the next connects)
			t.Fatalf("connection %d: %v", i+1, err)
		}
	}
	extra := dial() // (the kernel accepts it; the device hangs up)
	if _, err := extra.Info(); err == nil {
		t.Errorf("connection %d of one process was served", maxConns+1)
	}
}
