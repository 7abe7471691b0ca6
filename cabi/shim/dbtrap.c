// Doorbell traps (docs/cabi.md, "Doorbells"): a store to a QP's doorbell traps, as a hypervisor
// traps a guest's store to an MMIO doorbell, and the storing thread rings the engine itself before
// it goes on. That is how the engine notices a program that writes the rings and stores the
// doorbells itself (libfabric 2.x's efa provider), at once and without a thread that polls.
//
// The program's mapping of a QP's SQ doorbell page (libefa maps it from the device fd; the RQ
// doorbell has a page of its own, which is not trapped: delivery reads it) is made read-only; the
// shim keeps a writable mapping of the same page of its own (the alias). A store to the page
// faults. The SIGSEGV handler, installed in front of the Go runtime's and chaining to it (and to
// whatever the program installs later) for every other fault, decodes the faulting instruction (the
// MOV and XCHG stores compilers emit for an MMIO write), performs the store through the alias,
// steps the thread past the instruction and makes it call the engine's Kick for the QP when it
// leaves the handler: the handler rewrites the interrupted context so that the thread enters a
// trampoline that saves every register (the general ones, the flags and, with XSAVE, the vector
// state), calls into the engine as the program's own call would, restores them and returns to the
// instruction after the store. An instruction the decoder does not know runs with the page writable
// for one step (EFLAGS.TF); the SIGTRAP after it protects the page again and rings. (Nothing is
// missed when several threads store at once: a store that does not fault found the page writable,
// so some thread's step is under way, and that thread protects the page before it rings.)
//
// x86-64 only. Elsewhere, or when the process has a shadow stack (which the trampoline's return
// would violate), no page is protected, and the engine's doorbell watcher scans the doorbells
// instead (internal/uverbs, doorbell.go).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "shim.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <ucontext.h>

enum { PAGE = 4096, MAX_TRAPS = 4096, EFLAGS_TF = 0x100 };

// traps[0:ntraps] are the trapped mappings; a free slot has page 0. Slots are filled and emptied
// under traps_mu; the signal handlers read them without it (page is published last, with release
// order, and cleared first).
struct trap {
	_Atomic uintptr_t page; // the program's read-only mapping
	uint8_t *alias;         // the shim's writable mapping of the same page
	int fd;
	uint32_t handle;
};
static struct trap traps[MAX_TRAPS];
static _Atomic int ntraps;
static pthread_mutex_t traps_mu = PTHREAD_MUTEX_INITIALIZER;
static int trap_on;

// The handlers the shim chains to: the Go runtime's, then whatever the program installs (its
// sigaction and signal calls for SIGSEGV and SIGTRAP land here). Two copies each, flipped
// atomically, so that a handler never reads one half-written.
struct chained {
	struct sigaction act[2];
	_Atomic int cur;
};
static struct chained chain_segv, chain_trap;
static pthread_mutex_t chain_mu = PTHREAD_MUTEX_INITIALIZER;

static _Atomic uint64_t n_emulated, n_stepped;

// The trampoline's save area: XSAVE's size for the features the OS enabled, a multiple of 64.
__attribute__((used)) static uint64_t xsave_size;

// A thread stepping an instruction the decoder does not know: the page it made writable.
static __thread uintptr_t step_page __attribute__((tls_model("initial-exec")));
static __thread int step_fd __attribute__((tls_model("initial-exec")));
static __thread uint32_t step_handle __attribute__((tls_model("initial-exec")));

static void *(*real_mmap)(void *, size_t, int, int, int, off_t);
static int (*real_munmap)(void *, size_t);
static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);
static int (*real_sigprocmask)(int, const sigset_t *, sigset_t *);
static int (*real_pthread_sigmask)(int, const sigset_t *, sigset_t *);

static pthread_once_t resolved = PTHREAD_ONCE_INIT;

static void resolve_all(void) {
	real_munmap = (int (*)(void *, size_t))dlsym(RTLD_NEXT, "munmap");
	real_sigaction = (int (*)(int, const struct sigaction *, struct sigaction *))dlsym(RTLD_NEXT, "sigaction");
	real_sigprocmask = (int (*)(int, const sigset_t *, sigset_t *))dlsym(RTLD_NEXT, "sigprocmask");
	real_pthread_sigmask = (int (*)(int, const sigset_t *, sigset_t *))dlsym(RTLD_NEXT, "pthread_sigmask");
	real_mmap = (void *(*)(void *, size_t, int, int, int, off_t))dlsym(RTLD_NEXT, "mmap");
}

