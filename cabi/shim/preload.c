// softefa's LD_PRELOAD shim: the kernel surface that the real libibverbs and libefa touch,
// emulated for one software EFA device per process (see docs/cabi.md).
//
// It intercepts the open, stat, access, ioctl, write, close and socket calls that concern the device
// node the program's file names (conf.c; every call that names a path maps it first: paths.c) and
// answers them itself or through the Go engine, a c-shared
// library (the file's engine) that it loads on the first open of the node, so that programs which
// never open the device (children such as ls) never start a Go runtime. Every other call goes
// straight to libc after one bitmap test.
//
// The fd a program gets for the node is a memfd created by the engine: libefa's mmap(2) of
// ring and doorbell keys works on it unintercepted, and the engine maps the same offsets.
// write(2) on it carries uverbs commands to the engine, and so does ioctl(2) (RDMA_VERBS_IOCTL).
// socket(AF_NETLINK, ..., NETLINK_RDMA) gets one end of a local socket pair whose requests the
// engine answers as the kernel's RDMA netlink does (the bind, name, send and receive calls on it
// are adjusted here to look like netlink's). Stores to a QP's doorbell trap (dbtrap.c).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "shim.h"

#ifndef NETLINK_RDMA
#define NETLINK_RDMA 20
#endif

#define MAX_FD 65536

// fds[] marks the fds that are open device nodes (memfds served by the engine).
static _Atomic uint64_t fds[MAX_FD / 64];

static int fcntl_valid(int fd);
static void init_async_sigs(void);

static int ours(int fd) {
	return fd >= 0 && fd < MAX_FD &&
	       (atomic_load_explicit(&fds[fd >> 6], memory_order_relaxed) >> (fd & 63) & 1);
}

static void mark(int fd, int on) {
	if (fd < 0 || fd >= MAX_FD)
		return;
	uint64_t bit = (uint64_t)1 << (fd & 63);
	if (on)
		atomic_fetch_or(&fds[fd >> 6], bit);
	else
		atomic_fetch_and(&fds[fd >> 6], ~bit);
}

// RDMA netlink sockets (see socket below): the fds, their pair's other end and port ids.
#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif
struct sx_sockaddr_nl {
	sa_family_t nl_family;
	unsigned short nl_pad;
	uint32_t nl_pid, nl_groups;
};
static _Atomic uint64_t nlfds[MAX_FD / 64];
static int nl_peer[MAX_FD];
static uint32_t nl_port[MAX_FD];

static int nl_ours(int fd) {
	return fd >= 0 && fd < MAX_FD &&
	       (atomic_load_explicit(&nlfds[fd >> 6], memory_order_relaxed) >> (fd & 63) & 1);
}

static const char *dev_path; // NULL: the shim is inert
static dev_t dev_rdev;

// A child forked from a process whose engine runs has a copy of the Go runtime that cannot run
// (only the forking thread survives). Its inherited device fds become orphans: still device
// nodes to fstat, but write fails with EIO and close only closes; opening the device fails with
// ENODEV. (The kernel would let the child share the parent's context; this emulation cannot.)
static _Atomic uint64_t orphans[MAX_FD / 64];
static int engine_loaded, forked_child;

static int orphan(int fd) {
	return forked_child && fd >= 0 && fd < MAX_FD &&
	       (atomic_load_explicit(&orphans[fd >> 6], memory_order_relaxed) >> (fd & 63) & 1);
}

// dev_fd reports whether fd names the device node: one of this process's, or an orphan.
static int dev_fd(int fd) { return ours(fd) || orphan(fd); }

static void atfork_child(void) {
	if (!engine_loaded)
		return;
	forked_child = 1;
	for (int i = 0; i < MAX_FD / 64; i++) {
		atomic_store(&orphans[i], atomic_load(&fds[i]));
		atomic_store(&fds[i], 0);
	}
}

__attribute__((constructor)) static void shim_init(void) {
	unsigned maj, min;
	init_async_sigs();
	const char *p = softefa_conf("dev-path");
	const char *r = softefa_conf("dev-rdev");
	if (!p || !*p || !r || sscanf(r, "%u:%u", &maj, &min) != 2)
		return;
	dev_path = strdup(p);
	dev_rdev = makedev(maj, min);
	pthread_atfork(NULL, NULL, atfork_child);
}

static int is_dev(const char *path) { return dev_path && path && strcmp(path, dev_path) == 0; }

#define REAL(name) real_##name
#define DECLARE_REAL(ret, name, ...)                                                   \
	static ret (*real_##name)(__VA_ARGS__);                                        \
	static void resolve_##name(void) {                                             \
		if (!real_##name)                                                      \
			real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name);  \
	}

DECLARE_REAL(int, open, const char *, int, ...)
DECLARE_REAL(int, open64, const char *, int, ...)
DECLARE_REAL(int, openat, int, const char *, int, ...)
DECLARE_REAL(int, openat64, int, const char *, int, ...)
DECLARE_REAL(int, __open_2, const char *, int)
DECLARE_REAL(int, __open64_2, const char *, int)
DECLARE_REAL(int, __openat_2, int, const char *, int)
DECLARE_REAL(ssize_t, write, int, const void *, size_t)
DECLARE_REAL(int, close, int)
DECLARE_REAL(int, ioctl, int, unsigned long, ...)
DECLARE_REAL(int, socket, int, int, int)
DECLARE_REAL(int, bind, int, const struct sockaddr *, socklen_t)
DECLARE_REAL(int, getsockname, int, struct sockaddr *, socklen_t *)
DECLARE_REAL(int, setsockopt, int, int, int, const void *, socklen_t)
DECLARE_REAL(ssize_t, send, int, const void *, size_t, int)
DECLARE_REAL(ssize_t, sendto, int, const void *, size_t, int, const struct sockaddr *, socklen_t)
DECLARE_REAL(ssize_t, sendmsg, int, const struct msghdr *, int)
DECLARE_REAL(ssize_t, recvfrom, int, void *, size_t, int, struct sockaddr *, socklen_t *)
DECLARE_REAL(ssize_t, recvmsg, int, struct msghdr *, int)
DECLARE_REAL(int, dup, int)
DECLARE_REAL(int, dup2, int, int)
DECLARE_REAL(int, dup3, int, int, int)
DECLARE_REAL(int, fcntl, int, int, ...)
DECLARE_REAL(int, fcntl64, int, int, ...)
DECLARE_REAL(char *, getenv, const char *)
DECLARE_REAL(char *, secure_getenv, const char *)
DECLARE_REAL(int, stat, const char *, struct stat *)
DECLARE_REAL(int, lstat, const char *, struct stat *)
DECLARE_REAL(int, fstat, int, struct stat *)
DECLARE_REAL(int, fstatat, int, const char *, struct stat *, int)
DECLARE_REAL(int, stat64, const char *, struct stat64 *)
DECLARE_REAL(int, lstat64, const char *, struct stat64 *)
DECLARE_REAL(int, fstat64, int, struct stat64 *)
DECLARE_REAL(int, fstatat64, int, const char *, struct stat64 *, int)
DECLARE_REAL(int, __xstat, int, const char *, struct stat *)
DECLARE_REAL(int, __lxstat, int, const char *, struct stat *)
DECLARE_REAL(int, __fxstat, int, int, struct stat *)
DECLARE_REAL(int, __fxstatat, int, int, const char *, struct stat *, int)
DECLARE_REAL(int, __xstat64, int, const char *, struct stat64 *)
DECLARE_REAL(int, __lxstat64, int, const char *, struct stat64 *)
DECLARE_REAL(int, __fxstat64, int, int, struct stat64 *)
DECLARE_REAL(int, __fxstatat64, int, int, const char *, struct stat64 *, int)
DECLARE_REAL(int, statx, int, const char *, int, unsigned int, struct statx *)
DECLARE_REAL(long, syscall, long, ...)

