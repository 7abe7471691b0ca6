// The paths of the device (docs/cabi.md, "Paths"): what a program finds under /dev/infiniband,
// /sys/class/infiniband, /sys/class/infiniband_verbs and the PCI device directory those link
// into is the process's own tree (cabi.Sysfs.Write), whose root stands for the file system's
// root. A path under one of the mapped directories below becomes the same path under the tree's
// root; the kernel then resolves it there, through the tree's own links, which are relative and
// shaped as the kernel's sysfs links are, so `..` and a link followed lead where they would on an
// EFA host. The device node is an empty file in the tree: the stat and access calls on it are
// answered here, and opening it O_RDWR opens the device (preload.c).
//
// Covered: what preload.c maps (open, openat and their 64-bit and fortified forms, the stat
// family and statx) and the calls below: fopen and freopen, access, faccessat (and glibc's
// faccessat2 system call behind it), euidaccess and eaccess, opendir and fdopendir (listings of
// the directories above the mapped ones show them), readdir (a listing of /dev/infiniband shows
// the node as a character device), scandir and scandirat, readlink and readlinkat, realpath and
// canonicalize_file_name (which answer the path as the host names it, not the tree's), chdir
// and getcwd, and the xattr reads ls -l makes. A relative path is mapped when it leads into
// one of these directories from a directory above it (a dirfd or the working directory on /sys,
// say) or climbs out of one; within the tree, the kernel resolves it. Not covered: calls glibc
// makes inside itself (nftw, glob, fts_open) and system calls made without glibc, which no
// preloaded library sees. Those made through glibc's syscall() are mapped by preload.c's.
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "shim.h"

// The mapped directories. The PCI address is the one cabi.Prepare gives the tree; the
// /sys/dev/char entry is named after the node's numbers (the file's dev-rdev).
static char dev_char[64], dev_char_name[32]; // /sys/dev/char/231:250, 231:250
static const char *mapped[] = {
	"/sys/class/infiniband",
	"/sys/class/infiniband_verbs",
	"/sys/devices/pci0000:00/0000:00:06.0",
	"/sys/bus/pci/drivers/efa",
	dev_char,
	"/dev/infiniband",
};

// The first components a relative path may start with to reach a mapped directory from one
// above it, or to climb out of one; any other relative path is left to the kernel without a look
// at its directory.
static const char *const steps[] = {
	"..", "sys", "dev", "class", "devices", "bus", "pci", "drivers", "efa", "char", "infiniband",
	"infiniband_verbs", "pci0000:00", "0000:00:06.0",
};

static const char *dev_base; // the node's name in /dev/infiniband