static void resolve(void) { pthread_once(&resolved, resolve_all); }

static struct trap *find(uintptr_t page) {
	int n = atomic_load_explicit(&ntraps, memory_order_acquire);
	for (int i = 0; i < n; i++)
		if (atomic_load_explicit(&traps[i].page, memory_order_acquire) == page)
			return &traps[i];
	return NULL;
}

static int remember(uintptr_t page, uint8_t *alias, int fd, uint32_t handle) {
	pthread_mutex_lock(&traps_mu);
	int n = atomic_load_explicit(&ntraps, memory_order_relaxed), i = 0;
	while (i < n && atomic_load_explicit(&traps[i].page, memory_order_relaxed))
		i++;
	if (i == MAX_TRAPS) {
		pthread_mutex_unlock(&traps_mu);
		return 0;
	}
	traps[i].alias = alias;
	traps[i].fd = fd;
	traps[i].handle = handle;
	atomic_store_explicit(&traps[i].page, page, memory_order_release);
	if (i == n)
		atomic_store_explicit(&ntraps, n + 1, memory_order_release);
	pthread_mutex_unlock(&traps_mu);
	return 1;
}

// forget drops the trapped mappings in [addr, addr+len), which the program is unmapping or
// mapping over. (A store to such a page racing with its munmap is the program's bug; here it may
// fault in the handler, which kills the process.)
static void forget(void *addr, size_t len) {
	if (!atomic_load_explicit(&ntraps, memory_order_acquire))
		return;
	uintptr_t lo = (uintptr_t)addr, hi = lo + len;
	pthread_mutex_lock(&traps_mu);
	int n = atomic_load_explicit(&ntraps, memory_order_relaxed);
	for (int i = 0; i < n; i++) {
		uintptr_t p = atomic_load_explicit(&traps[i].page, memory_order_relaxed);
		if (p && p + PAGE > lo && p < hi) {
			atomic_store_explicit(&traps[i].page, 0, memory_order_release);
			real_munmap(traps[i].alias, PAGE);
		}
	}
	pthread_mutex_unlock(&traps_mu);
}

int softefa_trap_covers(int fd, uint32_t handle) {
	if (!trap_on)
		return 0;
	int n = atomic_load_explicit(&ntraps, memory_order_acquire);
	for (int i = 0; i < n; i++)
		if (atomic_load_explicit(&traps[i].page, memory_order_acquire) && traps[i].fd == fd &&
		    traps[i].handle == handle)
			return 1;
	return 0;
}