// The engine: loaded once, on the first open of the device node.
static int (*eng_open)(int flags);
static long (*eng_write)(int fd, const void *buf, size_t n);
static void (*eng_close)(int fd);
static void (*eng_kick_qp)(int fd, uint32_t handle);
static void (*eng_arm_cq)(int fd, uint32_t handle);
static int (*eng_poll_net)(void);
static void (*eng_dup)(int fd, int nfd);
static int (*eng_sysfs)(char *buf, size_t n);
static void (*eng_sysfs_counter)(const char *path);
static int (*eng_ioctl)(int fd, unsigned long req, void *arg);
static int (*eng_netlink)(int peer, uint32_t port, const void *buf, size_t n);
static int64_t (*eng_db_page)(int fd, int64_t off);
static void (*eng_db_trapped)(int fd, uint32_t handle, int trapped);
static void (*eng_db_rung)(int fd, uint32_t handle);
static void (*eng_exit)(void);
static int (*eng_procs)(int callers);
static pthread_once_t eng_once = PTHREAD_ONCE_INIT;
static int eng_err;

// Signals and the engine (docs/cabi.md, "Signals"). A thread that is inside a call into the Go
// engine must not run a program's signal handler: a handler that enters the device (a write or
// close on its fd, a verbs call, as a library's cleanup handler may) would call into Go again on
// a thread whose Go state is mid-call, which the Go runtime cannot survive. So every call into
// the engine runs with the asynchronous signals blocked, and the thread's mask is restored after:
// a signal that arrives meanwhile is handled, or kills the process, as soon as the thread is back
// in C. The engine's own threads inherit the mask with which it was loaded (blocked as well), so
// process-directed signals go to the program's threads (but for the few the Go runtime always
// unblocks on its threads, which docs/cabi.md lists). Faults (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGTRAP, SIGSYS) stay unblocked: they are synchronous, and the engine recovers from faults on
// a program's memory through them.
static sigset_t async_sigs;

static void init_async_sigs(void) {
	sigfillset(&async_sigs);
	static const int faults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
	for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]); i++)
		sigdelset(&async_sigs, faults[i]);
}

// Threads in the engine (docs/cabi.md, "Threads of the program in the engine"). The engine's
// Go runtime may run with fewer processors than the program has threads calling into it (one,
// with the linger on). A thread coming back into Go then waits for a processor, and another
// thread that leaves and re-enters the engine in a tight loop takes the processor back each
// time, so the waiting thread would never run. So every call is counted from before it asks for
// the processor until it is back in C, and a thread that leaves while more threads are counted
// than the engine has processors asks for as many (eng_procs, which answers the count it has
// now; it only grows).
static atomic_int in_engine;
static atomic_int engine_procs = 1;

static void enter(sigset_t *old) {
	pthread_sigmask(SIG_BLOCK, &async_sigs, old);
	atomic_fetch_add(&in_engine, 1);
}

static void leave(const sigset_t *old) {
	int n = atomic_load(&in_engine);
	if (n > atomic_load(&engine_procs) && eng_procs) {
		int procs = eng_procs(n);
		atomic_store(&engine_procs, procs);
		if (procs != INT_MAX && softefa_shim_debug())
			fprintf(stderr, "softefa: %d threads in the engine at once: %d processors\n", n, procs);
	}
	atomic_fetch_sub(&in_engine, 1);
	pthread_sigmask(SIG_SETMASK, old, NULL);
}

// at_exit sends the acknowledgements a busy poll left owed (engine.Device.FlushAcks): a program
// that exits right after its last completion (the end of a test) would otherwise take them with
// it, and its peer would time out a send that was delivered. Not in a forked child: the engine's
// threads stayed in the parent.
static void at_exit(void) {
	if (forked_child)
		return;
	sigset_t old;
	enter(&old);
	eng_exit();
	leave(&old);
}

// ENGINE_SLACK is the timer slack, in nanoseconds, of the engine's Go runtime threads (docs/cabi.md,
// "The engine's timer slack").
#define ENGINE_SLACK 1000000L

// load_hostdev makes the host device's client (hostdev.c) the engine, when the program's file
// names the device's socket: no library is loaded.
static int on_hostdev; // the engine is the host device's client: no Go runtime in the process

static int load_hostdev(void) {
	const char *dev = softefa_conf("device");
	if (!dev || !*dev)
		return 0;
	int r = softefa_hostdev_connect(dev);
	if (r < 0) {
		fprintf(stderr, "softefa: no device at %s: %s\n", dev, strerror(-r));
		eng_err = ENODEV;
		return 1;
	}
	eng_open = softefa_hostdev_open;
	eng_write = (long (*)(int, const void *, size_t))softefa_hostdev_write;
	eng_close = softefa_hostdev_close;
	eng_kick_qp = softefa_hostdev_kick_qp;
	eng_arm_cq = softefa_hostdev_arm_cq;
	eng_poll_net = NULL; // (on the host device poll_net only yields the core)
	eng_dup = softefa_hostdev_dup;
	eng_sysfs = (int (*)(char *, size_t))softefa_hostdev_sysfs;
	eng_sysfs_counter = softefa_hostdev_sysfs_counter;
	eng_ioctl = softefa_hostdev_ioctl;
	eng_netlink = (int (*)(int, uint32_t, const void *, size_t))softefa_hostdev_netlink;
	eng_db_page = softefa_hostdev_db_page;
	eng_db_trapped = softefa_hostdev_db_trapped;
	eng_db_rung = softefa_hostdev_db_rung;
	eng_exit = softefa_hostdev_exit;
	eng_procs = softefa_hostdev_procs;
	engine_loaded = 1;
	on_hostdev = 1;
	softefa_trap_install();
	return 1;
}