#define REAL_FN(ret, name, ...)                                                                    \
	static ret (*real_##name)(__VA_ARGS__);                                                    \
	static void resolve_##name(void) {                                                         \
		if (!real_##name)                                                                  \
			real_##name = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, #name);                \
	}

REAL_FN(long, syscall, long, ...)
REAL_FN(int, access, const char *, int)
REAL_FN(int, faccessat, int, const char *, int, int)
REAL_FN(int, euidaccess, const char *, int)
REAL_FN(int, eaccess, const char *, int)
REAL_FN(DIR *, opendir, const char *)
REAL_FN(DIR *, fdopendir, int)
REAL_FN(int, closedir, DIR *)
REAL_FN(void, rewinddir, DIR *)
REAL_FN(struct dirent *, readdir, DIR *)
REAL_FN(struct dirent64 *, readdir64, DIR *)
REAL_FN(int, scandir, const char *, struct dirent ***, int (*)(const struct dirent *),
	int (*)(const struct dirent **, const struct dirent **))
REAL_FN(int, scandir64, const char *, struct dirent64 ***, int (*)(const struct dirent64 *),
	int (*)(const struct dirent64 **, const struct dirent64 **))
REAL_FN(int, scandirat, int, const char *, struct dirent ***, int (*)(const struct dirent *),
	int (*)(const struct dirent **, const struct dirent **))
REAL_FN(ssize_t, readlink, const char *, char *, size_t)
REAL_FN(ssize_t, readlinkat, int, const char *, char *, size_t)
REAL_FN(ssize_t, __readlink_chk, const char *, char *, size_t, size_t)
REAL_FN(ssize_t, __readlinkat_chk, int, const char *, char *, size_t, size_t)
REAL_FN(char *, realpath, const char *, char *)
REAL_FN(char *, __realpath_chk, const char *, char *, size_t)
REAL_FN(char *, canonicalize_file_name, const char *)
REAL_FN(FILE *, fopen, const char *, const char *)
REAL_FN(FILE *, fopen64, const char *, const char *)
REAL_FN(FILE *, freopen, const char *, const char *, FILE *)
REAL_FN(FILE *, freopen64, const char *, const char *, FILE *)
REAL_FN(int, chdir, const char *)
REAL_FN(char *, getcwd, char *, size_t)
REAL_FN(ssize_t, getxattr, const char *, const char *, void *, size_t)
REAL_FN(ssize_t, lgetxattr, const char *, const char *, void *, size_t)
REAL_FN(ssize_t, listxattr, const char *, char *, size_t)
REAL_FN(ssize_t, llistxattr, const char *, char *, size_t)

__attribute__((constructor)) static void paths_init(void) {
	const char *r = softefa_conf("dev-rdev");
	unsigned maj, min;
	if (r && sscanf(r, "%u:%u", &maj, &min) == 2) {
		snprintf(dev_char, sizeof(dev_char), "/sys/dev/char/%u:%u", maj, min);
		snprintf(dev_char_name, sizeof(dev_char_name), "%u:%u", maj, min);
	} else {
		strcpy(dev_char, "/sys/dev/char/-");
		strcpy(dev_char_name, "-");
	}
}

static int is_dev(const char *path) {
	const char *d = softefa_shim_dev_path();
	return d && path && strcmp(path, d) == 0;
}

static const char *node_name(void) {
	if (!dev_base) {
		const char *d = softefa_shim_dev_path();
		const char *s = d ? strrchr(d, '/') : NULL;
		dev_base = s ? s + 1 : "";
	}
	return dev_base;
}

// is_mapped reports whether the absolute path p is a mapped directory or under one.
static int is_mapped(const char *p) {
	if (p[0] != '/' || (p[1] != 's' && p[1] != 'd'))
		return 0;
	for (size_t i = 0; i < sizeof(mapped) / sizeof(mapped[0]); i++) {
		size_t n = strlen(mapped[i]);
		if (strncmp(p, mapped[i], n) == 0 && (p[n] == 0 || p[n] == '/'))
			return 1;
	}
	return 0;
}

// tree_root is the directory that stands for "/" (SYSFS_PATH less its /sys), its length in *n;
// NULL when there is none. With make, a process that has no device yet makes it (the first
// lookup of SYSFS_PATH does); without, only a tree already made counts.
static const char *tree_root(int make, size_t *n) {
	const char *s = softefa_shim_sysfs(make);
	if (!s)
		return NULL;
	size_t l = strlen(s);
	if (l < 4 || strcmp(s + l - 4, "/sys") != 0)
		return NULL;
	*n = l - 4;
	return s;
}

// map_abs is p under the tree's root when p is absolute and mapped (in buf), else p. make is
// tree_root's.
static const char *map_abs(const char *p, char *buf, size_t n, int make) {
	size_t rl;
	const char *root;
	if (!is_mapped(p) || !(root = tree_root(make, &rl)))
		return p;
	if (rl + strlen(p) >= n)
		return p;
	memcpy(buf, root, rl);
	strcpy(buf + rl, p);
	return buf;
}

// in_tree is the path p names outside the tree when p is in the tree (the part after its root),
// or NULL. The tree is this process's, or, with per-process devices, any tree under
// the file's sysfs-root: a working directory or fd inherited from a parent is in the parent's.
static const char *in_tree(const char *p) {
	size_t rl;
	const char *root = tree_root(0, &rl);
	if (root && strncmp(p, root, rl) == 0 && (p[rl] == 0 || p[rl] == '/'))
		return p[rl] ? p + rl : "/";
	const char *all = softefa_conf("sysfs-root");
	size_t al = all ? strlen(all) : 0;
	if (!al || strncmp(p, all, al) != 0 || p[al] != '/')
		return NULL;
	const char *q = strchr(p + al + 1, '/'); // past the process's directory
	if (q && (strncmp(q, "/sys", 4) == 0 || strncmp(q, "/dev", 4) == 0) && (q[4] == 0 || q[4] == '/'))
		return q;
	return NULL;
}

// dir_path is the directory dirfd names (the working directory for AT_FDCWD), as the kernel
// has it, in buf.
static int dir_path(int dirfd, char *buf, size_t n) {
	resolve_syscall(); // the kernel's, not the shim's own (preload.c), which maps paths
	if (dirfd == AT_FDCWD)
		return real_syscall(SYS_getcwd, buf, n) > 0 ? 0 : -1;
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", dirfd);
	ssize_t l = real_syscall(SYS_readlinkat, AT_FDCWD, proc, buf, n - 1);
	if (l <= 0)
		return -1;
	buf[l] = 0;
	return buf[0] == '/' ? 0 : -1;
}

static int first_step(const char *p) {
	size_t n = strcspn(p, "/");
	const char *base = node_name();
	if (n == strlen(base) && strncmp(p, base, n) == 0)
		return 1;
	for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++)
		if (strlen(steps[i]) == n && strncmp(p, steps[i], n) == 0)
			return 1;
	return 0;
}

