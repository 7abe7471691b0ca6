// rawring: a UD ping-pong that posts and polls as libfabric 2.x's efa provider does, never
// calling libibverbs or libefa on the data path: it gets the rings from efadv_query_qp_wqs and
// efadv_query_cq (rdma-core >= 61), writes TX WQEs and RX descriptors into them, stores the
// doorbells with plain atomic stores and reads the CQEs by their phase bit. Every payload is
// checked. Built against rdma-core 64 (cabi/thirdparty/build.sh); the formats are those of
// docs/descriptors.md.
//
//   rawring [-n rounds] [-l] [-i seconds] [-w]
//
// By default two processes (this one and a child forked before either touches the device, so each
// has a device of its own) exchange rounds messages. -l runs both QPs in this process, on one
// device. -i holds the QPs idle for that long after setting up, before the ping-pong (to measure
// what an idle program costs). Success prints "ok rounds=N usec/round=T"; a side that sees no
// completion for 30 s reports the round it stalled in and exits 2. -w (two processes) then posts
// one more SEND and stores to the CQ buffer, which is mapped read-only: the fault must reach the
// program's own SIGSEGV handler, which prints "ok CQ store faulted" (the shim's handler, in front
// of it for the doorbell traps, must hand it on).
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/efadv.h>
#include <infiniband/verbs.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { MSG = 64, GRH = 40, SLOT = GRH + MSG, NRECV = 32, QKEY = 0x11111111 };

struct side {
	int rank;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq_ex *cqx;
	struct ibv_qp *qp;
	struct ibv_ah *ah;
	uint16_t ahn;
	uint32_t peer_qpn;
	uint8_t *buf; // NRECV receive slots, then the send slot
	struct efadv_wq_attr sq, rq;
	struct efadv_cq_attr cq;
	uint32_t sq_pc, rq_pc, cq_cc;
	int cq_phase;
	int64_t outstanding; // the round of the SEND not yet completed, or -1
	int got_recv;
};

static int rounds = 20000;

