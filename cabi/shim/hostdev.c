// The host device's client (docs/architecture.md, "The host device" and its protocol): when the
// program's file (conf.c) names a device socket, the shim loads no engine into the program. The
// device node's operations go to the host's device, a process of its own, over its socket; the
// device reaches the program's memory and rings itself, and gives the program the fds its
// commands make. This file is the engine's entry points for that case, in C: no Go runtime runs
// in the program.

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

enum {
	OP_OPEN = 1,
	OP_WRITE = 2,
	OP_IOCTL = 3,
	OP_CLOSE = 4,
	OP_KICK = 5,
	OP_ARM = 6,
	OP_COUNTER = 8,
	OP_NETLINK = 9,
	OP_DBPAGE = 12,
	OP_TRAP = 13,
	OP_DOORBELL = 14,
	OP_GIVE = 100,
};

#define HDR 16
#define MAXMSG (64 << 10)
#define MAXFD 65536

static int sock = -1;
static int door = -1; // the doorbell socket (OP_DOORBELL): kicks, answered when waited for or lingering
// One call at a time: its reply is the next message but the fds the device gives meanwhile.
// Arms and traps are single datagrams sent without it (sendmsg on a SOCK_SEQPACKET socket is
// atomic); kicks go on the doorbell socket (softefa_hostdev_kick_qp).
static pthread_mutex_t call_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned char rbuf[MAXMSG]; // the reply being read; call_mu
static uint32_t fd_open[MAXFD];    // a device fd's open: its handle + 1, 0 for none

static void put32(unsigned char *b, uint32_t v) { memcpy(b, &v, 4); } // (x86-64, aarch64: little-endian)
static void put64(unsigned char *b, uint64_t v) { memcpy(b, &v, 8); }
static uint32_t get32(const unsigned char *b) { uint32_t v; memcpy(&v, b, 4); return v; }
static int64_t get64(const unsigned char *b) { int64_t v; memcpy(&v, b, 8); return v; }

static int64_t call(uint32_t op, uint32_t h, uint64_t arg, const void *p1, size_t n1, const void *p2, size_t n2,
		    size_t *plen, int *fd);

int softefa_hostdev_connect(const char *path) {
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	strcpy(a.sun_path, path);
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -errno;
	if (connect(s, (struct sockaddr *)&a, sizeof(a)) < 0) {
		int e = errno;
		close(s);
		return -e;
	}
	// Only a device of this user's or root's (docs/security.md, "The host device").
	struct ucred cr;
	socklen_t cl = sizeof(cr);
	if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || (cr.uid != 0 && cr.uid != geteuid())) {
		close(s);
		return -EPERM;
	}
	// The device reaches this process's memory (process_vm_readv/writev): where Yama restricts
	// that to ancestors (ptrace_scope 1), the program names the device its ptracer. (EINVAL
	// without Yama: nothing to do.)
	if (cr.pid > 0) // (0: the device is in a pid namespace this process cannot see)
		prctl(PR_SET_PTRACER, (unsigned long)cr.pid, 0, 0, 0);
	sock = s;
	size_t plen;
	int fd;
	pthread_mutex_lock(&call_mu);
	int64_t r = call(OP_DOORBELL, 0, 0, NULL, 0, NULL, 0, &plen, &fd);
	pthread_mutex_unlock(&call_mu);
	if (r < 0 || fd < 0) {
		if (fd >= 0)
			close(fd);
		close(s);
		sock = -1;
		return r < 0 ? (int)r : -EPROTO;
	}
	door = fd;
	return 0;
}

// send_req sends a request: the header and up to two pieces of payload, and an fd if fd >= 0.
static int send_req(uint32_t op, uint32_t h, uint64_t arg, const void *p1, size_t n1, const void *p2, size_t n2) {
	unsigned char hdr[HDR];
	put32(hdr, op);
	put32(hdr + 4, h);
	put64(hdr + 8, arg);
	struct iovec iov[3] = {{hdr, HDR}, {(void *)p1, n1}, {(void *)p2, n2}};
	struct msghdr m = {.msg_iov = iov, .msg_iovlen = 3};
	ssize_t r;
	do
		r = sendmsg(sock, &m, MSG_NOSIGNAL);
	while (r < 0 && errno == EINTR);
	return r < 0 ? -errno : 0;
}