static void load_engine(void) {
	if (load_hostdev())
		return;
	const char *lib = softefa_conf("engine");
	if (!lib || !*lib) {
		eng_err = ENODEV;
		return;
	}
	// The runtime's threads, started now, inherit this thread's signal mask and timer slack. The
	// slack is what keeps the runtime's monitor thread (sysmon), which wakes every 20 us while
	// the program's thread holds the engine's processor in C, from preempting the program's
	// busy-polling threads tens of thousands of times a second (docs/cabi.md).
	long own = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
	int set_slack = own >= 0;
	sigset_t old;
	enter(&old);
	if (set_slack)
		prctl(PR_SET_TIMERSLACK, (unsigned long)ENGINE_SLACK, 0, 0, 0);
	void *h = dlopen(lib, RTLD_NOW | RTLD_GLOBAL);
	if (set_slack)
		prctl(PR_SET_TIMERSLACK, (unsigned long)own, 0, 0, 0);
	leave(&old);
	if (!h) {
		fprintf(stderr, "softefa: cannot load the engine: %s\n", dlerror());
		eng_err = ENODEV;
		return;
	}
	eng_open = (int (*)(int))dlsym(h, "softefa_open");
	eng_write = (long (*)(int, const void *, size_t))dlsym(h, "softefa_write");
	eng_close = (void (*)(int))dlsym(h, "softefa_close");
	eng_kick_qp = (void (*)(int, uint32_t))dlsym(h, "softefa_kick_qp");
	eng_arm_cq = (void (*)(int, uint32_t))dlsym(h, "softefa_arm_cq");
	eng_poll_net = (int (*)(void))dlsym(h, "softefa_poll_net");
	eng_dup = (void (*)(int, int))dlsym(h, "softefa_dup");
	eng_sysfs = (int (*)(char *, size_t))dlsym(h, "softefa_sysfs");
	eng_sysfs_counter = (void (*)(const char *))dlsym(h, "softefa_sysfs_counter");
	eng_ioctl = (int (*)(int, unsigned long, void *))dlsym(h, "softefa_ioctl");
	eng_netlink = (int (*)(int, uint32_t, const void *, size_t))dlsym(h, "softefa_netlink");
	eng_db_page = (int64_t (*)(int, int64_t))dlsym(h, "softefa_db_page");
	eng_db_trapped = (void (*)(int, uint32_t, int))dlsym(h, "softefa_db_trapped");
	eng_db_rung = (void (*)(int, uint32_t))dlsym(h, "softefa_db_rung");
	eng_exit = (void (*)(void))dlsym(h, "softefa_exit");
	int (*procs)(int) = (int (*)(int))dlsym(h, "softefa_procs");
	if (!eng_open || !eng_write || !eng_close || !eng_kick_qp || !eng_arm_cq || !eng_poll_net || !eng_dup ||
	    !eng_sysfs || !eng_sysfs_counter || !eng_ioctl || !eng_netlink || !eng_db_page || !eng_db_trapped || !eng_db_rung ||
	    !eng_exit || !procs) {
		fprintf(stderr, "softefa: %s lacks the engine entry points\n", lib);
		eng_err = ENODEV;
		return;
	}
	eng_procs = procs;
	engine_loaded = 1;
	softefa_trap_install(); // in front of the Go runtime's SIGSEGV and SIGTRAP handlers
	atexit(at_exit);
}

// Paths (paths.c): every call that names a path maps it first. PATH_AT leaves in path the one to
// use, and in isdev_ whether it names the device node.

#define PATH_AT(dirfd, path)                                                                       \
	char pathbuf_[4096];                                                                       \
	int isdev_;                                                                                \
	path = softefa_path_at(dirfd, path, pathbuf_, sizeof(pathbuf_), &isdev_)

// counter_read is the program opening path, a file of its tree: a hw_counters file gets the
// counter's value now (softefa_sysfs_counter).
static void counter_read(const char *path) {
	if (forked_child || !path || !strstr(path, "/hw_counters/"))
		return;
	if (!engine_loaded) {
		// On the host device (the file's device) the counters are the device's, which any process
		// reads, whether it has opened the device or not.
		const char *d = softefa_conf("device");
		if (!d || !*d)
			return;
		pthread_once(&eng_once, load_engine);
		if (eng_err || !engine_loaded)
			return;
	}
	sigset_t old;
	enter(&old);
	eng_sysfs_counter(path);
	leave(&old);
}

static int open_dev(int flags) {
	if (forked_child) {
		errno = ENODEV; // the engine's runtime did not survive the fork
		return -1;
	}
	pthread_once(&eng_once, load_engine);
	if (eng_err) {
		errno = eng_err;
		return -1;
	}
	if ((flags & O_ACCMODE) != O_RDWR) {
		errno = EACCES; // the node is crw-rw-rw-; uverbs needs O_RDWR
		return -1;
	}
	sigset_t old;
	enter(&old);
	int fd = eng_open(flags);
	leave(&old);
	if (fd < 0) {
		errno = -fd;
		return -1;
	}
	mark(fd, 1);
	return fd;
}

static mode_t open_mode(int flags, va_list ap) {
	return (flags & (O_CREAT | O_TMPFILE)) ? va_arg(ap, mode_t) : 0;
}

int open(const char *path, int flags, ...) {
	PATH_AT(AT_FDCWD, path);
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	if (isdev_)
		return open_dev(flags);
	counter_read(path);
	resolve_open();
	return REAL(open)(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
	PATH_AT(AT_FDCWD, path);
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	if (isdev_)
		return open_dev(flags);
	counter_read(path);
	resolve_open64();
	return REAL(open64)(path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
	PATH_AT(dirfd, path);
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	if (isdev_)
		return open_dev(flags);
	counter_read(path);
	resolve_openat();
	return REAL(openat)(dirfd, path, flags, mode);
}

int openat64(int dirfd, const char *path, int flags, ...) {
	PATH_AT(dirfd, path);
	va_list ap;
	va_start(ap, flags);
	mode_t mode = open_mode(flags, ap);
	va_end(ap);
	if (isdev_)
		return open_dev(flags);
	counter_read(path);
	resolve_openat64();
	return REAL(openat64)(dirfd, path, flags, mode);
}

int __open_2(const char *path, int flags) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_)
		return open_dev(flags);
	counter_read(path);
	resolve___open_2();
	return REAL(__open_2)(path, flags);
}

int __open64_2(const char *path, int flags) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_)
		return open_dev(flags);
	counter_read(path);
	resolve___open64_2();
	return REAL(__open64_2)(path, flags);
}