// map_doorbell maps the SQ doorbell page of the QP with handle h read-only, with an alias, and
// tells the engine; when it cannot, it maps the page as asked and the engine's watcher scans it.
static void *map_doorbell(void *addr, size_t len, int prot, int flags, int fd, off_t off, long h) {
	void *p = real_mmap(addr, len, (prot & ~PROT_WRITE) | PROT_READ, flags, fd, off);
	if (p == MAP_FAILED)
		return p;
	uint8_t *alias = real_mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, off);
	if (alias != MAP_FAILED && remember((uintptr_t)p, alias, fd, (uint32_t)h)) {
		softefa_shim_db_trapped(fd, (uint32_t)h, 1);
		return p;
	}
	if (alias != MAP_FAILED)
		real_munmap(alias, PAGE);
	mprotect(p, len, prot);
	softefa_shim_db_trapped(fd, (uint32_t)h, 0);
	if (softefa_shim_debug())
		fprintf(stderr, "softefa: debug: QP %ld's doorbells are not trapped (%d traps); the watcher scans them\n", h, MAX_TRAPS);
	return p;
}

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off) {
	resolve();
	if (trap_on) {
		if (len == PAGE && (prot & PROT_WRITE) && (flags & MAP_SHARED) && softefa_shim_ours(fd)) {
			long h = softefa_shim_db_page(fd, (long long)off);
			if (h >= 0) {
				if (flags & MAP_FIXED)
					forget(addr, len);
				return map_doorbell(addr, len, prot, flags, fd, off, h);
			}
		}
		if (flags & MAP_FIXED)
			forget(addr, len);
	}
	return real_mmap(addr, len, prot, flags, fd, off);
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
	__attribute__((alias("mmap")));

int munmap(void *addr, size_t len) {
	resolve();
	if (trap_on)
		forget(addr, len);
	return real_munmap(addr, len);
}

// The general registers by their x86 numbers (ModRM), as ucontext's gregs index them.
static const int gpr[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
			    REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};

// emulate performs the store at rip that faulted on addr, through the alias of its page, and
// steps rip past it: MOV r/m, r (88, 89), MOV r/m, imm (C6 /0, C7 /0) and XCHG r/m, r (86, 87),
// with an operand-size, REX or LOCK prefix, any memory operand form. It returns 0, changing
// nothing, for any other instruction, or a store that is misaligned or leaves the page.
static int emulate(greg_t *g, uintptr_t addr, uint8_t *alias) {
	const uint8_t *p = (const uint8_t *)g[REG_RIP];
	int o16 = 0, rex = 0;
	for (int i = 0; i < 4; i++, p++) {
		if (*p == 0x66)
			o16 = 1;
		else if (*p != 0xf0)
			break;
	}
	if ((*p & 0xf0) == 0x40)
		rex = *p++;
	uint8_t op = *p++;
	int wide = (rex & 8) ? 8 : o16 ? 2 : 4, size, imm = 0, xchg = 0;
	switch (op) {
	case 0x86: xchg = 1; /* fall through */
	case 0x88: size = 1; break;
	case 0x87: xchg = 1; /* fall through */
	case 0x89: size = wide; break;
	case 0xc6: size = imm = 1; break;
	case 0xc7: size = wide, imm = wide == 2 ? 2 : 4; break;
	default: return 0;
	}
	uint8_t modrm = *p++;
	int mod = modrm >> 6, reg = (modrm >> 3) & 7, rm = modrm & 7;
	if (mod == 3 || (imm && reg != 0))
		return 0;
	if (rm == 4) {
		uint8_t sib = *p++;
		if (mod == 0 && (sib & 7) == 5)
			p += 4;
	} else if (mod == 0 && rm == 5) {
		p += 4; // RIP-relative
	}
	p += mod == 1 ? 1 : mod == 2 ? 4 : 0;
	uint64_t v;
	int r = reg | ((rex & 4) ? 8 : 0);
	int high8 = size == 1 && !rex && r >= 4 && r < 8; // AH, CH, DH, BH
	if (imm == 1)
		v = p[0];
	else if (imm == 2)
		v = (uint16_t)(p[0] | p[1] << 8);
	else if (imm == 4)
		v = (uint64_t)(int64_t)(int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
	else
		v = high8 ? (uint64_t)g[gpr[r - 4]] >> 8 : (uint64_t)g[gpr[r]];
	p += imm;
	unsigned off = addr & (PAGE - 1);
	if (off % size != 0)
		return 0;
	void *dst = alias + off;
	uint64_t old = 0;
	switch (size) {
	case 1:
		if (xchg)
			old = __atomic_exchange_n((uint8_t *)dst, (uint8_t)v, __ATOMIC_SEQ_CST);
		else
			__atomic_store_n((uint8_t *)dst, (uint8_t)v, __ATOMIC_RELEASE);
		break;
	case 2:
		if (xchg)
			old = __atomic_exchange_n((uint16_t *)dst, (uint16_t)v, __ATOMIC_SEQ_CST);
		else
			__atomic_store_n((uint16_t *)dst, (uint16_t)v, __ATOMIC_RELEASE);
		break;
	case 4:
		if (xchg)
			old = __atomic_exchange_n((uint32_t *)dst, (uint32_t)v, __ATOMIC_SEQ_CST);
		else
			__atomic_store_n((uint32_t *)dst, (uint32_t)v, __ATOMIC_RELEASE);
		break;
	default:
		if (xchg)
			old = __atomic_exchange_n((uint64_t *)dst, v, __ATOMIC_SEQ_CST);
		else
			__atomic_store_n((uint64_t *)dst, v, __ATOMIC_RELEASE);
	}
	if (xchg) { // the register gets the old value, as the instruction's width writes it
		uint64_t *x = (uint64_t *)&g[gpr[high8 ? r - 4 : r]];
		switch (size) {
		case 1:
			if (high8)
				*x = (*x & ~0xff00ull) | old << 8;
			else
				*x = (*x & ~0xffull) | old;
			break;
		case 2: *x = (*x & ~0xffffull) | old; break;
		case 4: *x = (uint32_t)old; break;
		default: *x = old;
		}
	}
	g[REG_RIP] = (greg_t)p;
	return 1;
}

// trap_rung is what the trampoline calls, as the program's own call into the engine would be,
// keeping the program's errno: the engine's Kick for the QP with handle h.
__attribute__((used)) static void trap_rung(int fd, uint64_t h) {
	int err = errno;
	softefa_shim_db_rung(fd, (uint32_t)h);
	errno = err;
}

// The trampoline a thread enters after its doorbell store. On entry rsp points at four words: the
// stack pointer to return with less 136, fd, the QP's handle (trap_rung), the address to return to.
// It saves the flags and every register the C calling convention lets trap_rung change (the
// callee-saved ones it keeps), and the extended state with XSAVE (the save area's header zeroed, as
// XRSTOR wants it), calls trap_rung, restores them, writes the return address just below the red
// zone of the stack it returns to (free again: the handler's frame is gone), switches to that stack
// (pop rsp) and returns past the red zone (ret $128), so that every register, the flags, the stack
// and the red zone are as the store left them.
void softefa_db_tramp(void);
__asm__(".text\n"
	".p2align 4\n"
	".type softefa_db_tramp, @function\n"
	".hidden softefa_db_tramp\n"
	".globl softefa_db_tramp\n"
	"softefa_db_tramp:\n"
	"	pushfq\n"
	"	cld\n"
	"	push %rax\n"
	"	push %rcx\n"
	"	push %rdx\n"
	"	push %rsi\n"
	"	push %rdi\n"
	"	push %r8\n"
	"	push %r9\n"
	"	push %r10\n"
	"	push %r11\n"
	"	push %rbp\n"
	"	mov %rsp, %rbp\n"
	"	and $-64, %rsp\n"
	"	sub xsave_size(%rip), %rsp\n"
	"	xor %eax, %eax\n"
	"	mov %rax, 512(%rsp)\n"
	"	mov %rax, 520(%rsp)\n"
	"	mov %rax, 528(%rsp)\n"
	"	mov %rax, 536(%rsp)\n"
	"	mov %rax, 544(%rsp)\n"
	"	mov %rax, 552(%rsp)\n"
	"	mov %rax, 560(%rsp)\n"
	"	mov %rax, 568(%rsp)\n"
	"	mov $-1, %eax\n"
	"	mov $-1, %edx\n"
	"	xsave64 (%rsp)\n"
	"	mov 96(%rbp), %edi\n"
	"	mov 104(%rbp), %rsi\n"
	"	call trap_rung\n"
	"	mov $-1, %eax\n"
	"	mov $-1, %edx\n"
	"	xrstor64 (%rsp)\n"
	"	mov 88(%rbp), %rax\n"
	"	mov 112(%rbp), %rcx\n"
	"	mov %rcx, (%rax)\n"
	"	mov %rbp, %rsp\n"
	"	pop %rbp\n"
	"	pop %r11\n"
	"	pop %r10\n"
	"	pop %r9\n"
	"	pop %r8\n"
	"	pop %rdi\n"
	"	pop %rsi\n"
	"	pop %rdx\n"
	"	pop %rcx\n"
	"	pop %rax\n"
	"	popfq\n"
	"	pop %rsp\n"
	"	ret $128\n"
	".size softefa_db_tramp, .-softefa_db_tramp\n");

// ring makes the interrupted thread enter the trampoline when the handler returns. The four words
// go 1 KiB below the handler's own frame when it runs on the thread's stack (the kernel's signal
// frame lies between the interrupted stack pointer and the handler's frame, and sigreturn reads
// it), otherwise 1 KiB below the interrupted stack pointer.
static void ring(ucontext_t *uc, int fd, uint32_t handle) {
	if (softefa_shim_forked())
		return; // the child's engine did not survive the fork: the store is all there is
	greg_t *g = uc->uc_mcontext.gregs;
	uintptr_t sp = (uintptr_t)g[REG_RSP], here = (uintptr_t)__builtin_frame_address(0);
	uintptr_t base = here < sp && sp - here < (1 << 16) ? here : sp;
	uint64_t *w = (uint64_t *)((base - 1024) & ~(uintptr_t)15);
	w[0] = sp - 136;
	w[1] = (uint64_t)fd;
	w[2] = handle;
	w[3] = (uint64_t)g[REG_RIP];
	g[REG_RSP] = (greg_t)w;
	g[REG_RIP] = (greg_t)softefa_db_tramp;
}

// chain hands a signal that is not a doorbell's to the handler installed before, or to the one
// the program installed since; with none (SIG_DFL, or SIG_IGN, which the kernel does not honour
// for a fault), the default action, as without the shim.
static void chain(struct chained *c, int sig, siginfo_t *si, void *uctx) {
	const struct sigaction *a = &c->act[atomic_load_explicit(&c->cur, memory_order_acquire)];
	if (a->sa_flags & SA_SIGINFO) {
		a->sa_sigaction(sig, si, uctx);
		return;
	}
	if (a->sa_handler != SIG_DFL && a->sa_handler != SIG_IGN) {
		a->sa_handler(sig);
		return;
	}
	struct sigaction dfl = {.sa_handler = SIG_DFL};
	real_sigaction(sig, &dfl, NULL);
	if (si->si_code <= 0 || sig == SIGTRAP)
		raise(sig); // not re-raised by running on: pending until the handler returns
}

static void on_segv(int sig, siginfo_t *si, void *uctx) {
	ucontext_t *uc = uctx;
	greg_t *g = uc->uc_mcontext.gregs;
	uintptr_t a = (uintptr_t)si->si_addr;
	struct trap *t;
	if (si->si_code == SEGV_ACCERR && (g[REG_ERR] & 2) && (t = find(a & ~(uintptr_t)(PAGE - 1)))) {
		int fd = t->fd;
		uint32_t handle = t->handle;
		if (emulate(g, a, t->alias)) {
			atomic_fetch_add_explicit(&n_emulated, 1, memory_order_relaxed);
			ring(uc, fd, handle);
			return;
		}
		step_page = a & ~(uintptr_t)(PAGE - 1);
		step_fd = fd;
		step_handle = handle;
		mprotect((void *)step_page, PAGE, PROT_READ | PROT_WRITE);
		g[REG_EFL] |= EFLAGS_TF;
		return;
	}
	chain(&chain_segv, sig, si, uctx);
}

static void on_trap(int sig, siginfo_t *si, void *uctx) {
	ucontext_t *uc = uctx;
	if (step_page) {
		uc->uc_mcontext.gregs[REG_EFL] &= ~EFLAGS_TF;
		mprotect((void *)step_page, PAGE, PROT_READ); // before ringing: see the top of the file
		step_page = 0;
		atomic_fetch_add_explicit(&n_stepped, 1, memory_order_relaxed);
		ring(uc, step_fd, step_handle);
		return;
	}
	chain(&chain_trap, sig, si, uctx);
}

// A program's sigaction or signal for SIGSEGV or SIGTRAP, once the traps are installed, replaces
// the handler chained to, not the shim's.
static int set_chained(struct chained *c, const struct sigaction *act, struct sigaction *old) {
	pthread_mutex_lock(&chain_mu);
	int cur = atomic_load_explicit(&c->cur, memory_order_relaxed);
	if (old)
		*old = c->act[cur];
	if (act) {
		c->act[!cur] = *act;
		atomic_store_explicit(&c->cur, !cur, memory_order_release);
	}
	pthread_mutex_unlock(&chain_mu);
	return 0;
}

static struct chained *chained_for(int sig) {
	if (!trap_on)
		return NULL;
	return sig == SIGSEGV ? &chain_segv : sig == SIGTRAP ? &chain_trap : NULL;
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
	resolve();
	struct chained *c = chained_for(sig);
	if (c)
		return set_chained(c, act, old);
	return real_sigaction(sig, act, old);
}

sighandler_t signal(int sig, sighandler_t h) {
	resolve();
	struct sigaction act = {.sa_handler = h, .sa_flags = SA_RESTART}, old;
	sigemptyset(&act.sa_mask);
	sigaddset(&act.sa_mask, sig);
	int r = chained_for(sig) ? set_chained(chained_for(sig), &act, &old) : real_sigaction(sig, &act, &old);
	return r < 0 ? SIG_ERR : old.sa_handler;
}

// A thread that blocks SIGSEGV or SIGTRAP and then stores to a doorbell would be killed by the
// kernel (a fault cannot wait), so, once the traps are installed, the program's sigprocmask and
// pthread_sigmask leave both unblocked, as the kernel leaves SIGKILL.
static const sigset_t *unblocked(int how, const sigset_t *set, sigset_t *buf) {
	if (!trap_on || !set || how == SIG_UNBLOCK)
		return set;
	*buf = *set;
	sigdelset(buf, SIGSEGV);
	sigdelset(buf, SIGTRAP);
	return buf;
}

int sigprocmask(int how, const sigset_t *set, sigset_t *old) {
	resolve();
	sigset_t buf;
	return real_sigprocmask(how, unblocked(how, set, &buf), old);
}

int pthread_sigmask(int how, const sigset_t *set, sigset_t *old) {
	resolve();
	sigset_t buf;
	return real_pthread_sigmask(how, unblocked(how, set, &buf), old);
}

// shadow_stack reports whether the process runs with a shadow stack (CET): the trampoline's
// return goes where no call came from, which one would stop.
static int shadow_stack(void) {
	char buf[4096];
	int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = 0;
	const char *l = strstr(buf, "x86_Thread_features:");
	const char *e = l ? strchr(l, '\n') : NULL;
	return l && e && memmem(l, (size_t)(e - l), "shstk", 5);
}

// atfork_child: a child forked while another thread held traps_mu would otherwise wait for it
// forever in its first mmap or munmap.
static void atfork_child(void) { traps_mu = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER; }

static void report(void) {
	fprintf(stderr, "softefa: debug: doorbell stores trapped: %llu emulated, %llu stepped\n",
		(unsigned long long)atomic_load(&n_emulated), (unsigned long long)atomic_load(&n_stepped));
}

static void off(const char *why) {
	if (softefa_shim_debug())
		fprintf(stderr, "softefa: debug: doorbell traps off (%s): the watcher scans the doorbells\n", why);
}

void softefa_trap_install(void) {
	resolve();
	unsigned a, b, c, d;
	if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE))
		return off("no XSAVE");
	if (shadow_stack())
		return off("shadow stack");
	__cpuid_count(0xd, 0, a, b, c, d);
	xsave_size = (b + 63) & ~63u;
	if (xsave_size < 576)
		return off("XSAVE area");
	struct sigaction sa = {.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART};
	sigfillset(&sa.sa_mask);
	sa.sa_sigaction = on_segv;
	if (real_sigaction(SIGSEGV, &sa, &chain_segv.act[0]) != 0)
		return off("sigaction");
	sa.sa_sigaction = on_trap;
	if (real_sigaction(SIGTRAP, &sa, &chain_trap.act[0]) != 0) {
		real_sigaction(SIGSEGV, &chain_segv.act[0], NULL);
		return off("sigaction");
	}
	trap_on = 1;
	pthread_atfork(NULL, NULL, atfork_child);
	if (softefa_shim_debug()) {
		fprintf(stderr, "softefa: debug: doorbell traps on (XSAVE area %llu bytes)\n", (unsigned long long)xsave_size);
		atexit(report);
	}
}

#else // not x86-64: no traps, the watcher scans the doorbells

void softefa_trap_install(void) {
	if (softefa_shim_debug())
		fprintf(stderr, "softefa: debug: doorbell traps off (x86-64 only): the watcher scans the doorbells\n");
}

int softefa_trap_covers(int fd, uint32_t handle) {
	(void)fd;
	(void)handle;
	return 0;
}

#endif