// call sends a request and returns the reply's status (or -errno), its payload in rbuf (*plen
// bytes from rbuf+HDR) and the fd attached to it (*fd, -1 for none), answering the device's
// gives meanwhile. The caller holds call_mu.
static int64_t call(uint32_t op, uint32_t h, uint64_t arg, const void *p1, size_t n1, const void *p2, size_t n2,
		    size_t *plen, int *fd) {
	*fd = -1;
	if (sock < 0)
		return -ENODEV;
	if (HDR + n1 + n2 > MAXMSG)
		return -EINVAL;
	int r = send_req(op, h, arg, p1, n1, p2, n2);
	if (r < 0)
		return r;
	// The fds given during the command: closed if it fails, since its response, which names
	// them, never reaches the program.
	int given[8], ngiven = 0;
	int64_t st;
	for (;;) {
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct iovec iov = {rbuf, sizeof(rbuf)};
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
		ssize_t n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			st = -errno;
			break;
		}
		int got = -1;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
				memcpy(&got, CMSG_DATA(c), sizeof(int));
		if (n >= HDR && get32(rbuf) == OP_GIVE && !(m.msg_flags & MSG_TRUNC)) {
			// Answered whatever came: without the fd (the program at its fd limit: the kernel
			// dropped it, MSG_CTRUNC), or with no room to remember it, -EMFILE, and the device
			// fails the command.
			if (got >= 0 && ngiven == 8) {
				close(got);
				got = -1;
			}
			if (got >= 0)
				given[ngiven++] = got;
			unsigned char ans[HDR] = {0};
			put32(ans, OP_GIVE);
			put64(ans + 8, got >= 0 ? (uint64_t)(int64_t)got : (uint64_t)(int64_t)-EMFILE);
			struct iovec ai = {ans, HDR};
			struct msghdr am = {.msg_iov = &ai, .msg_iovlen = 1};
			if (sendmsg(sock, &am, MSG_NOSIGNAL) < 0) {
				st = -errno;
				break;
			}
			continue;
		}
		if (n < HDR || (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || get32(rbuf) != op) {
			if (got >= 0)
				close(got);
			st = -EPROTO;
			break;
		}
		*plen = (size_t)n - HDR;
		*fd = got;
		st = get64(rbuf + 8);
		break;
	}
	if (st < 0)
		for (int i = 0; i < ngiven; i++)
			close(given[i]);
	return st;
}

// simple is call for a reply whose payload and fd do not matter.
static int64_t simple(uint32_t op, uint32_t h, uint64_t arg, const void *p, size_t n) {
	size_t plen;
	int fd;
	pthread_mutex_lock(&call_mu);
	int64_t r = call(op, h, arg, p, n, NULL, 0, &plen, &fd);
	pthread_mutex_unlock(&call_mu);
	if (fd >= 0)
		close(fd);
	return r;
}

static int handle_of(int fd, uint32_t *h) {
	if (fd < 0 || fd >= MAXFD || !fd_open[fd])
		return 0;
	*h = fd_open[fd] - 1;
	return 1;
}

int softefa_hostdev_open(int flags) {
	size_t plen;
	int mfd;
	pthread_mutex_lock(&call_mu);
	int64_t r = call(OP_OPEN, 0, 0, NULL, 0, NULL, 0, &plen, &mfd);
	pthread_mutex_unlock(&call_mu);
	if (r < 0 || mfd < 0) {
		if (mfd >= 0)
			close(mfd);
		return r < 0 ? (int)r : -EPROTO;
	}
	int fd = fcntl(mfd, (flags & O_CLOEXEC) ? F_DUPFD_CLOEXEC : F_DUPFD, 3);
	int e = errno;
	close(mfd);
	if (fd < 0 || fd >= MAXFD) {
		if (fd >= 0)
			close(fd);
		simple(OP_CLOSE, (uint32_t)r, 0, NULL, 0);
		return fd < 0 ? -e : -EMFILE;
	}
	fd_open[fd] = (uint32_t)r + 1;
	return fd;
}