int __openat_2(int dirfd, const char *path, int flags) {
	PATH_AT(dirfd, path);
	if (isdev_)
		return open_dev(flags);
	counter_read(path);
	resolve___openat_2();
	return REAL(__openat_2)(dirfd, path, flags);
}

static ssize_t nl_send(int fd, const void *buf, size_t n);

ssize_t write(int fd, const void *buf, size_t n) {
	if (nl_ours(fd))
		return nl_send(fd, buf, n);
	if (ours(fd)) {
		sigset_t old;
		enter(&old);
		long r = eng_write(fd, buf, n);
		leave(&old);
		if (r < 0) {
			errno = (int)-r;
			return -1;
		}
		return r;
	}
	if (orphan(fd)) {
		errno = EIO;
		return -1;
	}
	resolve_write();
	return REAL(write)(fd, buf, n);
}

// eng_close_fd tells the engine that fd no longer names the device.
static void eng_close_fd(int fd) {
	sigset_t old;
	enter(&old);
	eng_close(fd);
	leave(&old);
}

int close(int fd) {
	if (nl_ours(fd)) {
		atomic_fetch_and(&nlfds[fd >> 6], ~((uint64_t)1 << (fd & 63)));
		resolve_close();
		REAL(close)(nl_peer[fd]);
	} else if (ours(fd)) {
		mark(fd, 0);
		eng_close_fd(fd); // tears the ucontext down, as ib_uverbs_close does
	} else if (orphan(fd)) {
		atomic_fetch_and(&orphans[fd >> 6], ~((uint64_t)1 << (fd & 63)));
	}
	resolve_close();
	return REAL(close)(fd);
}

// fcntl_valid reports whether fd is open (dup2 fails, and closes nothing, when it is not).
static int fcntl_valid(int fd) {
	resolve_fcntl();
	return REAL(fcntl)(fd, F_GETFD, 0) != -1;
}

// A duplicate of a device fd is the same open file (the same ucontext), as for the kernel's
// character device: the new fd is marked and the engine told; the context goes with the last.
static int dup_done(int fd, int nfd) {
	if (nfd >= 0 && ours(fd)) {
		mark(nfd, 1);
		sigset_t old;
		enter(&old);
		eng_dup(fd, nfd);
		leave(&old);
	}
	return nfd;
}

// dup_over closes what nfd was, if it was a device fd, before dup2/dup3 replace it.
static void dup_over(int fd, int nfd) {
	if (fd != nfd && ours(nfd)) {
		mark(nfd, 0);
		eng_close_fd(nfd);
	}
}

int dup(int fd) {
	resolve_dup();
	return dup_done(fd, REAL(dup)(fd));
}

int dup2(int fd, int nfd) {
	resolve_dup2();
	if (fcntl_valid(fd))
		dup_over(fd, nfd);
	return dup_done(fd, REAL(dup2)(fd, nfd));
}

int dup3(int fd, int nfd, int flags) {
	resolve_dup3();
	if (fcntl_valid(fd))
		dup_over(fd, nfd);
	return dup_done(fd, REAL(dup3)(fd, nfd, flags));
}

int fcntl(int fd, int cmd, ...) {
	va_list ap;
	va_start(ap, cmd);
	long arg = va_arg(ap, long);
	va_end(ap);
	resolve_fcntl();
	int r = REAL(fcntl)(fd, cmd, arg);
	return (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) ? dup_done(fd, r) : r;
}

int fcntl64(int fd, int cmd, ...) {
	va_list ap;
	va_start(ap, cmd);
	long arg = va_arg(ap, long);
	va_end(ap);
	resolve_fcntl64();
	if (!REAL(fcntl64)) {
		resolve_fcntl();
		return fcntl(fd, cmd, arg);
	}
	int r = REAL(fcntl64)(fd, cmd, arg);
	return (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) ? dup_done(fd, r) : r;
}

// Per-process devices. With sysfs-root in the program's file (softefa run without --addr), the first
// lookup of SYSFS_PATH in a process — libibverbs and libfabric make it before they enumerate
// devices — starts the process's own device on a free UDP port and answers the sysfs tree the
// engine wrote for it under that root, with the device's own GID. So every process of a script
// or a test runner gets a device, and a process that never looks for one pays nothing.
static char proc_sysfs[4096];
static pthread_once_t sysfs_once = PTHREAD_ONCE_INIT;
static _Atomic int sysfs_made; // proc_sysfs is the process's tree

static void make_sysfs(void) {
	pthread_once(&eng_once, load_engine);
	if (eng_err)
		return;
	sigset_t old;
	enter(&old);
	int r = eng_sysfs(proc_sysfs, sizeof(proc_sysfs));
	leave(&old);
	if (r < 0) {
		fprintf(stderr, "softefa: no device for this process: %s\n", strerror(-r));
		proc_sysfs[0] = 0;
		return;
	}
	atomic_store(&sysfs_made, 1);
}

static char *sysfs_path_for(const char *name) {
	if (!dev_path || forked_child || !name || strcmp(name, "SYSFS_PATH") != 0)
		return NULL;
	const char *root = softefa_conf("sysfs-root");
	if (!root || !*root)
		return NULL;
	pthread_once(&sysfs_once, make_sysfs);
	return proc_sysfs[0] ? proc_sysfs : NULL;
}

// sysfs_root is the directory the process's SYSFS_PATH names (its own tree, or the launcher's
// with --addr), or NULL.
static char *sysfs_root(void) {
	if (forked_child)
		return NULL;
	char *p = sysfs_path_for("SYSFS_PATH");
	if (p)
		return p;
	resolve_getenv();
	return softefa_conf("sysfs-root") ? NULL : REAL(getenv)("SYSFS_PATH");
}

char *getenv(const char *name) {
	char *p = sysfs_path_for(name);
	if (p)
		return p;
	resolve_getenv();
	return REAL(getenv)(name);
}

char *secure_getenv(const char *name) {
	char *p = sysfs_path_for(name);
	if (p)
		return p;
	resolve_secure_getenv();
	return REAL(secure_getenv)(name);
}

int ioctl(int fd, unsigned long req, ...) {
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	if (ours(fd)) {
		sigset_t old;
		enter(&old);
		int r = eng_ioctl(fd, req, arg);
		leave(&old);
		if (r < 0) {
			errno = -r;
			return -1;
		}
		return r;
	}
	if (orphan(fd)) {
		errno = EIO;
		return -1;
	}
	resolve_ioctl();
	return REAL(ioctl)(fd, req, arg);
}

