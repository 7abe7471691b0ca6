// The program's file: what softefa run tells the shim and the engine (where the device node and
// the engine library are, which device this is, its settings), one "key=value" line a field, in
// the file SOFTEFA_CONF names (docs/settings.md, "The program's file"; cabi.Conf writes it). It
// is read once, at the first lookup (the shim's constructors make it), through libc's syscall
// itself, not the shim's wrappers (preload.c), which look things up here. The lines are taken as
// cabi.Conf takes them, but only the values the shim uses are looked at: the engine checks them
// all. An empty value is no value, as cabi.Conf has it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#define CONF_MAX 16384 // bytes, less one, at most (as cabi.Conf): the file is a few hundred
#define CONF_LINES 64  // as cabi.Conf (confLines)

extern char **environ;

// The keys cabi.Conf knows: a file with another is refused, as the engine refuses it.
static const char *const known[] = {
	"engine", "dev-path", "dev-rdev", "name", "part-id", "device", "addr", "sysfs-root",
	"ip", "paths", "rx-spin", "no-sparse-copies", "no-offload", "debug",
};

static char text[CONF_MAX + 1];
static const char *keys[CONF_LINES], *values[CONF_LINES];
static int nkeys;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic int loaded;    // keys and values are final
static __thread int in_load;  // this thread is reading the file: a lookup finds nothing
static long (*sys)(long, ...); // libc's syscall

// conf_path is SOFTEFA_CONF's value, looked up in environ itself (not through the shim's getenv).
static const char *conf_path(void) {
	static const char name[] = "SOFTEFA_CONF=";
	for (char **e = environ; e && *e; e++)
		if (strncmp(*e, name, sizeof(name) - 1) == 0)
			return *e + sizeof(name) - 1;
	return NULL;
}

// conf_read fills text with the file at path; the length, or -errno.
static long conf_read(const char *path) {
	sys = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
	if (!sys)
		return -ENOSYS;
	int fd = (int)sys(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	long n = 0;
	while (n < CONF_MAX) {
		long r = sys(SYS_read, fd, text + n, CONF_MAX - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			n = -errno;
			break;
		}
		if (r == 0)
			break;
		n += r;
	}
	if (n == CONF_MAX)
		n = -EFBIG;
	sys(SYS_close, fd);
	return n;
}

static int is_known(const char *key) {
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
		if (strcmp(key, known[i]) == 0)
			return 1;
	return 0;
}

// conf_parse splits text (n bytes) into its lines' keys and values; NULL, or why the file is
// refused, with the line's number in *line.
static const char *conf_parse(long n, int *line) {
	if (memchr(text, 0, (size_t)n))
		return "a NUL in the program's file";
	text[n] = 0;
	*line = 0;
	for (char *p = text; *p;) {
		char *end = strchr(p, '\n');
		if (end)
			*end = 0;
		++*line;
		if (*p) {
			char *eq = strchr(p, '=');
			if (!eq)
				return "want key=value";
			if (nkeys == CONF_LINES)
				return "more than 64 lines";
			*eq = 0;
			if (!is_known(p))
				return "no such key";
			keys[nkeys] = p;
			values[nkeys++] = eq + 1;
		}
		if (!end)
			break;
		p = end + 1;
	}
	return NULL;
}

static void conf_load(void) {
	in_load = 1;
	nkeys = 0;
	const char *path = conf_path();
	if (path && *path) {
		long n = conf_read(path);
		int line = 0;
		const char *bad = n < 0 ? strerror((int)-n) : conf_parse(n, &line);
		if (bad) {
			// Without it the shim does nothing, and the program finds no softefa device.
			nkeys = 0;
			if (line)
				fprintf(stderr, "softefa: SOFTEFA_CONF=%s: line %d: %s\n", path, line, bad);
			else
				fprintf(stderr, "softefa: SOFTEFA_CONF=%s: %s\n", path, bad);
		}
	}
	in_load = 0;
	atomic_store(&loaded, 1);
}

// softefa_conf is the value of key in the program's file (its last line with key), or NULL, also
// for an empty value. Once the file is read (the shim's constructors see to that), a lookup takes
// no lock: signal handlers may make it.
const char *softefa_conf(const char *key) {
	if (!atomic_load(&loaded)) {
		if (in_load)
			return NULL; // from a wrapper that the reading itself went through
		pthread_once(&once, conf_load);
	}
	for (int i = nkeys - 1; i >= 0; i--)
		if (strcmp(keys[i], key) == 0)
			return *values[i] ? values[i] : NULL;
	return NULL;
}