// clean makes the absolute path p lexical: no empty, "." or ".." components (".." at the root
// stays at the root), in place.
static void clean(char *p) {
	char *w = p;
	for (const char *r = p; *r;) {
		while (*r == '/')
			r++;
		size_t n = strcspn(r, "/");
		if (n == 0 || (n == 1 && r[0] == '.')) {
			r += n;
			continue;
		}
		if (n == 2 && r[0] == '.' && r[1] == '.') {
			while (w > p && *--w != '/')
				;
			r += n;
			continue;
		}
		*w++ = '/';
		memmove(w, r, n);
		w += n;
		r += n;
	}
	if (w == p)
		*w++ = '/';
	*w = 0;
}

const char *softefa_path_at(int dirfd, const char *path, char *buf, unsigned long n, int *dev) {
	*dev = 0;
	if (!softefa_shim_dev_path() || !path)
		return path;
	if (path[0] == '/') { // the node itself makes no device: libibverbs looks for one first
		*dev = is_dev(path);
		return map_abs(path, buf, n, !*dev);
	}
	if (!*path || !first_step(path))
		return path;
	char dir[PATH_MAX], full[PATH_MAX];
	if (dir_path(dirfd, dir, sizeof(dir)) < 0)
		return path;
	const char *shown = in_tree(dir);
	const char *d = shown ? shown : dir;
	if (snprintf(full, sizeof(full), "%s/%s", strcmp(d, "/") == 0 ? "" : d, path) >= (int)sizeof(full))
		return path;
	clean(full);
	*dev = is_dev(full);
	if (shown) {
		// In the tree: the kernel resolves the rest there, unless it climbs out of the mapped
		// directories, whose parents are the host's (fts climbs back with "..").
		if (is_mapped(full) || strlen(full) >= n)
			return path;
		return strcpy(buf, full);
	}
	const char *m = map_abs(full, buf, n, !*dev);
	return m == full ? path : m;
}

// host_name turns p, a path the kernel gave in the tree, into the one it stands for, in place.
static void host_name(char *p) {
	const char *h = p ? in_tree(p) : NULL;
	if (h && h != p)
		memmove(p, h, strlen(h) + 1);
}