long softefa_hostdev_write(int fd, const void *buf, size_t n) {
	uint32_t h;
	if (!handle_of(fd, &h))
		return -EBADF;
	if (n > MAXMSG - HDR)
		return -EINVAL;
	return (long)simple(OP_WRITE, h, 0, buf, n);
}

int softefa_hostdev_ioctl(int fd, unsigned long req, void *arg) {
	uint32_t h;
	if (!handle_of(fd, &h))
		return -EBADF;
	unsigned char r[4];
	put32(r, (uint32_t)req);
	return (int)simple(OP_IOCTL, h, (uint64_t)(uintptr_t)arg, r, 4);
}

void softefa_hostdev_dup(int fd, int nfd) {
	if (fd >= 0 && fd < MAXFD && nfd >= 0 && nfd < MAXFD)
		fd_open[nfd] = fd_open[fd];
}

void softefa_hostdev_close(int fd) {
	uint32_t h;
	if (!handle_of(fd, &h))
		return;
	fd_open[fd] = 0;
	for (int i = 0; i < MAXFD; i++)
		if (fd_open[i] == h + 1)
			return; // a dup still names the open
	simple(OP_CLOSE, h, 0, NULL, 0);
}

// Kicks go on the doorbell socket (docs/architecture.md, "Doorbells on the host device"), each
// numbered. A kick the last answer for its QP said would linger there (the QP ping-pongs) waits
// for its own answer while the device waits for the QP's next receive: the thread looks for it
// and yields its core between looks, to the peer and the device that make the answer (door_wait).
// Other kicks go without waiting, and so does a kick after a posted receive, which the device
// never lingers on; they are answered only when the QP's next kick would linger, and the next
// kick takes those answers.
static pthread_mutex_t door_mu = PTHREAD_MUTEX_INITIALIZER;  // reading answers
static pthread_mutex_t door_send = PTHREAD_MUTEX_INITIALIZER; // numbering and sending kicks
// Kick numbers, counted in 64 bits here and sent modulo 2^31. Kicks go in the order of their
// numbers (door_send), and the device answers in the order it reads them, so a kick's answer
// has been read once the last answer read is numbered at or past it. The first is 2^31 - 512:
// every program past 512 kicks crosses the wrap of the 31 bits sent, in tests as in long runs.
#define KICK_FIRST ((UINT64_C(1) << 31) - 512)
static _Atomic uint64_t door_sent = KICK_FIRST - 1; // written under door_send
static _Atomic uint64_t door_answered = KICK_FIRST - 1;
static _Atomic unsigned char door_lingers[4096]; // by QP handle mod 4096: a hint

// door_take records an answer. Its number is the latest one sent with those 31 bits: answers
// come in order and soon after their kicks, far less than 2^31 kicks later.
static void door_take(const unsigned char *b) {
	uint64_t v = (uint64_t)get64(b + 8);
	atomic_store(&door_lingers[get32(b + 4) & 4095], (unsigned char)(v >> 32 & 1));
	uint64_t sent = atomic_load(&door_sent); // (this answer's kick was sent: its number is in)
	uint64_t n = sent - ((sent - (v & 0x7fffffff)) & 0x7fffffff);
	uint64_t old = atomic_load(&door_answered);
	while (old < n && !atomic_compare_exchange_weak(&door_answered, &old, n))
		;
}

// door_read reads one answer, blocking or not: 1 when it read one, 0 when there was none yet,
// -1 when there will be none (the device closed the socket, or an error).
static int door_read(int flags) {
	unsigned char b[HDR];
	ssize_t r;
	do
		r = recv(door, b, HDR, flags);
	while (r < 0 && errno == EINTR);
	if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return 0;
	if (r != HDR)
		return -1;
	door_take(b);
	return 1;
}

