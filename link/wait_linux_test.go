package link

import (
	"fmt"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// WaitReadable returns once socket 0 holds datagrams, reading none (TryReceive then takes them),
// and with ErrClosed once the link is closed, also when it was waiting.
func TestUDPWaitReadable(t *testing.T) {
	a, b := udpPair(t)
	woke := make(chan error, 1)
	go func() { woke <- b.WaitReadable() }()
	if err := a.Send([]Packet{{Buf: []byte("hello"), N: 5, Addr: b.LocalAddr()}}); err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	var err error
	pkts := []Packet{{Buf: make([]byte, 2048)}}
	for n := 0; n == 0; { // (a wake-up may come before the datagram: the socket "may" hold one)
		if n, err = b.TryReceive(pkts); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			if err := b.WaitReadable(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if string(pkts[0].Buf[:pkts[0].N]) != "hello" {
		t.Fatalf("received %q", pkts[0].Buf[:pkts[0].N])
	}
	go func() { woke <- b.WaitReadable() }()
	b.Close()
	if err := <-woke; err != ErrClosed {
		t.Fatalf("WaitReadable on a closed link: %v, want ErrClosed", err)
	}
	if err := b.WaitReadable(); err != ErrClosed {
		t.Fatalf("WaitReadable after Close: %v, want ErrClosed", err)
	}
}

// WaitReadable runs at every idle transition of a receive loop: it allocates nothing.
func TestUDPWaitReadableAllocs(t *testing.T) {
	a, b := udpPair(t)
	defer b.Close()
	if err := a.Send([]Packet{{Buf: []byte("x"), N: 1, Addr: b.LocalAddr()}}); err != nil {
		t.Fatal(err)
	}
	if err := b.WaitReadable(); err != nil { // the datagram is queued: each wait returns at once
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = b.WaitReadable() }); n != 0 {
		t.Fatalf("WaitReadable: %v allocations, want 0", n)
	}
}

// udpPair binds two one-path links on 127.0.0.1; a is closed when the test ends, b is the
// caller's.
func udpPair(t *testing.T) (a, b *UDP) {
	t.Helper()
	lo := netip.MustParseAddrPort("127.0.0.1:0")
	a, err := ListenUDP(lo, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	if b, err = ListenUDP(lo, 1); err != nil {
		t.Fatal(err)
	}
	return a, b
}

// A link holds one descriptor per path, its sockets: the epoll instance receives wait through
// is the process's (waitHub), and Close ends waits without one of its own. The many-peers bench
// opens 10,000 one-path devices in one process; with an epoll instance and an eventfd beside
// each socket it ran out of open files at 6,661 under a limit of 20,000. Close gives them back.
func TestUDPDescriptors(t *testing.T) {
	if _, b := udpPair(t); b.Close() != nil { // (the process's epoll instance is made)
		t.Fatal("Close failed")
	}
	count := func() int {
		fds, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(fds)
	}
	before := count()
	u, err := ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"), 4)
	if err != nil {
		t.Fatal(err)
	}
	if n := count() - before; n != 4 {
		t.Errorf("a 4-path link holds %d descriptors, want 4", n)
	}
	u.Close()
	if n := count() - before; n != 0 {
		t.Errorf("%d descriptors left after Close", n)
	}
}

// Close ends a wait in poll(2) on a socket (as a send that finds the socket's buffer full waits:
// waitWritable) by shutting the socket down, which the poll sees as a hang-up (POLLHUP): Close
// returns once the waiting call has let go.
func TestCloseEndsAPoll(t *testing.T) {
	_, b := udpPair(t)
	if !b.hold() {
		t.Fatal("a new link is closed")
	}
	polled := make(chan error, 1)
	go func() {
		defer b.release()
		fds := []unix.PollFd{{Fd: int32(b.socks[0].fd)}} // no event asked for: only a hang-up or an error ends it
		_, err := unix.Poll(fds, -1)
		if err == nil && fds[0].Revents&unix.POLLHUP == 0 {
			err = fmt.Errorf("poll ended with events %#x, want POLLHUP", fds[0].Revents)
		}
		polled <- err
	}()
	closed := make(chan struct{})
	go func() { b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second): // (a guard: without the shutdown, Close waits for good)
		t.Fatal("Close did not end a poll on its socket within 10 s")
	}
	if err := <-polled; err != nil {
		t.Fatal(err)
	}
}

// A process that could not make the epoll instance once (out of descriptors) makes it for the
// next link: the failure is that link's, not the process's for good.
func TestWaitHubStartsAfterAFailure(t *testing.T) {
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	_, b := udpPair(t)
	defer b.Close()
	var h waitHub
	low := lim
	low.Cur = 3 // below the descriptors open: no new one
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	_, err := h.add(b.socks[0].fd)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if err == nil {
		t.Fatal("the epoll instance was made with no descriptor to spare")
	}
	w, err := h.add(b.socks[0].fd)
	if err != nil || w == nil {
		t.Fatalf("after the limit was back: %v", err)
	}
	h.remove(w)
}