#define MAP_AT(dirfd, path)                                                                        \
	char mapbuf_[PATH_MAX];                                                                    \
	int isdev_;                                                                                \
	path = softefa_path_at(dirfd, path, mapbuf_, sizeof(mapbuf_), &isdev_)

// The node is crw-rw-rw-: anyone may read and write it, nobody execute it.
static int node_access(int mode) {
	if (mode & X_OK) {
		errno = EACCES;
		return -1;
	}
	return 0;
}

int access(const char *path, int mode) {
	MAP_AT(AT_FDCWD, path);
	if (isdev_)
		return node_access(mode);
	resolve_access();
	return real_access(path, mode);
}

int faccessat(int dirfd, const char *path, int mode, int flags) {
	MAP_AT(dirfd, path);
	if (isdev_ || ((flags & AT_EMPTY_PATH) && path && !*path && softefa_shim_dev_fd(dirfd)))
		return node_access(mode);
	resolve_faccessat();
	return real_faccessat(dirfd, path, mode, flags);
}

int euidaccess(const char *path, int mode) {
	MAP_AT(AT_FDCWD, path);
	if (isdev_)
		return node_access(mode);
	resolve_euidaccess();
	return real_euidaccess(path, mode);
}

int eaccess(const char *path, int mode) {
	MAP_AT(AT_FDCWD, path);
	if (isdev_)
		return node_access(mode);
	resolve_eaccess();
	return real_eaccess(path, mode);
}

// Listings of the directories above the mapped ones show them, as the host's would: /sys/class
// lists infiniband and infiniband_verbs, /dev lists infiniband, and so on, after the host's own
// entries (an entry the host has already is not shown twice). A listing is the stream of one
// DIR made by opendir or fdopendir of such a directory; readdir gives the added entries when the
// host's run out.
struct parent {
	const char *dir, *name;
	unsigned char type;
};
static const struct parent parents[] = {
	{"/sys/class", "infiniband", DT_DIR},
	{"/sys/class", "infiniband_verbs", DT_DIR},
	{"/sys/devices/pci0000:00", "0000:00:06.0", DT_DIR},
	{"/sys/bus/pci/drivers", "efa", DT_DIR},
	{"/sys/dev/char", dev_char_name, DT_LNK},
	{"/dev", "infiniband", DT_DIR},
};
enum { NPARENTS = sizeof(parents) / sizeof(parents[0]), MAX_LISTINGS = 64 };

struct listing {
	DIR *dir;
	const char *path; // the parent's dir
	unsigned seen;    // parents[i] the host listed, or that were given already
	struct dirent ent;
};
static struct listing listings[MAX_LISTINGS];
static _Atomic int nlistings; // listings in use: readdir looks only when there are some
static pthread_mutex_t listings_mu = PTHREAD_MUTEX_INITIALIZER;

static const char *parent_dir(const char *path) {
	for (size_t i = 0; i < NPARENTS; i++)
		if (strcmp(path, parents[i].dir) == 0)
			return parents[i].dir;
	return NULL;
}

// listed registers dir, a stream of the directory path, when path is a parent.
static DIR *listed(DIR *dir, const char *path) {
	const char *p;
	if (!dir || !softefa_shim_dev_path() || !(p = parent_dir(path)))
		return dir;
	pthread_mutex_lock(&listings_mu);
	for (int i = 0; i < MAX_LISTINGS; i++)
		if (!listings[i].dir) {
			listings[i] = (struct listing){.dir = dir, .path = p};
			atomic_fetch_add(&nlistings, 1);
			break;
		} // (more than MAX_LISTINGS at once: the host's entries alone)
	pthread_mutex_unlock(&listings_mu);
	return dir;
}

// listing_of is dir's listing, or NULL; called with listings_mu held.
static struct listing *listing_of(DIR *dir) {
	for (int i = 0; i < MAX_LISTINGS; i++)
		if (listings[i].dir == dir)
			return &listings[i];
	return NULL;
}

