# ioctlprobe.py LIBDIR: calls the verbs of rdma-core >= 61 that exist only as ioctl methods, with
# the libibverbs in LIBDIR (ctypes, no pyverbs): ibv_query_port_speed on ports 1 and 2, and
# ibv_reg_dmabuf_mr with descriptor -1 (as UCX probes dma-buf support), with REMOTE_ATOMIC among
# the access flags, and with an open descriptor that is not a dma-buf (stdin). Prints one line
# each: the return value or errno's name.
import ctypes
import errno
import os
import sys

lib = ctypes.CDLL(os.path.join(sys.argv[1], "libibverbs.so.1"), use_errno=True)
lib.ibv_get_device_list.restype = ctypes.POINTER(ctypes.c_void_p)
lib.ibv_get_device_list.argtypes = [ctypes.POINTER(ctypes.c_int)]
lib.ibv_open_device.restype = ctypes.c_void_p
lib.ibv_open_device.argtypes = [ctypes.c_void_p]
lib.ibv_alloc_pd.restype = ctypes.c_void_p
lib.ibv_alloc_pd.argtypes = [ctypes.c_void_p]
lib.ibv_reg_dmabuf_mr.restype = ctypes.c_void_p
lib.ibv_reg_dmabuf_mr.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t,
                                  ctypes.c_uint64, ctypes.c_int, ctypes.c_int]
lib.ibv_query_port_speed.argtypes = [ctypes.c_void_p, ctypes.c_uint32,
                                     ctypes.POINTER(ctypes.c_uint64)]

def errname(e):
    return "EOPNOTSUPP" if e == errno.EOPNOTSUPP else errno.errorcode[e]  # ENOTSUP on Linux too


n = ctypes.c_int()
devs = lib.ibv_get_device_list(ctypes.byref(n))
if n.value < 1:
    sys.exit("no device")
ctx = lib.ibv_open_device(devs[0])
pd = lib.ibv_alloc_pd(ctx)
if not ctx or not pd:
    sys.exit("cannot open the device")

speed = ctypes.c_uint64()
for port in (1, 2):
    ret = lib.ibv_query_port_speed(ctx, port, ctypes.byref(speed))
    print("port_speed port %d: %s" % (port, speed.value if ret == 0 else errname(ret)))

LOCAL_WRITE, REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC = 1, 2, 4, 8
for name, fd, access in (("fd -1", -1, LOCAL_WRITE),
                         ("fd -1 atomic", -1, LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC),
                         ("stdin", 0, LOCAL_WRITE)):
    ctypes.set_errno(0)
    mr = lib.ibv_reg_dmabuf_mr(pd, 0, 4096, 0, fd, access)
    print("reg_dmabuf_mr %s: %s" % (name, "registered" if mr else errname(ctypes.get_errno())))
