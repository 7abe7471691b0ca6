# paths.py: the device's paths through Python's os module (docs/cabi.md, "Paths"), one line per
# look, "name: result", for TestPaths.
import os
import stat

DEV = "/dev/infiniband/uverbs_softefa0"
IB = "/sys/class/infiniband/efa_0"


def line(name, f):
    try:
        r = f()
    except OSError as e:
        r = "%s: %s" % (type(e).__name__, e.strerror)
    print("%s: %s" % (name, r))


def read(p):
    with open(p) as f:
        return f.read().strip()


st = os.stat(DEV)
line("os.stat dev", lambda: "chr %d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev)) if stat.S_ISCHR(st.st_mode) else "not chr")
line("os.path.exists dev", lambda: os.path.exists(DEV))
line("os.access dev", lambda: os.access(DEV, os.R_OK | os.W_OK))
line("os.access effective", lambda: os.access(IB + "/device/vendor", os.R_OK, effective_ids=True))
line("os.lstat ibdev", lambda: stat.S_ISLNK(os.lstat(IB).st_mode))
line("os.path.isdir ibdev", lambda: os.path.isdir(IB))
line("os.listdir class", lambda: sorted(os.listdir("/sys/class/infiniband")))
line("os.listdir dev", lambda: sorted(os.listdir("/dev/infiniband")))
line("os.scandir dev", lambda: [(e.name, stat.S_ISCHR(e.stat().st_mode)) for e in os.scandir("/dev/infiniband")])
line("os.scandir hw_counters", lambda: "tx_bytes" in [e.name for e in os.scandir(IB + "/ports/1/hw_counters")])
fd = os.open("/sys/class/infiniband", os.O_RDONLY | os.O_DIRECTORY)
line("os.listdir fd", lambda: sorted(os.listdir(fd)))
line("os.stat dir_fd", lambda: stat.S_ISREG(os.stat("efa_0/device/numa_node", dir_fd=fd).st_mode))
line("os.readlink", lambda: os.readlink(IB))
line("os.readlink device", lambda: os.readlink(IB + "/device"))
line("os.path.realpath", lambda: os.path.realpath(IB + "/device"))
line("os.path.realpath driver", lambda: os.path.realpath(IB + "/device/driver"))
line("open vendor", lambda: read(IB + "/device/vendor"))
line("open gid type", lambda: read(IB + "/ports/1/gid_attrs/types/0"))
line("os.walk", lambda: sorted(f for _, _, fs in os.walk("/sys/class/infiniband/efa_0/ports/1/gid_attrs") for f in fs))
