// paths: looks at the device's paths through every libc entry point the shim maps (docs/cabi.md,
// "Paths") and prints one line per look, "name: result", for TestPaths to compare with what an
// EFA host answers. Last it sends UD messages to a child (forked first, so that it has a device
// of its own) and prints the port's tx_bytes counter, read through sysfs, before and after.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEV "/dev/infiniband/uverbs_softefa0"
#define IB "/sys/class/infiniband/efa_0"

static const char *res(int r) { return r == 0 ? "ok" : strerror(errno); }

static const char *kind(mode_t m) {
	return S_ISCHR(m) ? "chr" : S_ISDIR(m) ? "dir" : S_ISLNK(m) ? "lnk" : S_ISREG(m) ? "reg" : "other";
}

static void print_stat(const char *name, int r, const struct stat *st) {
	if (r)
		printf("%s: %s\n", name, strerror(errno));
	else if (S_ISCHR(st->st_mode))
		printf("%s: chr %u:%u %o\n", name, major(st->st_rdev), minor(st->st_rdev), st->st_mode & 0777);
	else
		printf("%s: %s\n", name, kind(st->st_mode));
}

// read_fd prints the first line of what fd holds.
static void read_fd(const char *name, int fd) {
	char buf[256];
	if (fd < 0) {
		printf("%s: %s\n", name, strerror(errno));
		return;
	}
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0) {
		printf("%s: %s\n", name, strerror(errno));
		return;
	}
	buf[n] = 0;
	buf[strcspn(buf, "\n")] = 0;
	printf("%s: %s\n", name, buf);
}

// list prints the entries of d but the dot files, sorted, with (c) after a character device and
// (l) after a link, as readdir types them.
static void list(const char *name, DIR *d) {
	if (!d) {
		printf("%s: %s\n", name, strerror(errno));
		return;
	}
	char names[4096] = "";
	struct dirent *e;
	int n = 0;
	char *ents[128]; // the listing's entries, sorted below (they are few) for a fixed line
	while ((e = readdir(d)) && n < 128) {
		if (e->d_name[0] == '.')
			continue;
		char *s;
		if (asprintf(&s, "%s%s", e->d_name, e->d_type == DT_CHR ? "(c)" : e->d_type == DT_LNK ? "(l)" : "") < 0)
			exit(1);
		ents[n++] = s;
	}
	closedir(d);
	for (int i = 0; i < n; i++)
		for (int j = i + 1; j < n; j++)
			if (strcmp(ents[j], ents[i]) < 0) {
				char *t = ents[i];
				ents[i] = ents[j];
				ents[j] = t;
			}
	for (int i = 0; i < n; i++) {
		strncat(names, i ? " " : "", sizeof(names) - strlen(names) - 1);
		strncat(names, ents[i], sizeof(names) - strlen(names) - 1);
		free(ents[i]);
	}
	printf("%s: %s\n", name, names);
}

// has prints which of names (space-separated) the listing d holds.
static void has(const char *name, DIR *d, const char *names) {
	if (!d) {
		printf("%s: %s\n", name, strerror(errno));
		return;
	}
	char want[256], got[256] = "";
	struct dirent *e;
	while ((e = readdir(d))) {
		snprintf(want, sizeof(want), " %s ", names);
		char key[260];
		snprintf(key, sizeof(key), " %s ", e->d_name);
		if (strstr(want, key)) {
			strncat(got, " ", sizeof(got) - strlen(got) - 1);
			strncat(got, e->d_name, sizeof(got) - strlen(got) - 1);
		}
	}
	closedir(d);
	printf("%s:%s\n", name, got);
}

static void link_of(const char *name, ssize_t n, char *buf) {
	if (n < 0)
		printf("%s: %s\n", name, strerror(errno));
	else
		printf("%s: %.*s\n", name, (int)n, buf);
}

static int no_dots(const struct dirent *e) { return e->d_name[0] != '.'; }

// tx_bytes reads the port's counter by its path.
static unsigned long long tx_bytes(void) {
	FILE *f = fopen(IB "/ports/1/hw_counters/tx_bytes", "r");
	unsigned long long v = 0;
	if (!f || fscanf(f, "%llu", &v) != 1)
		printf("tx_bytes: unreadable\n");
	if (f)
		fclose(f);
	return v;
}

static void die(const char *what) {
	printf("%s: %s\n", what, strerror(errno));
	exit(1);
}

// A UD endpoint: the QP, its CQ and AH-less setup, shared by the sender and the receiver.
struct ep {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	char buf[40 + 1024];
};