// RDMA netlink (docs/cabi.md, "Netlink"). A NETLINK_RDMA socket is one end of an AF_UNIX
// SOCK_SEQPACKET pair (datagrams with boundaries, like netlink's); what the program sends on it
// goes to the engine, which writes the kernel's answers into the other end, where the program
// reads them. bind and getsockname give it a netlink port id; receives report the kernel
// (port 0) as the sender; SOL_NETLINK options are accepted and ignored. A process that never
// opens such a socket pays one bitmap test per socket call.
int socket(int domain, int type, int protocol) {
	resolve_socket();
	if (!dev_path || domain != AF_NETLINK || protocol != NETLINK_RDMA)
		return REAL(socket)(domain, type, protocol);
	if (!forked_child)
		pthread_once(&eng_once, load_engine);
	if (forked_child || eng_err) {
		errno = EPROTONOSUPPORT; // no engine: libibverbs enumerates through SYSFS_PATH
		return -1;
	}
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | (type & (SOCK_CLOEXEC | SOCK_NONBLOCK)), 0, sv) < 0)
		return -1;
	if (sv[0] >= MAX_FD) {
		REAL(close)(sv[0]);
		REAL(close)(sv[1]);
		errno = EMFILE;
		return -1;
	}
	resolve_fcntl();
	REAL(fcntl)(sv[1], F_SETFD, FD_CLOEXEC);
	nl_peer[sv[0]] = sv[1];
	nl_port[sv[0]] = 0;
	atomic_fetch_or(&nlfds[sv[0] >> 6], (uint64_t)1 << (sv[0] & 63));
	return sv[0];
}

// nl_autobind gives an unbound socket its port id, as the kernel does on first use: the pid for
// the first, then distinct negative ids.
static uint32_t nl_autobind(int fd) {
	static _Atomic int32_t next = -4096;
	static _Atomic int pid_used;
	if (!nl_port[fd])
		nl_port[fd] = atomic_exchange(&pid_used, 1) ? (uint32_t)atomic_fetch_sub(&next, 1) : (uint32_t)getpid();
	return nl_port[fd];
}

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
	if (nl_ours(fd)) {
		const struct sx_sockaddr_nl *nl = (const void *)addr;
		if (!addr || len < sizeof(*nl) || nl->nl_family != AF_NETLINK) {
			errno = EINVAL;
			return -1;
		}
		nl_port[fd] = nl->nl_pid;
		nl_autobind(fd);
		return 0;
	}
	resolve_bind();
	return REAL(bind)(fd, addr, len);
}

static void nl_name(struct sockaddr *addr, socklen_t *len, uint32_t port) {
	if (!addr || !len)
		return;
	struct sx_sockaddr_nl nl = {.nl_family = AF_NETLINK, .nl_pid = port};
	memcpy(addr, &nl, *len < sizeof(nl) ? *len : sizeof(nl));
	*len = sizeof(nl);
}

int getsockname(int fd, struct sockaddr *addr, socklen_t *len) {
	if (nl_ours(fd)) {
		nl_name(addr, len, nl_autobind(fd));
		return 0;
	}
	resolve_getsockname();
	return REAL(getsockname)(fd, addr, len);
}

int setsockopt(int fd, int level, int name, const void *val, socklen_t len) {
	if (nl_ours(fd) && level == SOL_NETLINK)
		return 0; // NETLINK_EXT_ACK, NETLINK_CAP_ACK, ...: the answers do not depend on them
	resolve_setsockopt();
	return REAL(setsockopt)(fd, level, name, val, len);
}

// nl_send hands one request (possibly several netlink messages) to the engine.
static ssize_t nl_send(int fd, const void *buf, size_t n) {
	if (forked_child) {
		errno = EIO; // the engine that answered it did not survive the fork, as for device fds
		return -1;
	}
	sigset_t old;
	enter(&old);
	int r = eng_netlink(nl_peer[fd], nl_autobind(fd), buf, n);
	leave(&old);
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return (ssize_t)n;
}

ssize_t send(int fd, const void *buf, size_t n, int flags) {
	if (nl_ours(fd))
		return nl_send(fd, buf, n);
	resolve_send();
	return REAL(send)(fd, buf, n, flags);
}

ssize_t sendto(int fd, const void *buf, size_t n, int flags, const struct sockaddr *to, socklen_t tolen) {
	if (nl_ours(fd))
		return nl_send(fd, buf, n);
	resolve_sendto();
	return REAL(sendto)(fd, buf, n, flags, to, tolen);
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags) {
	if (nl_ours(fd)) {
		size_t n = 0;
		for (size_t i = 0; i < msg->msg_iovlen; i++)
			n += msg->msg_iov[i].iov_len;
		char *buf = malloc(n ? n : 1);
		if (!buf) {
			errno = ENOBUFS;
			return -1;
		}
		size_t off = 0;
		for (size_t i = 0; i < msg->msg_iovlen; i++) {
			memcpy(buf + off, msg->msg_iov[i].iov_base, msg->msg_iov[i].iov_len);
			off += msg->msg_iov[i].iov_len;
		}
		ssize_t r = nl_send(fd, buf, n);
		free(buf);
		return r;
	}
	resolve_sendmsg();
	return REAL(sendmsg)(fd, msg, flags);
}

ssize_t recvfrom(int fd, void *buf, size_t n, int flags, struct sockaddr *from, socklen_t *fromlen) {
	resolve_recvfrom();
	if (nl_ours(fd)) {
		ssize_t r = REAL(recvfrom)(fd, buf, n, flags, NULL, NULL);
		if (r >= 0)
			nl_name(from, fromlen, 0);
		return r;
	}
	return REAL(recvfrom)(fd, buf, n, flags, from, fromlen);
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags) {
	resolve_recvmsg();
	if (nl_ours(fd)) {
		void *name = msg->msg_name;
		socklen_t namelen = msg->msg_namelen;
		msg->msg_name = NULL;
		msg->msg_namelen = 0;
		ssize_t r = REAL(recvmsg)(fd, msg, flags);
		msg->msg_name = name;
		msg->msg_namelen = namelen;
		if (r >= 0)
			nl_name(name, &msg->msg_namelen, 0);
		return r;
	}
	return REAL(recvmsg)(fd, msg, flags);
}

// The device node as stat(2) describes it: a character device with the sysfs dev numbers, made
// when the host booted, as devtmpfs makes a driver's nodes (for struct stat and struct stat64
// alike).
#define FAKE_STAT(st)                                                                              \
	do {                                                                                       \
		memset((st), 0, sizeof(*(st)));                                                    \
		(st)->st_mode = S_IFCHR | 0666;                                                    \
		(st)->st_nlink = 1;                                                                \
		(st)->st_rdev = dev_rdev;                                                          \
		(st)->st_blksize = 4096;                                                           \
		(st)->st_atime = (st)->st_mtime = (st)->st_ctime = boot_time();                    \
	} while (0)

