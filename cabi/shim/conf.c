// The program's file: what softefa run tells the shim and the engine (where the device node and
// the engine library are, which device this is, its settings), one "key=value" line a field, in
// the file SOFTEFA_CONF names (docs/settings.md, "The program's file"; cabi.Conf writes it). It
// is read once, before the shim's other constructors run, with the kernel's calls rather than
// libc's interposed ones; after that softefa_conf is a lookup in memory, safe anywhere (a signal
// handler included).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "shim.h"

#define CONF_MAX 16384 // bytes: the file is a few hundred
#define CONF_KEYS 32

extern char **environ;

static char text[CONF_MAX + 1];
static const char *keys[CONF_KEYS], *values[CONF_KEYS];
static int nkeys;

// conf_path is SOFTEFA_CONF's value, looked up in environ itself: the shim's getenv is not yet
// ready.
static const char *conf_path(void) {
	static const char name[] = "SOFTEFA_CONF=";
	for (char **e = environ; e && *e; e++)
		if (strncmp(*e, name, sizeof(name) - 1) == 0)
			return *e + sizeof(name) - 1;
	return NULL;
}

// conf_read fills text with the file at path; the length, or -errno.
static long conf_read(const char *path) {
	int fd = (int)syscall(SYS_openat, AT_FDCWD, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	long n = 0;
	while (n < CONF_MAX) {
		long r = syscall(SYS_read, fd, text + n, CONF_MAX - n);
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
	syscall(SYS_close, fd);
	return n;
}

// conf_parse splits text (n bytes) into its lines' keys and values; 0, or the number of the
// first line that is not "key=value".
static int conf_parse(long n) {
	text[n] = 0;
	int line = 0;
	for (char *p = text; *p;) {
		char *end = strchr(p, '\n');
		if (end)
			*end = 0;
		line++;
		if (*p) {
			char *eq = strchr(p, '=');
			if (!eq || eq == p || nkeys == CONF_KEYS)
				return line;
			*eq = 0;
			keys[nkeys] = p;
			values[nkeys++] = eq + 1;
		}
		if (!end)
			break;
		p = end + 1;
	}
	return 0;
}

__attribute__((constructor(101))) static void conf_init(void) {
	const char *path = conf_path();
	if (!path || !*path)
		return;
	long n = conf_read(path);
	int bad = n < 0 ? 0 : conf_parse(n);
	if (n < 0 || bad) {
		// Without it the shim does nothing, and the program finds no softefa device.
		nkeys = 0;
		if (n < 0)
			fprintf(stderr, "softefa: SOFTEFA_CONF=%s: %s\n", path, strerror((int)-n));
		else
			fprintf(stderr, "softefa: SOFTEFA_CONF=%s: line %d: want key=value\n", path, bad);
	}
}

const char *softefa_conf(const char *key) {
	for (int i = nkeys - 1; i >= 0; i--) // a key given twice: the last line, as cabi.Conf reads it
		if (strcmp(keys[i], key) == 0)
			return values[i];
	return NULL;
}
