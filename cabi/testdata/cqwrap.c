// cqwrap: a UD ping-pong between two processes (this one and a child forked before either
// touches the device, so each gets a device of its own), checking every payload, run for many
// times the CQ's size so that every ring, CQ and request id wraps again and again.
//
//   cqwrap [-x] [-e] [-q CQ entries] [-n rounds]
//
// -e makes the CQ with efadv_create_cq (as libfabric's efa provider does), otherwise
// ibv_create_cq; -x reads it with ibv_start_poll/ibv_next_poll/ibv_end_poll (needs -e), otherwise
// with ibv_poll_cq. Each round, each side has one SEND and one receive completion. A side that
// sees no completion for 30 s reports the round it stalled in and exits 2; success prints
// "ok rounds=N cqes=N cq=N".
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

enum { MSG = 64, GRH = 40, SLOT = GRH + MSG, NRECV = 64, QKEY = 0x11111111 };

static int rank, use_ex, use_efadv, cq_entries = 256, rounds = 20000;
static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_mr *mr;
static struct ibv_cq *cq;
static struct ibv_cq_ex *cqx;
static struct ibv_qp *qp;
static struct ibv_ah *ah;
static uint32_t peer_qpn;
static uint8_t *buf; // NRECV receive slots, then the send slot
static long cqes;
static int64_t outstanding = -1; // the round of the SEND not yet completed, or -1

static void die(const char *what, int err) {
	fprintf(stderr, "rank %d: %s: %s\n", rank, what, strerror(err));
	exit(1);
}

struct comp {
	uint64_t wr_id;
	int status, opcode;
	uint32_t byte_len;
};

// poll returns the completions found (up to 16) without waiting.
static int poll(struct comp *c) {
	int n = 0;
	if (!use_ex) {
		struct ibv_wc wc[16];
		n = ibv_poll_cq(cq, 16, wc);
		if (n < 0)
			die("ibv_poll_cq", -n);
		for (int i = 0; i < n; i++)
			c[i] = (struct comp){wc[i].wr_id, wc[i].status, wc[i].opcode, wc[i].byte_len};
		return n;
	}
	struct ibv_poll_cq_attr attr = {0};
	int r = ibv_start_poll(cqx, &attr);
	if (r == ENOENT)
		return 0;
	if (r)
		die("ibv_start_poll", r);
	do {
		c[n++] = (struct comp){cqx->wr_id, cqx->status, ibv_wc_read_opcode(cqx), ibv_wc_read_byte_len(cqx)};
		r = n < 16 ? ibv_next_poll(cqx) : ENOENT;
	} while (r == 0);
	if (r != ENOENT)
		die("ibv_next_poll", r);
	ibv_end_poll(cqx);
	return n;
}

static void post_recv(int slot) {
	struct ibv_sge sge = {(uintptr_t)(buf + slot * SLOT), SLOT, mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = slot, .sg_list = &sge, .num_sge = 1}, *bad;
	int r = ibv_post_recv(qp, &wr, &bad);
	if (r)
		die("ibv_post_recv", r);
}

static void fill(uint8_t *p, int round, int from) {
	memcpy(p, &round, 4);
	p[4] = (uint8_t)from;
	for (int i = 5; i < MSG; i++)
		p[i] = (uint8_t)(round * 7 + i + from * 13);
}