// boot_time is when the host booted, in seconds since the epoch.
static time_t boot_time(void) {
	struct timespec now, up;
	clock_gettime(CLOCK_REALTIME, &now);
	clock_gettime(CLOCK_BOOTTIME, &up);
	return now.tv_sec - up.tv_sec;
}

static int at_is_dev(int dirfd, const char *path, int flags) {
	return is_dev(path) || ((flags & AT_EMPTY_PATH) && path && !*path && dev_fd(dirfd));
}

int stat(const char *path, struct stat *st) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_) {
		FAKE_STAT(st);
		return 0;
	}
	resolve_stat();
	return REAL(stat)(path, st);
}

int lstat(const char *path, struct stat *st) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_) {
		FAKE_STAT(st);
		return 0;
	}
	resolve_lstat();
	return REAL(lstat)(path, st);
}

int fstat(int fd, struct stat *st) {
	if (dev_fd(fd)) {
		FAKE_STAT(st);
		return 0;
	}
	resolve_fstat();
	return REAL(fstat)(fd, st);
}

int fstatat(int dirfd, const char *path, struct stat *st, int flags) {
	PATH_AT(dirfd, path);
	if (isdev_ || at_is_dev(dirfd, path, flags)) {
		FAKE_STAT(st);
		return 0;
	}
	resolve_fstatat();
	return REAL(fstatat)(dirfd, path, st, flags);
}

int stat64(const char *path, struct stat64 *st) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_) {
		FAKE_STAT(st);
		return 0;
	}
	resolve_stat64();
	return REAL(stat64)(path, st);
}

int lstat64(const char *path, struct stat64 *st) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_) {
		FAKE_STAT(st);
		return 0;
	}
	resolve_lstat64();
	return REAL(lstat64)(path, st);
}

int fstat64(int fd, struct stat64 *st) {
	if (dev_fd(fd)) {
		FAKE_STAT(st);
		return 0;
	}
	resolve_fstat64();
	return REAL(fstat64)(fd, st);
}

int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags) {
	PATH_AT(dirfd, path);
	if (isdev_ || at_is_dev(dirfd, path, flags)) {
		FAKE_STAT(st);
		return 0;
	}
	resolve_fstatat64();
	return REAL(fstatat64)(dirfd, path, st, flags);
}

// The glibc < 2.33 entry points behind stat(2) and friends.
int __xstat(int ver, const char *path, struct stat *st) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_) {
		FAKE_STAT(st);
		return 0;
	}
	resolve___xstat();
	return REAL(__xstat)(ver, path, st);
}

int __lxstat(int ver, const char *path, struct stat *st) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_) {
		FAKE_STAT(st);
		return 0;
	}
	resolve___lxstat();
	return REAL(__lxstat)(ver, path, st);
}

int __fxstat(int ver, int fd, struct stat *st) {
	if (dev_fd(fd)) {
		FAKE_STAT(st);
		return 0;
	}
	resolve___fxstat();
	return REAL(__fxstat)(ver, fd, st);
}

int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags) {
	PATH_AT(dirfd, path);
	if (isdev_ || at_is_dev(dirfd, path, flags)) {
		FAKE_STAT(st);
		return 0;
	}
	resolve___fxstatat();
	return REAL(__fxstatat)(ver, dirfd, path, st, flags);
}

int __xstat64(int ver, const char *path, struct stat64 *st) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_) {
		FAKE_STAT(st);
		return 0;
	}
	resolve___xstat64();
	return REAL(__xstat64)(ver, path, st);
}

int __lxstat64(int ver, const char *path, struct stat64 *st) {
	PATH_AT(AT_FDCWD, path);
	if (isdev_) {
		FAKE_STAT(st);
		return 0;
	}
	resolve___lxstat64();
	return REAL(__lxstat64)(ver, path, st);
}

int __fxstat64(int ver, int fd, struct stat64 *st) {
	if (dev_fd(fd)) {
		FAKE_STAT(st);
		return 0;
	}
	resolve___fxstat64();
	return REAL(__fxstat64)(ver, fd, st);
}

int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags) {
	PATH_AT(dirfd, path);
	if (isdev_ || at_is_dev(dirfd, path, flags)) {
		FAKE_STAT(st);
		return 0;
	}
	resolve___fxstatat64();
	return REAL(__fxstatat64)(ver, dirfd, path, st, flags);
}

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *stx) {
	PATH_AT(dirfd, path);
	if (isdev_ || at_is_dev(dirfd, path, flags)) {
		memset(stx, 0, sizeof(*stx));
		stx->stx_mask = STATX_BASIC_STATS;
		stx->stx_mode = S_IFCHR | 0666;
		stx->stx_nlink = 1;
		stx->stx_blksize = 4096;
		stx->stx_rdev_major = major(dev_rdev);
		stx->stx_rdev_minor = minor(dev_rdev);
		stx->stx_atime.tv_sec = stx->stx_mtime.tv_sec = stx->stx_ctime.tv_sec = boot_time();
		return 0;
	}
	resolve_statx();
	if (!REAL(statx)) {
		errno = ENOSYS;
		return -1;
	}
	return REAL(statx)(dirfd, path, flags, mask, stx);
}

// openat2's argument (linux/openat2.h, which glibc 2.36 does not include).
struct open_how_ {
	uint64_t flags, mode, resolve;
};

static long openat2_(int dirfd, const char *path, const struct open_how_ *how, size_t size) {
	PATH_AT(dirfd, path);
	if (isdev_) {
		if (!how) {
			errno = EFAULT; // as the kernel answers an unreadable open_how
			return -1;
		}
		if (size < sizeof(uint64_t)) {
			errno = EINVAL;
			return -1;
		}
		return open_dev((int)how->flags);
	}
	counter_read(path);
	resolve_syscall();
	return REAL(syscall)(SYS_openat2, dirfd, path, how, size);
}

