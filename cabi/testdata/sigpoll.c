// sigpoll: busy-polls a device from several threads until a signal ends it.
//
//   sigpoll [-h] [-t threads]
//
// Each thread (the main one included) has a CQ and a UD QP that sends to itself: it posts a SEND
// and a receive, and polls with ibv_poll_cq until both complete (an empty poll goes through the
// shim's busy-poll path into the engine), over and over. Every thread's objects are made before
// any polling starts; once the other threads have made 100 round trips each, the program prints
// "ready" (so that a signal after it never interrupts an allocation: the handler frees memory).
//
// Without -h, SIGTERM keeps its default action: the process must die of it. With -h, a handler
// does what a library's cleanup handler does: it calls verbs that enter the device (it queries
// the device, deregisters an MR, frees a PD and closes a second context on the device, whose fd
// the shim serves), prints "handled", restores the default action and raises SIGTERM again. It
// touches no object the polling threads use, so on EFA hardware it could not deadlock with them.
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MSG = 64, GRH = 40, QKEY = 0x22222222, MAXT = 8 };

static struct ibv_context *ctx, *ctx2;
static struct ibv_pd *pd, *spare_pd;
static struct ibv_mr *spare_mr;
static union ibv_gid gid;
static _Atomic long progress[MAXT];

static void die(const char *what, int err) {
	fprintf(stderr, "%s: %s\n", what, strerror(err));
	exit(1);
}

static void say(const char *s) {
	ssize_t r = write(1, s, strlen(s));
	(void)r;
}

static void handler(int sig) {
	struct ibv_device_attr a;
	if (ibv_query_device(ctx, &a))
		say("ibv_query_device failed\n");
	if (ibv_dereg_mr(spare_mr))
		say("ibv_dereg_mr failed\n");
	if (ibv_dealloc_pd(spare_pd))
		say("ibv_dealloc_pd failed\n");
	if (ibv_close_device(ctx2))
		say("ibv_close_device failed\n");
	say("handled\n");
	signal(sig, SIG_DFL);
	raise(sig);
}

// poller is one thread's objects: everything setup allocates, so that the signal handler, which
// frees memory, can never interrupt an allocation (malloc is not async-signal-safe on EFA
// either): "ready" comes only once every thread has finished its setup.
struct poller {
	long id;
	uint8_t *buf;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_ah *ah;
};

static struct poller *setup(long id) {
	struct poller *p = calloc(1, sizeof *p);
	uint8_t *buf = calloc(1, GRH + 2 * MSG);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, GRH + 2 * MSG, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	if (!mr || !cq)
		die("ibv_reg_mr/ibv_create_cq", errno);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	if (!qp)
		die("ibv_create_qp", errno);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
	int r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	if (!r) {
		a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
		r = ibv_modify_qp(qp, &a, IBV_QP_STATE);
	}
	if (!r) {
		a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS};
		r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	}
	if (r)
		die("ibv_modify_qp", r);
	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1, .grh = {.dgid = gid, .hop_limit = 255}};
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		die("ibv_create_ah", errno);
	*p = (struct poller){.id = id, .buf = buf, .mr = mr, .cq = cq, .qp = qp, .ah = ah};
	return p;
}

// poll_loop posts a receive and a SEND to itself and polls for both, over and over.
static void poll_loop(struct poller *p) {
	long id = p->id;
	uint8_t *buf = p->buf;
	struct ibv_mr *mr = p->mr;
	struct ibv_cq *cq = p->cq;
	struct ibv_qp *qp = p->qp;
	struct ibv_ah *ah = p->ah;
	int r;
	for (long round = 0;; round++) {
		struct ibv_sge rs = {(uintptr_t)buf, GRH + MSG, mr->lkey}, ss = {(uintptr_t)(buf + GRH + MSG), MSG, mr->lkey};
		struct ibv_recv_wr rw = {.wr_id = 1, .sg_list = &rs, .num_sge = 1}, *rbad;
		struct ibv_send_wr sw = {.wr_id = 2, .sg_list = &ss, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED}, *sbad;
		sw.wr.ud.ah = ah;
		sw.wr.ud.remote_qpn = qp->qp_num;
		sw.wr.ud.remote_qkey = QKEY;
		memset(buf + GRH + MSG, (int)(round & 0xff), MSG);
		if ((r = ibv_post_recv(qp, &rw, &rbad)) || (r = ibv_post_send(qp, &sw, &sbad)))
			die("ibv_post_recv/ibv_post_send", r);
		for (int got = 0; got != 3;) {
			struct ibv_wc wc[4];
			int n = ibv_poll_cq(cq, 4, wc);
			if (n < 0)
				die("ibv_poll_cq", -n);
			for (int i = 0; i < n; i++) {
				if (wc[i].status != IBV_WC_SUCCESS)
					die("completion", EIO);
				got |= (int)wc[i].wr_id;
			}
		}
		if (buf[GRH] != (uint8_t)round || buf[GRH + MSG - 1] != (uint8_t)round)
			die("payload", EIO);
		progress[id] = round + 1;
	}
}

static void *worker(void *arg) {
	poll_loop(arg);
	return NULL;
}

int main(int argc, char **argv) {
	int opt, threads = 2, handle = 0;
	while ((opt = getopt(argc, argv, "ht:")) != -1) {
		switch (opt) {
		case 'h': handle = 1; break;
		case 't': threads = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: sigpoll [-h] [-t threads]\n");
			return 1;
		}
	}
	if (threads < 1 || threads > MAXT)
		threads = 2;
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		die("no RDMA device", ENODEV);
	ctx = ibv_open_device(list[0]);
	ctx2 = ibv_open_device(list[0]);
	if (!ctx || !ctx2)
		die("ibv_open_device", errno);
	pd = ibv_alloc_pd(ctx);
	spare_pd = ibv_alloc_pd(ctx);
	if (!pd || !spare_pd)
		die("ibv_alloc_pd", errno);
	static uint8_t spare[4096];
	spare_mr = ibv_reg_mr(spare_pd, spare, sizeof(spare), IBV_ACCESS_LOCAL_WRITE);
	if (!spare_mr)
		die("ibv_reg_mr", errno);
	if (ibv_query_gid(ctx, 1, 0, &gid))
		die("ibv_query_gid", errno);
	if (handle) {
		struct sigaction sa = {.sa_handler = handler};
		sigemptyset(&sa.sa_mask);
		sigaction(SIGTERM, &sa, NULL);
	}
	struct poller *mine = setup(0);
	for (long i = 1; i < threads; i++) {
		pthread_t t;
		if (pthread_create(&t, NULL, worker, setup(i)))
			die("pthread_create", EAGAIN);
	}
	// "ready" once the other threads have made 100 round trips each; then this one polls too.
	for (int all = 0; !all;) {
		all = 1;
		for (int i = 1; i < threads; i++)
			all &= progress[i] >= 100;
	}
	say("ready\n");
	poll_loop(mine);
	return 0;
}