static void die(struct side *s, const char *what, int err) {
	fprintf(stderr, "rank %d: %s: %s\n", s ? s->rank : -1, what, strerror(err));
	exit(1);
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

// post_recv writes one RX descriptor (first and last) for receive slot i and stores the RQ
// doorbell.
static void post_recv(struct side *s, int i) {
	uint8_t *d = s->rq.buffer + (s->rq_pc % s->rq.num_entries) * s->rq.entry_size;
	uint64_t a = (uintptr_t)(s->buf + i * SLOT);
	put32(d, (uint32_t)a);
	put32(d + 4, (uint32_t)(a >> 32));
	put16(d + 8, (uint16_t)i);
	put16(d + 10, SLOT);
	put32(d + 12, (s->mr->lkey & 0xffffff) | 1u << 30 | 1u << 31);
	s->rq_pc++;
	__atomic_store_n(s->rq.doorbell, s->rq_pc & 0xffff, __ATOMIC_RELEASE);
}

static void fill(uint8_t *p, int round, int from) {
	memcpy(p, &round, 4);
	p[4] = (uint8_t)from;
	for (int i = 5; i < MSG; i++)
		p[i] = (uint8_t)(round * 7 + i + from * 13);
}

// post_send writes a signalled SEND WQE of the payload for round and stores the SQ doorbell.
static void post_send(struct side *s, int round) {
	uint8_t *p = s->buf + NRECV * SLOT;
	fill(p, round, s->rank);
	uint8_t w[64] = {0};
	uint64_t a = (uintptr_t)p;
	put16(w, (uint16_t)round);                                 // req_id
	w[2] = 0x80;                                               // ctrl1: SEND, meta descriptor
	w[3] = ((s->sq_pc / s->sq.num_entries) & 1) | 1 << 2 | 1 << 3 | 1 << 4; // phase, first, last, comp_req
	put16(w + 4, (uint16_t)s->peer_qpn);
	put16(w + 6, 1);                                           // one buffer
	put16(w + 12, s->ahn);
	put32(w + 16, QKEY);
	put32(w + 32, MSG);
	put32(w + 36, s->mr->lkey);
	put32(w + 40, (uint32_t)a);
	put32(w + 44, (uint32_t)(a >> 32));
	memcpy(s->sq.buffer + (s->sq_pc % s->sq.num_entries) * s->sq.entry_size, w, sizeof(w));
	s->sq_pc++;
	__atomic_store_n(s->sq.doorbell, s->sq_pc & 0xffff, __ATOMIC_RELEASE);
	s->outstanding = round;
}

// poll reads the CQEs there are, checking each, and reports whether it found one.
static int poll(struct side *s, int round) {
	uint8_t *e = s->cq.buffer + (s->cq_cc % s->cq.num_entries) * s->cq.entry_size;
	uint32_t w0 = __atomic_load_n((uint32_t *)e, __ATOMIC_ACQUIRE);
	uint8_t flags = w0 >> 24, status = (w0 >> 16) & 0xff;
	uint16_t req_id = w0 & 0xffff;
	if ((flags & 1) != s->cq_phase)
		return 0;
	if (++s->cq_cc % s->cq.num_entries == 0)
		s->cq_phase ^= 1;
	if (status != 0) {
		fprintf(stderr, "rank %d round %d: completion status %d\n", s->rank, round, status);
		exit(1);
	}
	int queue = (flags >> 1) & 3;
	if (queue == 1) { // send
		if (s->outstanding < 0 || req_id != (uint16_t)s->outstanding) {
			fprintf(stderr, "rank %d round %d: unexpected SEND completion %u\n", s->rank, round, req_id);
			exit(1);
		}
		s->outstanding = -1;
		return 1;
	}
	uint16_t len;
	memcpy(&len, e + 6, 2);
	uint8_t want[MSG], *p = s->buf + req_id * SLOT + GRH;
	fill(want, round, !s->rank);
	if (queue != 2 || req_id >= NRECV || s->got_recv || len < GRH + MSG || memcmp(p, want, MSG) != 0) {
		int r;
		memcpy(&r, p, 4);
		fprintf(stderr, "rank %d round %d: receive completion: queue %d slot %u, %u bytes, round %d: unexpected or corrupt\n",
			s->rank, round, queue, req_id, len, r);
		exit(1);
	}
	s->got_recv = 1;
	post_recv(s, req_id);
	return 1;
}

// await polls s until the peer's message of this round has arrived (if want_recv) and no SEND
// is outstanding; thirty seconds without a completion is a stall.
static void await(struct side *s, int round, int want_recv) {
	double last = now();
	while ((want_recv && !s->got_recv) || s->outstanding >= 0) {
		if (poll(s, round)) {
			last = now();
			continue;
		}
		if (now() - last > 30) {
			fprintf(stderr, "rank %d: stalled in round %d of %d: SEND %s, receive %s\n", s->rank, round, rounds,
				s->outstanding < 0 ? "done" : "missing", s->got_recv ? "done" : "missing");
			exit(2);
		}
	}
	s->got_recv = 0;
}

struct info {
	union ibv_gid gid;
	uint32_t qpn;
};

static struct ibv_context *open_device(void) {
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		die(NULL, "no RDMA device", ENODEV);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		die(NULL, "ibv_open_device", errno);
	return ctx;
}

// setup makes s's CQ, QP (RTS) and memory and posts its receives, all through the rings.
static void setup(struct side *s, struct ibv_context *ctx) {
	s->ctx = ctx;
	s->outstanding = -1;
	s->cq_phase = 1;
	if (!(s->pd = ibv_alloc_pd(ctx)))
		die(s, "ibv_alloc_pd", errno);
	size_t len = (NRECV + 1) * SLOT;
	s->buf = calloc(1, len);
	if (!(s->mr = ibv_reg_mr(s->pd, s->buf, len, IBV_ACCESS_LOCAL_WRITE)))
		die(s, "ibv_reg_mr", errno);
	struct ibv_cq_init_attr_ex ax = {.cqe = 256, .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_SRC_QP};
	struct efadv_cq_init_attr ea = {0};
	if (!(s->cqx = efadv_create_cq(ctx, &ax, &ea, sizeof(ea))))
		die(s, "efadv_create_cq", errno);
	struct ibv_cq *cq = ibv_cq_ex_to_cq(s->cqx);
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 16, .max_recv_wr = NRECV, .max_send_sge = 1, .max_recv_sge = 1}};
	if (!(s->qp = ibv_create_qp(s->pd, &qa)))
		die(s, "ibv_create_qp", errno);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
	int r = ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY);
	if (!r) {
		a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
		r = ibv_modify_qp(s->qp, &a, IBV_QP_STATE);
	}
	if (!r) {
		a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS};
		r = ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	}
	if (r)
		die(s, "ibv_modify_qp", r);
	if ((r = efadv_query_qp_wqs(s->qp, &s->sq, &s->rq, sizeof(s->sq))))
		die(s, "efadv_query_qp_wqs", r);
	if ((r = efadv_query_cq(cq, &s->cq, sizeof(s->cq))))
		die(s, "efadv_query_cq", r);
	if (s->sq.entry_size != 64 || s->rq.entry_size != 16 || s->cq.entry_size < 32) {
		fprintf(stderr, "rank %d: entry sizes SQ %u RQ %u CQ %u\n", s->rank, s->sq.entry_size, s->rq.entry_size,
			s->cq.entry_size);
		exit(1);
	}
	for (int i = 0; i < NRECV; i++)
		post_recv(s, i);
}

