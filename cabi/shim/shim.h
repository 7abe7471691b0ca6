// The preload shim's two parts: preload.c (the kernel surface, the ops wrappers) and dbtrap.c (the
// doorbell traps, docs/cabi.md "Doorbells"), and what each gives the other.
#ifndef SOFTEFA_SHIM_H
#define SOFTEFA_SHIM_H

#include <stdint.h>

#define HIDDEN __attribute__((visibility("hidden")))

// From preload.c.
HIDDEN int softefa_shim_ours(int fd);        // fd is a device fd of this process's engine
HIDDEN int softefa_shim_forked(void);        // this is a child forked after the engine started
HIDDEN long softefa_shim_db_page(int fd, long long off); // the QP whose doorbell page off is, or -1
HIDDEN void softefa_shim_db_trapped(int fd, uint32_t handle, int trapped);
HIDDEN long long softefa_shim_db_rung(int fd, uint32_t handle); // Kick; the CQs to guard (send | recv<<32), or -1
HIDDEN long softefa_shim_cq_ring(int fd, long long off);       // the CQ whose ring off is, or -1
HIDDEN void softefa_shim_await_cq(int fd, uint32_t handle, uint64_t off); // poll until the entry at off is written
HIDDEN int softefa_shim_debug(void);         // SOFTEFA_DEBUG=1: diagnostics on stderr

// From dbtrap.c.
HIDDEN void softefa_trap_install(void);              // once, after the engine is loaded
HIDDEN int softefa_trap_covers(int fd, uint32_t handle); // that QP's doorbell stores trap
HIDDEN void softefa_trap_forget_fd(int fd);          // fd is being closed: drop its CQ mappings

#endif