// listing_next notes e, the host's next entry of l's directory, or, at the end (e NULL), gives
// the next parent entry the host did not list.
static struct dirent *listing_next(struct listing *l, struct dirent *e) {
	for (size_t i = 0; i < NPARENTS; i++) {
		if (l->path != parents[i].dir || (l->seen & 1u << i))
			continue;
		if (e) {
			if (strcmp(e->d_name, parents[i].name) == 0)
				l->seen |= 1u << i;
			continue;
		}
		l->seen |= 1u << i;
		memset(&l->ent, 0, sizeof(l->ent));
		l->ent.d_ino = 1 + i;
		l->ent.d_reclen = sizeof(l->ent);
		l->ent.d_type = parents[i].type;
		strncpy(l->ent.d_name, parents[i].name, sizeof(l->ent.d_name) - 1);
		return &l->ent;
	}
	return e;
}

DIR *opendir(const char *path) {
	const char *given = path;
	MAP_AT(AT_FDCWD, path);
	if (isdev_) {
		errno = ENOTDIR;
		return NULL;
	}
	resolve_opendir();
	return listed(real_opendir(path), given);
}

DIR *fdopendir(int fd) {
	resolve_fdopendir();
	DIR *d = real_fdopendir(fd);
	char dir[PATH_MAX];
	if (d && softefa_shim_dev_path() && dir_path(fd, dir, sizeof(dir)) == 0)
		listed(d, dir);
	return d;
}

int closedir(DIR *dir) {
	pthread_mutex_lock(&listings_mu);
	struct listing *l = listing_of(dir);
	if (l) {
		l->dir = NULL;
		atomic_fetch_sub(&nlistings, 1);
	}
	pthread_mutex_unlock(&listings_mu);
	resolve_closedir();
	return real_closedir(dir);
}

void rewinddir(DIR *dir) {
	if (atomic_load_explicit(&nlistings, memory_order_relaxed)) {
		pthread_mutex_lock(&listings_mu);
		struct listing *l = listing_of(dir);
		if (l)
			l->seen = 0;
		pthread_mutex_unlock(&listings_mu);
	}
	resolve_rewinddir();
	real_rewinddir(dir);
}

// node_dir reports whether fd is the tree's /dev/infiniband.
static int node_dir(int fd) {
	char dir[PATH_MAX];
	const char *h;
	return fd >= 0 && dir_path(fd, dir, sizeof(dir)) == 0 && (h = in_tree(dir)) && strcmp(h, "/dev/infiniband") == 0;
}

// node_entry reports whether a directory entry of dir is the stand-in for the device node.
static int node_entry(const char *name, unsigned char type, DIR *dir) {
	return type == DT_REG && softefa_shim_dev_path() && strcmp(name, node_name()) == 0 && node_dir(dirfd(dir));
}

// listed_next is what readdir gives after the host's entry e of dir (listing_next).
static struct dirent *listed_next(DIR *dir, struct dirent *e) {
	if (!atomic_load_explicit(&nlistings, memory_order_relaxed))
		return e;
	pthread_mutex_lock(&listings_mu);
	struct listing *l = listing_of(dir);
	if (l)
		e = listing_next(l, e);
	pthread_mutex_unlock(&listings_mu);
	return e;
}

// readdir64 is readdir on x86-64 and arm64 (glibc makes one an alias of the other).
_Static_assert(sizeof(struct dirent) == sizeof(struct dirent64), "dirent layout");

struct dirent *readdir(DIR *dir) {
	resolve_readdir();
	struct dirent *e = real_readdir(dir);
	if (e && node_entry(e->d_name, e->d_type, dir))
		e->d_type = DT_CHR;
	return listed_next(dir, e);
}

struct dirent64 *readdir64(DIR *dir) {
	resolve_readdir64();
	struct dirent64 *e = real_readdir64(dir);
	if (e && node_entry(e->d_name, e->d_type, dir))
		e->d_type = DT_CHR;
	return (struct dirent64 *)listed_next(dir, (struct dirent *)e);
}