// DOOR_SPIN_NS bounds door_wait's looking: twice the device's longest linger (uverbs.Linger,
// 1 ms), past which the device has normally answered.
#define DOOR_SPIN_NS (2 * 1000 * 1000)

// door_wait waits, holding door_mu, until kick n's answer has been read. It does not sleep in
// recv: a core left idle is slow to wake on a virtual machine (about 20 µs, a vCPU's halt and
// the hypervisor's wake-up, on the machine kind of docs/performance.md), and both a ping-pong's
// answer and the peer's next message come within microseconds. So it looks without blocking and
// yields its core between looks, which is as prompt as spinning when the core has nothing else
// to run and hands the core over at once when it has (the device's doorman, the peer). Past
// DOOR_SPIN_NS (a kick the device parked behind a command of the program's, a device stopped)
// it sleeps in recv until the answer comes.
static void door_wait(uint64_t n) {
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (atomic_load(&door_answered) < n) {
		int r = door_read(MSG_DONTWAIT);
		if (r < 0)
			return;
		if (r > 0)
			continue;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if ((int64_t)(t.tv_sec - t0.tv_sec) * 1000000000 + (t.tv_nsec - t0.tv_nsec) > DOOR_SPIN_NS)
			break;
		sched_yield();
	}
	while (atomic_load(&door_answered) < n && door_read(0) > 0)
		;
}

// kick sends a kick of QP qp, waiting for its answer if may_wait and the hint says it lingers.
static void kick(int fd, uint32_t qp, int may_wait) {
	uint32_t h;
	if (softefa_shim_forked() || !handle_of(fd, &h))
		return; // (a forked child would take its parent's answers; its QPs are the parent's)
	if (pthread_mutex_trylock(&door_mu) == 0) {
		while (door_read(MSG_DONTWAIT) > 0)
			;
		pthread_mutex_unlock(&door_mu);
	}
	int wait = may_wait && atomic_load(&door_lingers[qp & 4095]);
	unsigned char b[HDR];
	put32(b, OP_KICK);
	put32(b + 4, h);
	pthread_mutex_lock(&door_send);
	uint64_t n = atomic_load(&door_sent) + 1;
	atomic_store(&door_sent, n);
	put64(b + 8, qp | (uint64_t)wait << 32 | (n & 0x7fffffff) << 33);
	ssize_t r;
	do
		r = send(door, b, HDR, MSG_NOSIGNAL);
	while (r < 0 && errno == EINTR);
	pthread_mutex_unlock(&door_send);
	if (r < 0 || !wait)
		return;
	pthread_mutex_lock(&door_mu);
	door_wait(n);
	pthread_mutex_unlock(&door_mu);
}

void softefa_hostdev_kick_qp(int fd, uint32_t qp) { kick(fd, qp, 1); }
void softefa_hostdev_kick_recv(int fd, uint32_t qp) { kick(fd, qp, 0); }

void softefa_hostdev_arm_cq(int fd, uint32_t cq) {
	uint32_t h;
	if (handle_of(fd, &h))
		send_req(OP_ARM, h, cq, NULL, 0, NULL, 0);
}

int64_t softefa_hostdev_db_page(int fd, int64_t off) {
	uint32_t h;
	if (off < 0 || !handle_of(fd, &h))
		return -1;
	int64_t r = simple(OP_DBPAGE, h, (uint64_t)off, NULL, 0);
	return r < 0 ? -1 : r;
}

void softefa_hostdev_db_trapped(int fd, uint32_t qp, int trapped) {
	uint32_t h;
	if (handle_of(fd, &h))
		send_req(OP_TRAP, h, (uint64_t)qp | (trapped ? 1ull << 32 : 0), NULL, 0, NULL, 0);
}

// A trapped doorbell store: the device is told at once, as by a post through libibverbs.
void softefa_hostdev_db_rung(int fd, uint32_t qp) { softefa_hostdev_kick_qp(fd, qp); }