struct addr {
	union ibv_gid gid;
	uint32_t qpn;
};

enum { QKEY = 0x1234, MSGS = 8 };

static void ep_open(struct ep *e) {
	int num;
	struct ibv_device **devs = ibv_get_device_list(&num);
	if (!devs || num < 1)
		die("ibv_get_device_list");
	e->ctx = ibv_open_device(devs[0]);
	if (!e->ctx)
		die("ibv_open_device");
	e->pd = ibv_alloc_pd(e->ctx);
	e->mr = e->pd ? ibv_reg_mr(e->pd, e->buf, sizeof(e->buf), IBV_ACCESS_LOCAL_WRITE) : NULL;
	e->cq = ibv_create_cq(e->ctx, 2 * MSGS, NULL, NULL, 0);
	if (!e->mr || !e->cq)
		die("ibv_reg_mr/ibv_create_cq");
	struct ibv_qp_init_attr qa = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = MSGS, .max_recv_wr = MSGS, .max_send_sge = 1, .max_recv_sge = 1}};
	e->qp = ibv_create_qp(e->pd, &qa);
	if (!e->qp)
		die("ibv_create_qp");
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("ibv_modify_qp INIT");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE))
		die("ibv_modify_qp RTR");
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS};
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("ibv_modify_qp RTS");
	ibv_free_device_list(devs);
}

static void ep_wait(struct ep *e, int n) {
	for (int got = 0; got < n;) {
		struct ibv_wc wc;
		int r = ibv_poll_cq(e->cq, 1, &wc);
		if (r < 0 || (r == 1 && wc.status != IBV_WC_SUCCESS)) {
			printf("completion: %s\n", r < 0 ? "poll failed" : ibv_wc_status_str(wc.status));
			exit(1);
		}
		got += r;
	}
}

// receiver is the child: a device of its own (forked before the parent touched one), MSGS
// receives posted, its address written to wfd, and a byte written when all have arrived.
static void receiver(int wfd) {
	struct ep e;
	ep_open(&e);
	for (int i = 0; i < MSGS; i++) {
		struct ibv_sge rs = {.addr = (uintptr_t)e.buf, .length = sizeof(e.buf), .lkey = e.mr->lkey};
		struct ibv_recv_wr rw = {.sg_list = &rs, .num_sge = 1}, *bad;
		if (ibv_post_recv(e.qp, &rw, &bad))
			die("ibv_post_recv");
	}
	struct addr me = {.qpn = e.qp->qp_num};
	if (ibv_query_gid(e.ctx, 1, 0, &me.gid))
		die("ibv_query_gid");
	if (write(wfd, &me, sizeof(me)) != sizeof(me))
		die("write");
	ep_wait(&e, MSGS);
	if (write(wfd, "", 1) != 1)
		die("write");
	exit(0);
}

// traffic sends MSGS UD messages of 1 KiB to the receiver, whose address comes on rfd, and waits
// until it has them all.
static void traffic(int rfd) {
	struct ep e;
	struct addr peer;
	char done;
	ep_open(&e);
	if (read(rfd, &peer, sizeof(peer)) != sizeof(peer))
		die("read");
	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1, .grh = {.dgid = peer.gid, .hop_limit = 255}};
	struct ibv_ah *ah = ibv_create_ah(e.pd, &aa);
	if (!ah)
		die("ibv_create_ah");
	for (int i = 0; i < MSGS; i++) {
		struct ibv_sge ss = {.addr = (uintptr_t)e.buf, .length = 1024, .lkey = e.mr->lkey};
		struct ibv_send_wr sw = {.sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
					 .wr.ud = {.ah = ah, .remote_qpn = peer.qpn, .remote_qkey = QKEY}},
				   *bad;
		if (ibv_post_send(e.qp, &sw, &bad))
			die("ibv_post_send");
		ep_wait(&e, 1);
	}
	if (read(rfd, &done, 1) != 1)
		die("the receiver");
}