// glibc's scandir lists with its own opendir and readdir, which are not interposed: the
// directory is mapped here and the listing finished after (scanned).
static int is_node_dir(const char *mapped_path) {
	const char *h = in_tree(mapped_path);
	return h && strcmp(h, "/dev/infiniband") == 0;
}

typedef int (*scan_filter)(const struct dirent *);
typedef int (*scan_compar)(const struct dirent **, const struct dirent **);

// scanned finishes scandir's listing of given (as the program named it; path as mapped), the r
// entries in *list: the node's entry is typed DT_CHR, and a listing of a directory above the
// mapped ones gets their entries the host lacks, filtered and sorted as scandir would.
static int scanned(const char *given, const char *path, struct dirent ***list, int r, scan_filter filter,
		   scan_compar compar) {
	if (r < 0 || path[0] != '/')
		return r;
	if (is_node_dir(path))
		for (int i = 0; i < r; i++)
			if ((*list)[i]->d_type == DT_REG && strcmp((*list)[i]->d_name, node_name()) == 0)
				(*list)[i]->d_type = DT_CHR;
	const char *p = parent_dir(given);
	int added = 0;
	for (size_t i = 0; p && i < NPARENTS; i++) {
		int listed = parents[i].dir != p;
		for (int j = 0; j < r && !listed; j++)
			listed = strcmp((*list)[j]->d_name, parents[i].name) == 0;
		if (listed)
			continue;
		struct dirent *e = calloc(1, sizeof(*e));
		struct dirent **grown = e ? realloc(*list, (r + 1) * sizeof(*grown)) : NULL;
		if (!grown) {
			free(e);
			break;
		}
		*list = grown;
		e->d_ino = 1 + i;
		e->d_reclen = sizeof(*e);
		e->d_type = parents[i].type;
		strncpy(e->d_name, parents[i].name, sizeof(e->d_name) - 1);
		if (filter && !filter(e)) {
			free(e);
			continue;
		}
		(*list)[r++] = e;
		added = 1;
	}
	if (added && compar)
		qsort(*list, r, sizeof(**list), (int (*)(const void *, const void *))compar);
	return r;
}

int scandir(const char *path, struct dirent ***list, scan_filter filter, scan_compar compar) {
	const char *given = path;
	MAP_AT(AT_FDCWD, path);
	resolve_scandir();
	return scanned(given, path, list, real_scandir(path, list, filter, compar), filter, compar);
}

int scandir64(const char *path, struct dirent64 ***list, int (*filter)(const struct dirent64 *),
	      int (*compar)(const struct dirent64 **, const struct dirent64 **)) {
	const char *given = path;
	MAP_AT(AT_FDCWD, path);
	resolve_scandir64();
	return scanned(given, path, (struct dirent ***)list, real_scandir64(path, list, filter, compar),
		       (scan_filter)filter, (scan_compar)compar);
}

int scandirat(int dirfd, const char *path, struct dirent ***list, int (*filter)(const struct dirent *),
	      int (*compar)(const struct dirent **, const struct dirent **)) {
	MAP_AT(dirfd, path);
	resolve_scandirat();
	return real_scandirat(dirfd, path, list, filter, compar);
}

ssize_t readlink(const char *path, char *buf, size_t n) {
	MAP_AT(AT_FDCWD, path);
	resolve_readlink();
	return real_readlink(path, buf, n);
}

ssize_t readlinkat(int dirfd, const char *path, char *buf, size_t n) {
	MAP_AT(dirfd, path);
	resolve_readlinkat();
	return real_readlinkat(dirfd, path, buf, n);
}

ssize_t __readlink_chk(const char *path, char *buf, size_t n, size_t buflen) {
	MAP_AT(AT_FDCWD, path);
	resolve___readlink_chk();
	return real___readlink_chk(path, buf, n, buflen);
}

ssize_t __readlinkat_chk(int dirfd, const char *path, char *buf, size_t n, size_t buflen) {
	MAP_AT(dirfd, path);
	resolve___readlinkat_chk();
	return real___readlinkat_chk(dirfd, path, buf, n, buflen);
}

