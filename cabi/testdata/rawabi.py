# Speaks the uverbs write ABI to the device node directly, through the preload shim: stat, a
# NETLINK_RDMA socket answering RDMA_NLDEV_CMD_SYS_GET, GET_CONTEXT on the fd, QUERY_DEVICE on a
# dup of it after the original is closed, an ioctl method softefa leaves to write(2) answered
# EPROTONOSUPPORT and another ioctl ENOTTY, a forked child refused (its NETLINK_RDMA socket too),
# then close. Prints "ok" on success.
import ctypes, errno, fcntl, os, struct, sys

import socket

# The node's path, from the program's file softefa run writes (docs/settings.md).
conf = dict(line.split("=", 1) for line in open(os.environ["SOFTEFA_CONF"]).read().splitlines() if line)
path = conf["dev-path"]
assert (os.stat(path).st_mode & 0o170000) == 0o020000, "stat: not a character device"
nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 20)  # NETLINK_RDMA
nl.bind((0, 0))
assert nl.getsockname()[0] == os.getpid(), nl.getsockname()
# RDMA_NLDEV_CMD_SYS_GET (client 5, command 6), NLM_F_REQUEST|NLM_F_ACK, seq 7.
nl.sendto(struct.pack("<IHHII", 16, 5 << 10 | 6, 1 | 4, 7, 0), (0, 0))
reply, sender = nl.recvfrom(4096)
assert sender == (0, 0), sender
length, typ, flags, seq, port = struct.unpack_from("<IHHII", reply)
assert (length, typ, seq, port) == (len(reply), 5 << 10 | 6, 7, os.getpid()), (length, typ, seq, port)
attrs, off = {}, 16
while off + 4 <= len(reply):
    alen, atype = struct.unpack_from("<HH", reply, off)
    attrs[atype] = reply[off + 4:off + alen]
    off += (alen + 3) & ~3
assert attrs.get(93) == b"\x01", attrs  # RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK
ack, _ = nl.recvfrom(4096)
assert struct.unpack_from("<H", ack, 4)[0] == 2 and struct.unpack_from("<i", ack, 16)[0] == 0, ack  # NLMSG_ERROR of 0: the ACK
nl.close()
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
assert vectors == len(os.sched_getaffinity(0)), vectors  # one completion vector per CPU, as EFA's driver

fd2 = os.dup(fd)
os.close(fd)
os.write(fd2, cmd(1, 4, 44, struct.pack("<Q", addr)))
vendor = struct.unpack_from("<I", resp.raw, 40)[0]
assert vendor == 0x1D0F, hex(vendor)

try:  # RDMA_VERBS_IOCTL: UVERBS_OBJECT_DEVICE's INVOKE_WRITE, which libibverbs then does by write(2)
    fcntl.ioctl(fd2, 0xC0181B01, struct.pack("<HHHHQII", 24, 0, 1, 0, 0, 0, 0))
    sys.exit("ioctl INVOKE_WRITE succeeded")
except OSError as e:
    assert e.errno == errno.EPROTONOSUPPORT, e
try:
    fcntl.ioctl(fd2, 0x5401, b"\0" * 64)  # TCGETS
    sys.exit("ioctl TCGETS succeeded")
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
    try:
        socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 20)
        code = code or 5
    except OSError as e:
        code = code or (0 if e.errno == errno.EPROTONOSUPPORT else 6)
    os.close(fd2)
    os._exit(code)
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
os.write(fd2, cmd(1, 4, 44, struct.pack("<Q", addr)))

os.close(fd2)
os.close(async_fd)
print("ok")
