//go:build linux

package hostdev

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Client is a connection to the host device from Go: softefa device status and stop, softefa
// run (the device's identity), the tests. Programs connect through the preload shim's own
// client, in C (cabi/shim/hostdev.c). Calls are carried out one at a time.
type Client struct {
	c   *net.UnixConn
	mu  sync.Mutex // one call at a time: its reply is the next message but fds given
	buf []byte
	oob []byte
}

// Dial connects to the device serving the socket at path.
func Dial(path string) (*Client, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("hostdev: no device at %s: %w", path, err)
	}
	if cred, err := peerCred(c); err != nil || cred.Uid != 0 && int(cred.Uid) != os.Geteuid() {
		c.Close()
		if err == nil {
			err = fmt.Errorf("hostdev: the device at %s runs as uid %d, neither this user nor root: %w", path, cred.Uid, syscall.EPERM)
		}
		return nil, err
	}
	return &Client{c: c, buf: make([]byte, maxMessage), oob: make([]byte, unix.CmsgSpace(4))}, nil
}

// Close disconnects: the device releases everything the program made through this client.
func (c *Client) Close() error { return c.c.Close() }

// call sends a request and returns the reply's status, its payload (valid until the next call)
// and the fd attached to it, or -1. fds the device gives meanwhile are taken and their numbers
// answered.
func (c *Client) call(req []byte) (status int64, payload []byte, fd int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, _, err := c.c.WriteMsgUnix(req, nil, nil); err != nil {
		return 0, nil, -1, err
	}
	// The fds given during the command: closed if it fails, since its response names them.
	var given []int
	defer func() {
		if status < 0 || err != nil {
			for _, fd := range given {
				unix.Close(fd)
			}
		}
	}()
	for {
		n, oobn, flags, _, err := c.c.ReadMsgUnix(c.buf, c.oob)
		if err != nil {
			return 0, nil, -1, err
		}
		if n < replyHeader || flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			return 0, nil, -1, fmt.Errorf("hostdev: a reply of %d bytes: %w", n, syscall.EPROTO)
		}
		fd, err := rightsFD(c.oob[:oobn])
		if err != nil {
			return 0, nil, -1, err
		}
		op, st := binary.LittleEndian.Uint32(c.buf), int64(binary.LittleEndian.Uint64(c.buf[8:]))
		if op == opGive {
			if fd >= 0 {
				given = append(given, fd)
			}
			v := int64(fd)
			if fd < 0 {
				v = -int64(syscall.EPROTO)
			}
			if _, _, err := c.c.WriteMsgUnix(reply(opGive, v, nil), nil, nil); err != nil {
				return 0, nil, -1, err
			}
			continue
		}
		if op != binary.LittleEndian.Uint32(req) {
			if fd >= 0 {
				unix.Close(fd)
			}
			return 0, nil, -1, fmt.Errorf("hostdev: a reply to op %d for op %d: %w", op, binary.LittleEndian.Uint32(req), syscall.EPROTO)
		}
		return st, c.buf[replyHeader:n], fd, nil
	}
}

// rightsFD returns the fd an SCM_RIGHTS message carries, or -1.
func rightsFD(oob []byte) (int, error) {
	if len(oob) == 0 {
		return -1, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil || len(msgs) != 1 {
		return -1, fmt.Errorf("hostdev: control message: %w", syscall.EPROTO)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("hostdev: control message: %w", syscall.EPROTO)
	}
	return fds[0], nil
}

func statusErr(status int64) error {
	if status < 0 {
		return syscall.Errno(-status)
	}
	return nil
}

// Open opens the device node: the open's handle and its memfd (close-on-exec), whose offsets
// are the mmap keys of its rings.
func (c *Client) Open() (uint32, int, error) {
	status, _, fd, err := c.call(request(opOpen, 0, 0))
	if err == nil {
		err = statusErr(status)
	}
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return 0, -1, err
	}
	if fd < 0 {
		return 0, -1, fmt.Errorf("hostdev: an open without its memfd: %w", syscall.EPROTO)
	}
	return uint32(status), fd, nil
}

// Write is a write() of a uverbs command on open h: the bytes taken or the errno.
func (c *Client) Write(h uint32, b []byte) (int, error) {
	if len(b) > maxMessage-reqHeader {
		return 0, syscall.EINVAL
	}
	status, _, _, err := c.call(request(opWrite, h, 0, b))
	if err != nil {
		return 0, err
	}
	if err := statusErr(status); err != nil {
		return 0, err
	}
	return int(status), nil
}

// CloseFile closes open h: the device destroys everything made through it.
func (c *Client) CloseFile(h uint32) error {
	status, _, _, err := c.call(request(opClose, h, 0))
	if err != nil {
		return err
	}
	return statusErr(status)
}

// Info returns the device's identity.
func (c *Client) Info() (Info, error) {
	var i Info
	status, p, _, err := c.call(request(opInfo, 0, 0))
	if err == nil {
		err = statusErr(status)
	}
	if err == nil {
		err = i.decode(p)
	}
	return i, err
}

// Status returns the device's status text (programs connected, port counters).
func (c *Client) Status() (string, error) {
	status, p, _, err := c.call(request(opStatus, 0, 0))
	if err == nil {
		err = statusErr(status)
	}
	return string(p), err
}

// Stop asks the device to stop.
func (c *Client) Stop() error {
	status, _, _, err := c.call(request(opStop, 0, 0))
	if err == nil {
		err = statusErr(status)
	}
	return err
}

// CheckDir reports whether dir is fit to hold the device's socket: owned by this user or root, and
// writable by no one else unless sticky (as /tmp: no one else can remove or rename what is in it).
// Otherwise another user could replace the socket with one of their own device
// (docs/security.md, "The host device").
func CheckDir(dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("hostdev: %s: %w", dir, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("hostdev: %s is not a directory: %w", dir, syscall.ENOTDIR)
	case st.Uid != 0 && int(st.Uid) != os.Geteuid():
		return fmt.Errorf("hostdev: %s belongs to uid %d, neither this user nor root: %w", dir, st.Uid, syscall.EPERM)
	case st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0:
		return fmt.Errorf("hostdev: %s is writable by other users: %w", dir, syscall.EPERM)
	}
	return nil
}

// DefaultSocket is where the host's device called name listens: /run/softefa for root,
// $XDG_RUNTIME_DIR/softefa or /tmp/softefa-UID for others.
func DefaultSocket(name string) string {
	dir := "/run/softefa"
	if uid := os.Getuid(); uid != 0 {
		if x := os.Getenv("XDG_RUNTIME_DIR"); x != "" {
			dir = filepath.Join(x, "softefa")
		} else {
			dir = fmt.Sprintf("/tmp/softefa-%d", uid)
		}
	}
	return filepath.Join(dir, name+".sock")
}
