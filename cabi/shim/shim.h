// The preload shim's five parts: preload.c (the kernel surface, the ops wrappers), dbtrap.c (the
// doorbell traps, docs/cabi.md "Doorbells"), paths.c (the device's paths, docs/cabi.md "Paths"),
// hostdev.c (the host device's client, docs/architecture.md "The host device") and conf.c (the
// program's file, docs/settings.md "The program's file"), and what each gives the others.
#ifndef SOFTEFA_SHIM_H
#define SOFTEFA_SHIM_H

#include <stdint.h>

#define HIDDEN __attribute__((visibility("hidden")))

// From preload.c.
HIDDEN int softefa_shim_ours(int fd);        // fd is a device fd of this process's engine
HIDDEN int softefa_shim_forked(void);        // this is a child forked after the engine started
HIDDEN long softefa_shim_db_page(int fd, long long off); // the QP whose doorbell page off is, or -1
HIDDEN void softefa_shim_db_trapped(int fd, uint32_t handle, int trapped);
HIDDEN void softefa_shim_db_rung(int fd, uint32_t handle); // a trapped store to the QP's SQ doorbell: Kick
HIDDEN int softefa_shim_debug(void);         // debug=1 in the program's file: diagnostics on stderr
HIDDEN int softefa_shim_dev_fd(int fd);      // fd names the device node (this process's, or an orphan)
HIDDEN const char *softefa_shim_dev_path(void); // the node's path (dev-path); NULL: the shim is inert
// The tree the paths map into (SYSFS_PATH), or NULL; with make, a process without a device makes it first.
HIDDEN const char *softefa_shim_sysfs(int make);
HIDDEN void softefa_shim_counter_read(const char *path); // path, in the tree, is being opened

// From dbtrap.c.
HIDDEN void softefa_trap_install(void);              // once, after the engine is loaded
HIDDEN int softefa_trap_covers(int fd, uint32_t handle); // that QP's doorbell stores trap

// From hostdev.c: the engine's entry points (preload.c's eng_*) on the host device.
HIDDEN int softefa_hostdev_connect(const char *path); // 0, or -errno
HIDDEN int softefa_hostdev_open(int flags);
HIDDEN long softefa_hostdev_write(int fd, const void *buf, unsigned long n);
HIDDEN void softefa_hostdev_close(int fd);
HIDDEN void softefa_hostdev_kick_qp(int fd, uint32_t handle);
HIDDEN void softefa_hostdev_kick_recv(int fd, uint32_t handle);
HIDDEN void softefa_hostdev_arm_cq(int fd, uint32_t handle);
HIDDEN void softefa_hostdev_dup(int fd, int nfd);
HIDDEN int softefa_hostdev_sysfs(char *buf, unsigned long n);
HIDDEN void softefa_hostdev_sysfs_counter(const char *path);
HIDDEN int softefa_hostdev_ioctl(int fd, unsigned long req, void *arg);
HIDDEN int softefa_hostdev_netlink(int peer, uint32_t port, const void *buf, unsigned long n);
HIDDEN int64_t softefa_hostdev_db_page(int fd, int64_t off);
HIDDEN void softefa_hostdev_db_trapped(int fd, uint32_t handle, int trapped);
HIDDEN void softefa_hostdev_db_rung(int fd, uint32_t handle);
HIDDEN void softefa_hostdev_exit(void);
HIDDEN int softefa_hostdev_procs(int callers);

// From conf.c: the value of key in the program's file, or NULL.
HIDDEN const char *softefa_conf(const char *key);

// From paths.c.
// The path an *at call (dirfd, path) is to use: path mapped into the process's tree, in buf when
// it is; *dev says whether it names the device node.
HIDDEN const char *softefa_path_at(int dirfd, const char *path, char *buf, unsigned long n, int *dev);

#endif