// softefa_hostdev_netlink answers the RDMA netlink request in buf, sent by the program on its
// socket with port id port, by writing the device's replies into peer.
int softefa_hostdev_netlink(int peer, uint32_t port, const void *buf, size_t n) {
	const char *path = softefa_conf("dev-path"), *rdev = softefa_conf("dev-rdev");
	const char *name = path && strrchr(path, '/') ? strrchr(path, '/') + 1 : "";
	unsigned maj = 0, min = 0;
	if (rdev)
		sscanf(rdev, "%u:%u", &maj, &min);
	size_t nl = strlen(name);
	if (nl > 255)
		return -ENAMETOOLONG;
	unsigned char ch[10 + 256];
	put32(ch, maj);
	put32(ch + 4, min);
	uint16_t l16 = (uint16_t)nl;
	memcpy(ch + 8, &l16, 2);
	memcpy(ch + 10, name, nl);
	size_t plen;
	int fd;
	pthread_mutex_lock(&call_mu);
	int64_t r = call(OP_NETLINK, 0, port, ch, 10 + nl, buf, n, &plen, &fd);
	if (fd >= 0)
		close(fd);
	for (size_t off = 0; r >= 0 && off + 4 <= plen;) {
		uint32_t ml = get32(rbuf + HDR + off);
		if (ml > plen - off - 4) {
			r = -EPROTO;
			break;
		}
		if (write(peer, rbuf + HDR + off + 4, ml) < 0)
			r = -errno;
		off += 4 + ml;
	}
	pthread_mutex_unlock(&call_mu);
	return r < 0 ? (int)r : 0;
}

// softefa_hostdev_sysfs_counter is the program opening path, a file of its sysfs tree: when it
// is a port counter (…/ports/N/hw_counters/NAME), the file is rewritten with the device's value
// now, whole under another name at the tree's root and renamed over the old one, as the engine
// inside a program does (softefa_sysfs_counter).
void softefa_hostdev_sysfs_counter(const char *path) {
	// path is in the tree (ROOT/sys/…, the shim mapped it): the tree's root is what comes before
	// its first /sys/. (Not realpath: libc resolves the tree's links through the shim's own
	// mapping of /sys.)
	const char *p = path, *devices = strstr(p, "/sys/"), *hw = strstr(p, "/hw_counters/");
	if (!devices || !hw || strchr(hw + strlen("/hw_counters/"), '/'))
		return;
	const char *name = hw + strlen("/hw_counters/");
	size_t plen;
	int fd;
	pthread_mutex_lock(&call_mu);
	int64_t r = call(OP_COUNTER, 0, 0, name, strlen(name), NULL, 0, &plen, &fd);
	uint64_t v = 0;
	if (r >= 0 && plen == 8)
		memcpy(&v, rbuf + HDR, 8);
	pthread_mutex_unlock(&call_mu);
	if (fd >= 0)
		close(fd);
	if (r < 0 || plen != 8)
		return;
	char tmp[PATH_MAX];
	if (snprintf(tmp, sizeof(tmp), "%.*s/.%s-XXXXXX", (int)(devices - p), p, name) >= (int)sizeof(tmp))
		return;
	int t = mkstemp(tmp);
	if (t < 0)
		return;
	char line[32];
	int n = snprintf(line, sizeof(line), "%llu\n", (unsigned long long)v);
	int ok = write(t, line, (size_t)n) == n && fchmod(t, 0644) == 0;
	ok = close(t) == 0 && ok;
	if (!ok || rename(tmp, p) != 0)
		unlink(tmp);
}

int softefa_hostdev_sysfs(char *buf, size_t n) {
	(void)buf;
	(void)n;
	return -EOPNOTSUPP; // (softefa run writes the host device's tree)
}
void softefa_hostdev_exit(void) {}
int softefa_hostdev_procs(int callers) {
	(void)callers;
	return INT_MAX;
}