// connect makes s's AH for the peer at gid and learns the AH's number, which the WQEs carry.
static void connect(struct side *s, union ibv_gid gid, uint32_t qpn) {
	s->peer_qpn = qpn;
	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1, .grh = {.dgid = gid, .hop_limit = 255}};
	if (!(s->ah = ibv_create_ah(s->pd, &aa)))
		die(s, "ibv_create_ah", errno);
	struct efadv_ah_attr ea;
	int r = efadv_query_ah(s->ah, &ea, sizeof(ea));
	if (r)
		die(s, "efadv_query_ah", r);
	s->ahn = ea.ahn;
}

static struct info me(struct side *s) {
	struct info i = {.qpn = s->qp->qp_num};
	if (ibv_query_gid(s->ctx, 1, 0, &i.gid))
		die(s, "ibv_query_gid", errno);
	return i;
}

static void idle(int secs) {
	if (secs > 0) {
		printf("idle\n");
		fflush(stdout);
		sleep(secs);
	}
}

// loopback runs the ping-pong between two QPs of this process, on one thread.
static int loopback(int idle_secs) {
	struct ibv_context *ctx = open_device();
	struct side a = {.rank = 0}, b = {.rank = 1};
	setup(&a, ctx);
	setup(&b, ctx);
	struct info ia = me(&a), ib = me(&b);
	connect(&a, ib.gid, ib.qpn);
	connect(&b, ia.gid, ia.qpn);
	idle(idle_secs);
	double t = now();
	for (int i = 0; i < rounds; i++) {
		post_send(&a, i);
		await(&b, i, 1);
		post_send(&b, i);
		await(&a, i, 1);
		await(&b, i, 0);
	}
	printf("ok rounds=%d usec/round=%.2f\n", rounds, (now() - t) / rounds * 1e6);
	return 0;
}

static void on_segv(int sig) {
	(void)sig;
	static const char msg[] = "ok CQ store faulted\n";
	if (write(1, msg, sizeof(msg) - 1) < 0)
		_exit(3);
	_exit(0);
}

// store_to_cq stores to s's CQ buffer after a SEND (whose doorbell store trapped): the program's
// own handler must get the fault.
static int store_to_cq(struct side *s) {
	struct sigaction sa = {.sa_handler = on_segv};
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, NULL))
		die(s, "sigaction", errno);
	post_send(s, rounds);
	*(volatile uint8_t *)s->cq.buffer = 0;
	fprintf(stderr, "a store to the read-only CQ buffer did not fault\n");
	return 1;
}

int main(int argc, char **argv) {
	int opt, loop = 0, idle_secs = 0, store = 0;
	while ((opt = getopt(argc, argv, "n:li:w")) != -1) {
		switch (opt) {
		case 'n': rounds = atoi(optarg); break;
		case 'l': loop = 1; break;
		case 'i': idle_secs = atoi(optarg); break;
		case 'w': store = 1; break;
		default:
			fprintf(stderr, "usage: rawring [-n rounds] [-l] [-i seconds] [-w]\n");
			return 1;
		}
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (loop)
		return loopback(idle_secs);
	int up[2], down[2];
	if (pipe(up) || pipe(down))
		die(NULL, "pipe", errno);
	pid_t child = fork();
	if (child < 0)
		die(NULL, "fork", errno);
	struct side s = {.rank = child == 0};
	int rfd = s.rank ? down[0] : up[0], wfd = s.rank ? up[1] : down[1];
	if (s.rank)
		prctl(PR_SET_PDEATHSIG, SIGKILL);
	setup(&s, open_device());
	struct info mine = me(&s), peer;
	if (write(wfd, &mine, sizeof(mine)) != sizeof(mine) || read(rfd, &peer, sizeof(peer)) != sizeof(peer))
		die(&s, "exchanging addresses", errno ? errno : EPIPE);
	connect(&s, peer.gid, peer.qpn);
	if (s.rank == 0)
		idle(idle_secs);
	// Both ready before the clock starts: the child waits for the parent's word.
	char go = 1;
	if (s.rank == 0 ? write(wfd, &go, 1) != 1 : read(rfd, &go, 1) != 1)
		die(&s, "starting", errno ? errno : EPIPE);
	double t = now();
	for (int i = 0; i < rounds; i++) {
		if (s.rank == 0) {
			post_send(&s, i);
			await(&s, i, 1);
		} else {
			await(&s, i, 1);
			post_send(&s, i);
			await(&s, i, 0);
		}
	}
	if (s.rank == 1)
		return 0;
	double d = now() - t;
	int st;
	if (waitpid(child, &st, 0) != child)
		die(&s, "waitpid", errno);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "rank 1 failed: status %#x\n", st);
		return 1;
	}
	printf("ok rounds=%d usec/round=%.2f\n", rounds, d / rounds * 1e6);
	return store ? store_to_cq(&s) : 0;
}