int main(void) {
	struct stat st;
	char buf[PATH_MAX];
	int pfd[2];
	if (pipe(pfd))
		die("pipe");
	fflush(stdout);
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		close(pfd[0]);
		receiver(pfd[1]);
	}
	close(pfd[1]);

	printf("access dev rw: %s\n", res(access(DEV, R_OK | W_OK)));
	printf("access dev x: %s\n", res(access(DEV, X_OK)));
	printf("access vendor: %s\n", res(access(IB "/device/vendor", R_OK)));
	printf("faccessat dev: %s\n", res(faccessat(AT_FDCWD, DEV, R_OK | W_OK, 0)));
	// glibc 2.36's faccessat makes the faccessat2 system call when it is given flags
	printf("faccessat2 eaccess: %s\n", res(faccessat(AT_FDCWD, IB "/ports/1/gids/0", R_OK, AT_EACCESS)));
	printf("faccessat2 nofollow: %s\n", res(faccessat(AT_FDCWD, IB, F_OK, AT_SYMLINK_NOFOLLOW)));
	printf("euidaccess dev: %s\n", res(euidaccess(DEV, R_OK | W_OK)));
	printf("eaccess numa_node: %s\n", res(eaccess("/sys/devices/pci0000:00/0000:00:06.0/numa_node", R_OK)));

	print_stat("stat dev", stat(DEV, &st), &st);
	print_stat("stat ibdev", stat(IB, &st), &st);
	print_stat("lstat ibdev", lstat(IB, &st), &st);
	print_stat("stat local_cpus", stat(IB "/device/local_cpus", &st), &st);
	struct statx sx;
	int r = statx(AT_FDCWD, DEV, 0, STATX_BASIC_STATS, &sx);
	if (r)
		printf("statx dev: %s\n", strerror(errno));
	else
		printf("statx dev: %s %u:%u\n", kind(sx.stx_mode), sx.stx_rdev_major, sx.stx_rdev_minor);
	r = statx(AT_FDCWD, IB, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx);
	printf("statx ibdev nofollow: %s\n", r ? strerror(errno) : kind(sx.stx_mode));

	int devdir = open("/dev/infiniband", O_RDONLY | O_DIRECTORY);
	int classdir = openat(AT_FDCWD, "/sys/class/infiniband", O_RDONLY | O_DIRECTORY);
	int sysdir = open("/sys", O_RDONLY | O_DIRECTORY);
	printf("open dirs: %s\n", devdir >= 0 && classdir >= 0 && sysdir >= 0 ? "ok" : strerror(errno));
	print_stat("fstatat devdir node", fstatat(devdir, "uverbs_softefa0", &st, 0), &st);
	print_stat("fstatat sysdir vendor", fstatat(sysdir, "class/infiniband/efa_0/device/vendor", &st, 0), &st);
	r = statx(devdir, "uverbs_softefa0", AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx);
	printf("statx devdir node: %s\n", r ? strerror(errno) : kind(sx.stx_mode));
	printf("faccessat devdir node: %s\n", res(faccessat(devdir, "uverbs_softefa0", R_OK | W_OK, 0)));

	read_fd("open vendor", open(IB "/device/vendor", O_RDONLY));
	read_fd("openat device", openat(AT_FDCWD, "/sys/devices/pci0000:00/0000:00:06.0/device", O_RDONLY));
	read_fd("openat classdir gid type", openat(classdir, "efa_0/ports/1/gid_attrs/types/0", O_RDONLY));
	read_fd("openat sysdir state", openat(sysdir, "class/infiniband/efa_0/ports/1/state", O_RDONLY));
	read_fd("open dotdot", open(IB "/device/../0000:00:06.0/infiniband/efa_0/../efa_0/ports/1/link_layer", O_RDONLY));
	read_fd("open verbs ibdev", open("/sys/class/infiniband_verbs/uverbs_softefa0/ibdev", O_RDONLY));
	read_fd("open dev char", open("/sys/dev/char/231:250/device/vendor", O_RDONLY));
	read_fd("open driver", open(IB "/device/driver/0000:00:06.0/device", O_RDONLY));

	// The same calls made through syscall(), as a program must make openat2.
	struct open_how how = {.flags = O_RDONLY};
	read_fd("syscall openat2 vendor", syscall(SYS_openat2, AT_FDCWD, IB "/device/vendor", &how, sizeof(how)));
	how.flags = O_RDWR | O_CLOEXEC;
	long nfd = syscall(SYS_openat2, AT_FDCWD, DEV, &how, sizeof(how));
	printf("syscall openat2 dev: %s\n", nfd >= 0 ? "ok" : strerror(errno));
	if (nfd >= 0)
		close(nfd);
	nfd = syscall(SYS_openat2, AT_FDCWD, DEV, NULL, sizeof(how));
	printf("syscall openat2 dev null how: %s\n", nfd >= 0 ? "ok" : strerror(errno));
	read_fd("syscall openat vendor", syscall(SYS_openat, AT_FDCWD, IB "/device/vendor", O_RDONLY, 0));
	print_stat("syscall newfstatat dev", syscall(SYS_newfstatat, AT_FDCWD, DEV, &st, 0), &st);
	print_stat("syscall stat dev", syscall(SYS_stat, DEV, &st), &st);
	r = syscall(SYS_statx, AT_FDCWD, DEV, 0, STATX_BASIC_STATS, &sx);
	printf("syscall statx dev: %s\n", r ? strerror(errno) : kind(sx.stx_mode));
	printf("syscall access dev: %s\n", res(syscall(SYS_access, DEV, R_OK | W_OK)));
	printf("syscall faccessat2 dev: %s\n", res(syscall(SYS_faccessat2, AT_FDCWD, DEV, R_OK | W_OK, AT_EACCESS)));
	link_of("syscall readlinkat ibdev", syscall(SYS_readlinkat, AT_FDCWD, IB, buf, sizeof(buf) - 1), buf);
	printf("syscall getpid: %s\n", syscall(SYS_getpid) == getpid() ? "ok" : "differs");

	list("opendir class", opendir("/sys/class/infiniband"));
	list("opendir verbs", opendir("/sys/class/infiniband_verbs"));
	list("opendir dev", opendir("/dev/infiniband"));
	list("opendir types", opendir(IB "/ports/1/gid_attrs/types"));
	list("fdopendir pci", fdopendir(openat(sysdir, "devices/pci0000:00/0000:00:06.0", O_RDONLY | O_DIRECTORY)));
	has("opendir sys class", opendir("/sys/class"), "infiniband infiniband_verbs");
	has("opendir /dev", opendir("/dev"), "infiniband");
	has("fdopendir pci0000:00", fdopendir(openat(sysdir, "devices/pci0000:00", O_RDONLY | O_DIRECTORY)), "0000:00:06.0");
	has("opendir drivers", opendir("/sys/bus/pci/drivers"), "efa");
	struct dirent **ents;
	int n = scandir("/sys/class/infiniband_verbs", &ents, no_dots, alphasort);
	if (n < 0) {
		printf("scandir verbs: %s\n", strerror(errno));
	} else {
		printf("scandir verbs:");
		for (int i = 0; i < n; i++) {
			printf(" %s", ents[i]->d_name);
			free(ents[i]);
		}
		printf("\n");
		free(ents);
	}
	n = scandir("/dev/infiniband", &ents, no_dots, alphasort);
	printf("scandir dev: %s\n", n == 1 && ents[0]->d_type == DT_CHR ? ents[0]->d_name : "wrong");
	n = scandir("/sys/class", &ents, no_dots, alphasort);
	printf("scandir sys class:");
	for (int i = 0; i < n; i++) {
		if (strncmp(ents[i]->d_name, "infiniband", 10) == 0)
			printf(" %s%s", ents[i]->d_name, i > 0 && strcmp(ents[i - 1]->d_name, ents[i]->d_name) >= 0 ? "(unsorted)" : "");
		free(ents[i]);
	}
	printf("\n");
	if (n >= 0)
		free(ents);

	link_of("readlink ibdev", readlink(IB, buf, sizeof(buf)), buf);
	link_of("readlink device", readlink(IB "/device", buf, sizeof(buf)), buf);
	link_of("readlink driver", readlink(IB "/device/driver", buf, sizeof(buf)), buf);
	link_of("readlinkat classdir", readlinkat(classdir, "efa_0", buf, sizeof(buf)), buf);
	link_of("readlink verbs", readlink("/sys/class/infiniband_verbs/uverbs_softefa0", buf, sizeof(buf)), buf);
	char *p = realpath(IB, buf);
	printf("realpath ibdev: %s\n", p ? p : strerror(errno));
	p = realpath(IB "/device/driver", NULL);
	printf("realpath driver: %s\n", p ? p : strerror(errno));
	free(p);
	p = canonicalize_file_name(IB "/ports/1/../1/hw_counters/..");
	printf("canonicalize ports: %s\n", p ? p : strerror(errno));
	free(p);
	p = realpath(DEV, buf);
	printf("realpath dev: %s\n", p ? p : strerror(errno));

	if (chdir(IB "/device") == 0) {
		p = getcwd(buf, sizeof(buf));
		printf("getcwd: %s\n", p ? p : strerror(errno));
		read_fd("open relative", open("vendor", O_RDONLY));
	} else {
		printf("chdir: %s\n", strerror(errno));
	}

	unsigned long long before = tx_bytes();
	traffic(pfd[0]);
	unsigned long long after = tx_bytes();
	printf("tx_bytes: %s (%llu -> %llu)\n", after >= before + MSGS * 1024 ? "rose" : "did not rise", before, after);
	int status;
	waitpid(child, &status, 0);
	return 0;
}