// realpath and its kin resolve the mapped path in the tree (glibc resolves it with calls of its
// own, which are not interposed) and answer it as the host names it.
char *realpath(const char *path, char *resolved) {
	MAP_AT(AT_FDCWD, path);
	resolve_realpath();
	char *r = real_realpath(path, resolved);
	host_name(r);
	return r;
}

char *__realpath_chk(const char *path, char *resolved, size_t len) {
	MAP_AT(AT_FDCWD, path);
	resolve___realpath_chk();
	char *r = real___realpath_chk(path, resolved, len);
	host_name(r);
	return r;
}

char *canonicalize_file_name(const char *path) {
	MAP_AT(AT_FDCWD, path);
	resolve_canonicalize_file_name();
	char *r = real_canonicalize_file_name(path);
	host_name(r);
	return r;
}

// fopen opens with glibc's own open, which is not interposed. The node opened so is the device
// (open_dev in preload.c, through this library's open).
static FILE *node_fopen(const char *path, const char *mode) {
	int flags = strchr(mode, '+') ? O_RDWR : mode[0] == 'r' ? O_RDONLY : O_WRONLY;
	int fd = open(path, flags | (strchr(mode, 'e') ? O_CLOEXEC : 0));
	FILE *f = fd < 0 ? NULL : fdopen(fd, mode);
	if (fd >= 0 && !f)
		close(fd);
	return f;
}

FILE *fopen(const char *path, const char *mode) {
	const char *given = path;
	MAP_AT(AT_FDCWD, path);
	if (isdev_)
		return node_fopen(given, mode);
	softefa_shim_counter_read(path);
	resolve_fopen();
	return real_fopen(path, mode);
}

FILE *fopen64(const char *path, const char *mode) {
	const char *given = path;
	MAP_AT(AT_FDCWD, path);
	if (isdev_)
		return node_fopen(given, mode);
	softefa_shim_counter_read(path);
	resolve_fopen64();
	return real_fopen64(path, mode);
}

FILE *freopen(const char *path, const char *mode, FILE *f) {
	MAP_AT(AT_FDCWD, path);
	softefa_shim_counter_read(path);
	resolve_freopen();
	return real_freopen(path, mode, f);
}

FILE *freopen64(const char *path, const char *mode, FILE *f) {
	MAP_AT(AT_FDCWD, path);
	softefa_shim_counter_read(path);
	resolve_freopen64();
	return real_freopen64(path, mode, f);
}

int chdir(const char *path) {
	MAP_AT(AT_FDCWD, path);
	resolve_chdir();
	return real_chdir(path);
}

char *getcwd(char *buf, size_t n) {
	resolve_getcwd();
	char *r = real_getcwd(buf, n);
	if (r && softefa_shim_dev_path())
		host_name(r);
	return r;
}

// ls -l asks for a file's ACL and security label. The node has neither.
ssize_t getxattr(const char *path, const char *name, void *v, size_t n) {
	MAP_AT(AT_FDCWD, path);
	if (isdev_) {
		errno = ENODATA;
		return -1;
	}
	resolve_getxattr();
	return real_getxattr(path, name, v, n);
}

ssize_t lgetxattr(const char *path, const char *name, void *v, size_t n) {
	MAP_AT(AT_FDCWD, path);
	if (isdev_) {
		errno = ENODATA;
		return -1;
	}
	resolve_lgetxattr();
	return real_lgetxattr(path, name, v, n);
}

ssize_t listxattr(const char *path, char *list, size_t n) {
	MAP_AT(AT_FDCWD, path);
	if (isdev_)
		return 0;
	resolve_listxattr();
	return real_listxattr(path, list, n);
}

ssize_t llistxattr(const char *path, char *list, size_t n) {
	MAP_AT(AT_FDCWD, path);
	if (isdev_)
		return 0;
	resolve_llistxattr();
	return real_llistxattr(path, list, n);
}
