# Speaks the uverbs write ABI to the device node directly, through the preload shim: stat, a
# NETLINK_RDMA socket refused with EPROTONOSUPPORT, GET_CONTEXT
# on the fd, QUERY_DEVICE on a dup of it after the original is closed, ioctl refused with ENOTTY,
# a forked child refused, then close. Prints "ok" on success.
import ctypes, errno, fcntl, os, struct, sys

import socket

path = os.environ["SOFTEFA_DEV_PATH"]
assert (os.stat(path).st_mode & 0o170000) == 0o020000, "stat: not a character device"
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 20)  # NETLINK_RDMA
    sys.exit("a NETLINK_RDMA socket was created")
except OSError as e:
    assert e.errno == errno.EPROTONOSUPPORT, e
fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
st = os.fstat(fd)
assert (st.st_mode & 0o170000) == 0o020000, "fstat: not a character device"

resp = ctypes.create_string_buffer(256)
addr = ctypes.addressof(resp)

def cmd(command, in_words, out_words, body):
    return struct.pack("<IHH", command, in_words, out_words) + body

# GET_CONTEXT: response pointer, EFA driver data acknowledging TX batching and min SQ WR.
os.write(fd, cmd(0, 6, 8, struct.pack("<QII", addr, 3, 0)))
async_fd, vectors = struct.unpack_from("<II", resp.raw)
assert vectors == 1, vectors

fd2 = os.dup(fd)
os.close(fd)
os.write(fd2, cmd(1, 4, 44, struct.pack("<Q", addr)))
vendor = struct.unpack_from("<I", resp.raw, 40)[0]
assert vendor == 0x1D0F, hex(vendor)

try:
    fcntl.ioctl(fd2, 0xC0181B01, b"\0" * 24)
    sys.exit("ioctl succeeded")
except OSError as e:
    assert e.errno == errno.ENOTTY, e

try:
    os.write(fd2, cmd(0, 6, 8, struct.pack("<QII", addr, 3, 0)))
    sys.exit("a second GET_CONTEXT succeeded")
except OSError as e:
    assert e.errno == errno.EINVAL, e
# A forked child cannot use the parent's engine: its write fails with EIO and a new open with
# ENODEV, without hanging; the parent carries on.
pid = os.fork()
if pid == 0:
    code = 0
    try:
        os.write(fd2, cmd(1, 4, 44, struct.pack("<Q", addr)))
        code = 1
    except OSError as e:
        code = 0 if e.errno == errno.EIO else 2
    try:
        os.open(path, os.O_RDWR)
        code = code or 3
    except OSError as e:
        code = code or (0 if e.errno == errno.ENODEV else 4)
    os.close(fd2)
    os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
os.write(fd2, cmd(1, 4, 44, struct.pack("<Q", addr)))

os.close(fd2)
os.close(async_fd)
print("ok")
