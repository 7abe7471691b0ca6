# A program's registered buffer that it has since made invalid: a UD QP sends to itself from a
# region of three mmap'ed pages registered with ibv_reg_mr, whose second page is then protected
# (PROT_NONE) and whose third is unmapped. A SEND from either page must complete with an error
# (IBV_WC_LOC_PROT_ERR, EFA status LOCAL_ERROR_INVALID_LKEY = 5), a receive buffer in the protected
# page likewise, and the process must carry on: a SEND from the first page is then received with
# its bytes. Prints one line per completion checked, then "ok".
import ctypes, mmap, os, sys, time

import pyverbs.enums as e
from pyverbs.addr import AH, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

EFA_LOCAL_ERROR_INVALID_LKEY = 5
QKEY = 0x11111111
GRH = 40
MSG = 64
PROT_NONE = 0

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def check(ok, what):
    if not ok:
        raise OSError(ctypes.get_errno(), what + ": " + os.strerror(ctypes.get_errno()))


def mapped(addr, page):
    # mincore fails with ENOMEM on an unmapped page, whatever its protection.
    return libc.mincore(addr, page, ctypes.create_string_buffer(1)) == 0


ctx = Context(name=sys.argv[1])
pd = PD(ctx)
cq = CQ(ctx, 16)
qp_attr = QPAttr(port_num=1)
qp_attr.qkey = QKEY
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_UD, scq=cq, rcq=cq,
                       cap=QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1, max_recv_sge=1)),
        qp_attr)
gid = ctx.query_gid(1, 0)
ah = AH(pd, attr=AHAttr(gr=GlobalRoute(dgid=gid, sgid_index=0), is_global=1, port_num=1))

page = mmap.PAGESIZE
base = libc.mmap(None, 3 * page, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
check(base not in (None, ctypes.c_void_p(-1).value), "mmap")
ctypes.memset(base, 0x5A, 3 * page)
buf = MR(pd, 3 * page, e.IBV_ACCESS_LOCAL_WRITE, address=base)
rbuf = MR(pd, page, e.IBV_ACCESS_LOCAL_WRITE)
protected, unmapped = base + page, base + 2 * page
check(libc.mprotect(protected, page, PROT_NONE) == 0, "mprotect")
check(libc.munmap(unmapped, page) == 0, "munmap")


completions = {}


def wait(*wr_ids, deadline=10.0):
    """Polls the CQ until every one of wr_ids has completed; returns their completions."""
    end = time.monotonic() + deadline
    while not all(i in completions for i in wr_ids):
        if time.monotonic() > end:
            sys.exit(f"completions {sorted(completions)}, want {sorted(wr_ids)} within {deadline}s")
        n, wcs = cq.poll(num_entries=1)
        if n:
            if wcs[0].wr_id in completions:
                sys.exit(f"wr {wcs[0].wr_id} completed twice")
            completions[wcs[0].wr_id] = wcs[0]
    got = [completions.pop(i) for i in wr_ids]
    if completions:
        sys.exit(f"unexpected completions {sorted(completions)}")
    return got


def post_recv(wr_id, addr, lkey, length=GRH + MSG):
    qp.post_recv(RecvWR(wr_id=wr_id, num_sge=1, sg=[SGE(addr, length, lkey)]))


def post_send(wr_id, addr, length=MSG):
    wr = SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(addr, length, buf.lkey)])
    wr.set_wr_ud(ah, qp.qp_num, QKEY)
    qp.post_send(wr)


def name(wc):
    return f"status {wc.status} ({e.ibv_wc_status(wc.status).name}) vendor_err {wc.vendor_err}"


def want_prot_err(what, wc):
    print(f"{what}: {name(wc)}")
    if wc.status != e.IBV_WC_LOC_PROT_ERR or wc.vendor_err != EFA_LOCAL_ERROR_INVALID_LKEY:
        sys.exit(f"{what}: want IBV_WC_LOC_PROT_ERR, vendor_err {EFA_LOCAL_ERROR_INVALID_LKEY}")


def good_exchange(what, send_id, recv_id, fill):
    """A SEND from the first page, received in rbuf with its bytes."""
    msg = bytes((fill + i) % 256 for i in range(MSG))
    ctypes.memmove(base, msg, MSG)
    post_send(send_id, base)
    s, r = wait(send_id, recv_id)
    if s.status != e.IBV_WC_SUCCESS or r.status != e.IBV_WC_SUCCESS:
        sys.exit(f"{what}: send {name(s)}, receive {name(r)}")
    if r.byte_len != GRH + MSG or rbuf.read(MSG, GRH) != msg:
        sys.exit(f"{what}: received {r.byte_len} bytes, {rbuf.read(MSG, GRH).hex()}, want {msg.hex()}")
    print(f"{what}: send and receive status {s.status} ({e.ibv_wc_status(s.status).name}), {r.byte_len} bytes received")


# A receive is posted first, so a SEND that wrongly went out would complete it.
post_recv(100, rbuf.buf, rbuf.lkey)
for wr_id, what, addr in [(1, "send from the PROT_NONE page", protected),
                          (2, "send from the unmapped page", unmapped),
                          (3, "send straddling the good and PROT_NONE pages", protected - MSG // 2)]:
    post_send(wr_id, addr)
    want_prot_err(what, *wait(wr_id))
if mapped(unmapped, page):
    sys.exit("something was mapped at the unmapped page meanwhile")
good_exchange("send from the good page", 4, 100, 0)

# The receiving side: a receive buffer in the protected page is consumed with an error. (The UD
# sender is not told: its completion's status is not checked.)
post_recv(101, protected, buf.lkey)
post_send(5, base)
_, r = wait(5, 101)
want_prot_err("receive into the PROT_NONE page", r)

# The process carries on.
post_recv(102, rbuf.buf, rbuf.lkey)
good_exchange("then a send from the good page", 6, 102, 7)

qp.close()
buf.close()
libc.munmap(base, 2 * page)
print("ok")