// syscall: a program that makes a path's system call itself through glibc's syscall() (as it
// must for openat2, which has no glibc wrapper) gets the answer of the call's wrapper above or
// in paths.c, so that it finds the device as through libc. The kernel's struct stat is glibc's
// on x86-64 and arm64 (SYS_stat, SYS_lstat, SYS_newfstatat). The other numbers, and the paths
// calls not listed (getdents64, getcwd), go to the kernel as they are. Six arguments are read
// whatever the number takes, as glibc's syscall passes six.
long syscall(long nr, ...) {
	va_list ap;
	va_start(ap, nr);
	long a[6];
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	switch (nr) {
#ifdef SYS_open
	case SYS_open:
		return open((const char *)a[0], (int)a[1], (mode_t)a[2]);
#endif
	case SYS_openat:
		return openat((int)a[0], (const char *)a[1], (int)a[2], (mode_t)a[3]);
	case SYS_openat2:
		return openat2_((int)a[0], (const char *)a[1], (const struct open_how_ *)a[2], (size_t)a[3]);
#ifdef SYS_stat
	case SYS_stat:
		return stat((const char *)a[0], (struct stat *)a[1]);
	case SYS_lstat:
		return lstat((const char *)a[0], (struct stat *)a[1]);
#endif
	case SYS_newfstatat:
		return fstatat((int)a[0], (const char *)a[1], (struct stat *)a[2], (int)a[3]);
	case SYS_statx:
		return statx((int)a[0], (const char *)a[1], (int)a[2], (unsigned)a[3], (struct statx *)a[4]);
#ifdef SYS_access
	case SYS_access:
		return access((const char *)a[0], (int)a[1]);
#endif
	case SYS_faccessat:
		return faccessat((int)a[0], (const char *)a[1], (int)a[2], 0);
	case SYS_faccessat2:
		return faccessat((int)a[0], (const char *)a[1], (int)a[2], (int)a[3]);
#ifdef SYS_readlink
	case SYS_readlink:
		return readlink((const char *)a[0], (char *)a[1], (size_t)a[2]);
#endif
	case SYS_readlinkat:
		return readlinkat((int)a[0], (const char *)a[1], (char *)a[2], (size_t)a[3]);
	case SYS_chdir:
		return chdir((const char *)a[0]);
	}
	resolve_syscall();
	return REAL(syscall)(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

// Ops wrapping (docs/cabi.md, "Doorbells"). libefa rings doorbells with plain stores, which nothing traps. So
// the shim interposes ibv_open_device and ibv_qp_to_qp_ex, both exported by libibverbs, and for
// a context on the softefa device replaces the post_send, post_recv and req_notify_cq entries of
// its ops, and the wr_complete of each extended QP, with wrappers that call libefa's function and
// then tell the engine at once. req_notify_cq needs it for correctness: libefa's next poll
// rewrites the CQ doorbell without the arm bit, so an arm must be latched while it is there.
// poll_cq is wrapped too: when libefa finds the CQ empty, the polling thread takes what the
// network holds for the device itself (busy polling, as the Go API does) and libefa looks again,
// or, on the host device, yields its core (poll_net); so is the start_poll of each extended CQ
// made by efadv_create_cq (exported by libefa; what libfabric's efa provider uses).
//
// The layouts below are the public libibverbs ABI (verbs.h, unchanged since IBVERBS_1.1 for
// ibv_context, ibv_cq and ibv_qp, and since 1.6 for ibv_qp_ex).
struct sx_context {
	void *device;
	void *ops[32];
	int cmd_fd;
};
enum { OP_POLL_CQ = 11, OP_REQ_NOTIFY_CQ = 12, OP_POST_SEND = 25, OP_POST_RECV = 26 };
struct sx_cq {
	struct sx_context *context;
	void *channel, *cq_context;
	uint32_t handle;
};
struct sx_qp {
	struct sx_context *context;
	void *qp_context, *pd, *send_cq, *recv_cq, *srq;
	uint32_t handle, qp_num;
	int state, qp_type;
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t events_completed;
};
struct sx_qp_ex {
	struct sx_qp qp_base; // the whole struct ibv_qp, with this architecture's pthread sizes
	uint64_t comp_mask, wr_id;
	unsigned int wr_flags;
	void *fns[21];
};
enum { QPX_WR_COMPLETE = 18 };
struct sx_cq_ex {
	struct sx_context *context;
	void *channel, *cq_context;
	uint32_t handle, cqe;
	pthread_mutex_t mutex;
	pthread_cond_t cond;
	uint32_t comp_events_completed, async_events_completed, comp_mask;
	int status;
	uint64_t wr_id;
	void *start_poll;
};
_Static_assert(offsetof(struct sx_context, cmd_fd) == 264, "ibv_context layout");
_Static_assert(offsetof(struct sx_cq, handle) == 24, "ibv_cq layout");
_Static_assert(offsetof(struct sx_qp, handle) == 48, "ibv_qp layout");
#if defined(__x86_64__) // the offsets of the layouts above on x86-64, as verbs.h gives them
_Static_assert(sizeof(struct sx_qp) == 160, "ibv_qp layout");
_Static_assert(offsetof(struct sx_qp_ex, fns) + QPX_WR_COMPLETE * sizeof(void *) == 328, "ibv_qp_ex layout");
_Static_assert(offsetof(struct sx_cq_ex, start_poll) == 144, "ibv_cq_ex layout");
#endif

typedef int (*post_fn)(void *qp, void *wr, void **bad);
typedef int (*notify_fn)(void *cq, int solicited_only);
typedef int (*poll_fn)(void *cq, int n, void *wc);
typedef int (*start_poll_fn)(void *cq, void *attr);
typedef int (*complete_fn)(void *qpx);
static post_fn orig_post_send, orig_post_recv;
static notify_fn orig_req_notify;
static poll_fn orig_poll_cq;
static start_poll_fn orig_start_poll;
static complete_fn orig_wr_complete;

// kick, arm and poll_net call the engine with the asynchronous signals blocked (see enter). On
// the host device there is no Go runtime in the process to protect, and no mask is set: a kick is
// one send (two system calls fewer a post).
static void kick(int fd, uint32_t handle) {
	if (on_hostdev) {
		eng_kick_qp(fd, handle);
		return;
	}
	sigset_t old;
	enter(&old);
	eng_kick_qp(fd, handle);
	leave(&old);
}

static void arm(int fd, uint32_t handle) {
	if (on_hostdev) {
		eng_arm_cq(fd, handle);
		return;
	}
	sigset_t old;
	enter(&old);
	eng_arm_cq(fd, handle);
	leave(&old);
}

// What dbtrap.c and paths.c need of this file (shim.h).
int softefa_shim_ours(int fd) { return ours(fd); }
int softefa_shim_dev_fd(int fd) { return dev_fd(fd); }
void softefa_shim_counter_read(const char *path) { counter_read(path); }
const char *softefa_shim_dev_path(void) { return dev_path; }

// softefa_shim_sysfs is the tree the process's paths map into. A child forked after its parent
// made its device keeps the parent's tree for its paths (it inherits the parent's working
// directory and fds, which may be in it), though it cannot use the device; its counters are not
// brought up to date.
const char *softefa_shim_sysfs(int make) {
	resolve_getenv();
	if (!softefa_conf("sysfs-root"))
		return REAL(getenv)("SYSFS_PATH"); // --addr: the launcher's tree
	if (atomic_load(&sysfs_made))
		return proc_sysfs;
	return make && !forked_child ? sysfs_root() : NULL;
}
int softefa_shim_forked(void) { return forked_child; }

long softefa_shim_db_page(int fd, long long off) {
	sigset_t old;
	enter(&old);
	long h = (long)eng_db_page(fd, off);
	leave(&old);
	return h;
}

void softefa_shim_db_rung(int fd, uint32_t handle) {
	if (on_hostdev) { // (no Go runtime to keep signals from: two system calls a post saved)
		eng_db_rung(fd, handle);
		return;
	}
	sigset_t old;
	enter(&old);
	eng_db_rung(fd, handle);
	leave(&old);
}

void softefa_shim_db_trapped(int fd, uint32_t handle, int trapped) {
	sigset_t old;
	enter(&old);
	eng_db_trapped(fd, handle, trapped);
	leave(&old);
}

int softefa_shim_debug(void) {
	static int debug = -1;
	if (debug < 0) {
		const char *e = softefa_conf("debug"); // true as Go's strconv.ParseBool has it
		debug = e && (!strcmp(e, "1") || !strcmp(e, "t") || !strcmp(e, "T") || !strcmp(e, "true") ||
			      !strcmp(e, "TRUE") || !strcmp(e, "True"));
	}
	return debug;
}

// poll_net is what a thread that found its CQ empty does before it looks again. With a device in
// the process, it takes what the network holds for the device. On the host device, which reads
// the network itself, it yields the thread's core (docs/architecture.md, "Doorbells on the host
// device"): a program that spins on its CQ keeps the core the device needs to produce what it
// waits for.
static int poll_net(void) {
	if (on_hostdev) {
		sched_yield();
		return 0;
	}
	sigset_t old;
	enter(&old);
	int r = eng_poll_net();
	leave(&old);
	return r;
}

// kick_qp tells the engine of a post to q, unless its doorbell store trapped and did already.
static void kick_qp(struct sx_qp *q) {
	if (!softefa_trap_covers(q->context->cmd_fd, q->handle))
		kick(q->context->cmd_fd, q->handle);
}

static int w_post_send(void *qp, void *wr, void **bad) {
	int r = orig_post_send(qp, wr, bad);
	kick_qp(qp);
	return r;
}

static int w_post_recv(void *qp, void *wr, void **bad) {
	int r = orig_post_recv(qp, wr, bad);
	struct sx_qp *q = qp;
	if (softefa_trap_covers(q->context->cmd_fd, q->handle))
		return r;
	if (on_hostdev)
		softefa_hostdev_kick_recv(q->context->cmd_fd, q->handle); // (never waits: never lingers)
	else
		kick(q->context->cmd_fd, q->handle);
	return r;
}

static int w_poll_cq(void *cq, int n, void *wc) {
	int r = orig_poll_cq(cq, n, wc);
	if (r == 0 && n > 0 && poll_net())
		r = orig_poll_cq(cq, n, wc);
	return r;
}

static int w_start_poll(void *cq, void *attr) {
	int r = orig_start_poll(cq, attr);
	if (r == ENOENT && poll_net())
		r = orig_start_poll(cq, attr);
	return r;
}

static int w_req_notify(void *cq, int solicited_only) {
	int r = orig_req_notify(cq, solicited_only);
	struct sx_cq *c = cq;
	if (r == 0)
		arm(c->context->cmd_fd, c->handle);
	return r;
}

static int w_wr_complete(void *qpx) {
	int r = orig_wr_complete(qpx);
	kick_qp(qpx); // qp_base is first
	return r;
}

// swap replaces *slot with wrapper, remembering the original; a second, different original (a
// context of another provider cannot reach here) leaves the slot alone.
static void swap(void **slot, void **orig, void *wrapper) {
	static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
	pthread_mutex_lock(&mu);
	if (*slot && *slot != wrapper && (!*orig || *orig == *slot)) {
		*orig = *slot;
		*slot = wrapper;
	}
	pthread_mutex_unlock(&mu);
}

// lib_sym finds a function of an rdma-core library: next in the global scope, or in the library
// itself when it was loaded into a local scope (Python extension modules are dlopen'ed
// RTLD_LOCAL, and pyverbs' efa module brings libefa so: its calls reach this shim, which is in the
// global scope, while RTLD_NEXT cannot see libefa). RTLD_NOLOAD finds the copy already loaded;
// the reference it takes is kept, so that the pointer, which callers cache, stays valid.
static void *lib_sym(const char *lib, const char *name, const char *version) {
	void *p = dlsym(RTLD_NEXT, name);
	if (!p) {
		void *h = dlopen(lib, RTLD_NOLOAD | RTLD_LAZY);
		if (h)
			p = dlvsym(h, name, version);
	}
	return p;
}

static void *verbs_sym(const char *name, const char *version) {
	return lib_sym("libibverbs.so.1", name, version);
}

void *ibv_open_device(void *device) {
	static void *(*real)(void *);
	if (!real)
		real = (void *(*)(void *))verbs_sym("ibv_open_device", "IBVERBS_1.1");
	if (!real) {
		errno = ENOSYS;
		return NULL;
	}
	struct sx_context *ctx = real(device);
	if (ctx && ours(ctx->cmd_fd)) {
		swap(&ctx->ops[OP_POST_SEND], (void **)&orig_post_send, (void *)w_post_send);
		swap(&ctx->ops[OP_POST_RECV], (void **)&orig_post_recv, (void *)w_post_recv);
		swap(&ctx->ops[OP_REQ_NOTIFY_CQ], (void **)&orig_req_notify, (void *)w_req_notify);
		swap(&ctx->ops[OP_POLL_CQ], (void **)&orig_poll_cq, (void *)w_poll_cq);
	}
	return ctx;
}

void *ibv_qp_to_qp_ex(void *qp) {
	static void *(*real)(void *);
	if (!real)
		real = (void *(*)(void *))verbs_sym("ibv_qp_to_qp_ex", "IBVERBS_1.6");
	if (!real) {
		errno = ENOSYS;
		return NULL;
	}
	struct sx_qp_ex *qpx = real(qp);
	struct sx_qp *q = qp;
	if (qpx && ours(q->context->cmd_fd))
		swap(&qpx->fns[QPX_WR_COMPLETE], (void **)&orig_wr_complete, (void *)w_wr_complete);
	return qpx;
}

void *efadv_create_cq(void *ibvctx, void *attr_ex, void *efa_attr, uint32_t inlen) {
	static void *(*real)(void *, void *, void *, uint32_t);
	if (!real)
		real = (void *(*)(void *, void *, void *, uint32_t))lib_sym("libefa.so.1", "efadv_create_cq", "EFA_1.2");
	if (!real) {
		errno = EOPNOTSUPP;
		return NULL;
	}
	struct sx_cq_ex *cq = real(ibvctx, attr_ex, efa_attr, inlen);
	if (cq && ours(cq->context->cmd_fd))
		swap(&cq->start_poll, (void **)&orig_start_poll, (void *)w_start_poll);
	return cq;
}