static void post_send(int round) {
	uint8_t *p = buf + NRECV * SLOT;
	fill(p, round, rank);
	struct ibv_sge sge = {(uintptr_t)p, MSG, mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 1000000 + (uint64_t)round, .sg_list = &sge, .num_sge = 1,
				 .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED}, *bad;
	wr.wr.ud.ah = ah;
	wr.wr.ud.remote_qpn = peer_qpn;
	wr.wr.ud.remote_qkey = QKEY;
	int r = ibv_post_send(qp, &wr, &bad);
	if (r)
		die("ibv_post_send", r);
	outstanding = round;
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

// complete checks the completions in c: a SEND must be the outstanding one; a receive must
// carry the peer's message of this round, and its buffer is posted again. It returns how many
// receives there were.
static int complete(struct comp *c, int n, int round) {
	int recvs = 0;
	for (int i = 0; i < n; i++) {
		cqes++;
		if (c[i].status != IBV_WC_SUCCESS) {
			fprintf(stderr, "rank %d round %d: completion status %d (%s)\n", rank, round, c[i].status,
				ibv_wc_status_str(c[i].status));
			exit(1);
		}
		if (c[i].opcode == IBV_WC_SEND) {
			if (outstanding < 0 || c[i].wr_id != 1000000 + (uint64_t)outstanding) {
				fprintf(stderr, "rank %d round %d: unexpected SEND completion wr_id %llu\n", rank, round,
					(unsigned long long)c[i].wr_id);
				exit(1);
			}
			outstanding = -1;
			continue;
		}
		if (c[i].opcode != IBV_WC_RECV || c[i].wr_id >= NRECV || recvs) {
			fprintf(stderr, "rank %d round %d: unexpected completion opcode %d wr_id %llu\n", rank, round,
				c[i].opcode, (unsigned long long)c[i].wr_id);
			exit(1);
		}
		uint8_t want[MSG], *p = buf + c[i].wr_id * SLOT + GRH;
		fill(want, round, !rank);
		if (c[i].byte_len < MSG || memcmp(p, want, MSG) != 0) {
			int r;
			memcpy(&r, p, 4);
			fprintf(stderr, "rank %d round %d: %u bytes, payload from round %d, or corrupt\n", rank, round,
				c[i].byte_len, r);
			exit(1);
		}
		recvs++;
		post_recv((int)c[i].wr_id);
	}
	return recvs;
}

// await polls until the peer's message of this round has arrived and, if wait_send, the
// outstanding SEND has completed. Thirty seconds without a completion is a stall.
static void await(int round, int want_recv, int wait_send) {
	int got_recv = !want_recv;
	double last = now();
	while (!got_recv || (wait_send && outstanding >= 0)) {
		struct comp c[16];
		int n = poll(c);
		if (n == 0) {
			if (now() - last > 30) {
				fprintf(stderr, "rank %d: stalled in round %d of %d after %ld completions (CQ of %d): SEND %s, receive %s\n",
					rank, round, rounds, cqes, cq_entries, outstanding < 0 ? "done" : "missing",
					got_recv ? "done" : "missing");
				exit(2);
			}
			continue;
		}
		last = now();
		if (complete(c, n, round)) {
			if (got_recv) {
				fprintf(stderr, "rank %d round %d: a message too many\n", rank, round);
				exit(1);
			}
			got_recv = 1;
		}
	}
}

struct info {
	union ibv_gid gid;
	uint32_t qpn;
};

static void setup(int rfd, int wfd) {
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		die("no RDMA device", ENODEV);
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("ibv_open_device", errno);
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd", errno);
	size_t len = (NRECV + 1) * SLOT;
	buf = calloc(1, len);
	mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr", errno);
	if (use_efadv) {
		struct ibv_cq_init_attr_ex ax = {.cqe = cq_entries,
						 .wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_SRC_QP};
		struct efadv_cq_init_attr ea = {0};
		cqx = efadv_create_cq(ctx, &ax, &ea, sizeof(ea));
		if (!cqx)
			die("efadv_create_cq", errno);
		cq = ibv_cq_ex_to_cq(cqx);
	} else {
		cq = ibv_create_cq(ctx, cq_entries, NULL, NULL, 0);
		if (!cq)
			die("ibv_create_cq", errno);
	}
	struct ibv_qp_init_attr qa = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 16, .max_recv_wr = NRECV, .max_send_sge = 1, .max_recv_sge = 1}};
	qp = ibv_create_qp(pd, &qa);
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
	for (int i = 0; i < NRECV; i++)
		post_recv(i);

	struct info me = {.qpn = qp->qp_num}, peer;
	if (ibv_query_gid(ctx, 1, 0, &me.gid))
		die("ibv_query_gid", errno);
	if (write(wfd, &me, sizeof(me)) != sizeof(me) || read(rfd, &peer, sizeof(peer)) != sizeof(peer))
		die("exchanging addresses", errno ? errno : EPIPE);
	peer_qpn = peer.qpn;
	struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1, .grh = {.dgid = peer.gid, .hop_limit = 255}};
	ah = ibv_create_ah(pd, &aa);
	if (!ah)
		die("ibv_create_ah", errno);
}

int main(int argc, char **argv) {
	int opt;
	while ((opt = getopt(argc, argv, "xeq:n:")) != -1) {
		switch (opt) {
		case 'x': use_ex = 1; break;
		case 'e': use_efadv = 1; break;
		case 'q': cq_entries = atoi(optarg); break;
		case 'n': rounds = atoi(optarg); break;
		default:
			fprintf(stderr, "usage: cqwrap [-x] [-e] [-q CQ entries] [-n rounds]\n");
			return 1;
		}
	}
	if (use_ex && !use_efadv) {
		fprintf(stderr, "-x needs -e\n");
		return 1;
	}
	int up[2], down[2];
	if (pipe(up) || pipe(down))
		die("pipe", errno);
	pid_t child = fork();
	if (child < 0)
		die("fork", errno);
	rank = child == 0;
	if (rank == 0)
		setup(up[0], down[1]);
	else {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		setup(down[0], up[1]);
	}
	for (int i = 0; i < rounds; i++) {
		if (rank == 0) {
			post_send(i);
			await(i, 1, 1);
		} else {
			await(i, 1, 1);
			post_send(i);
		}
	}
	if (rank == 1) {
		await(rounds, 0, 1); // the last SEND's completion
		return 0;
	}
	int st;
	if (waitpid(child, &st, 0) != child)
		die("waitpid", errno);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		fprintf(stderr, "rank 1 failed: status %#x\n", st);
		return 1;
	}
	printf("ok rounds=%d cqes=%ld cq=%d\n", rounds, cqes, cq_entries);
	return 0;
}
