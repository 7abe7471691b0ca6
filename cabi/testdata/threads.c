// threads: two threads of one process ping-pong through the device, each busy-polling a CQ of
// its own, the shape of UCX's performance envelope tests (two threads, each polling its worker).
//
//   threads [-n rounds]
//
// Each thread has a CQ and a UD QP on one context; the first sends a 64-byte message to the
// second, which answers it, rounds times, and each message carries its round number, checked on
// arrival. Every wait is ibv_poll_cq in a loop, so both threads keep calling into the engine. It
// prints "ok rounds=N" at the end.
#define _GNU_SOURCE
#include <errno.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MSG = 64, GRH = 40, QKEY = 0x11111111 };

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static long rounds = 20000;

struct end {
	uint8_t buf[GRH + 2 * MSG]; // a receive (GRH and message), then the message to send
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_ah *ah; // to the other end
	struct end *peer;
	int first; // sends first
};

static void die(const char *what, int err) {
	fprintf(stderr, "%s: %s\n", what, strerror(err));
	exit(1);
}

static void open_end(struct end *e) {
	e->mr = ibv_reg_mr(pd, e->buf, sizeof(e->buf), IBV_ACCESS_LOCAL_WRITE);
	e->cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	if (!e->mr || !e->cq)
		die("ibv_reg_mr/ibv_create_cq", errno);
	struct ibv_qp_init_attr qa = {.send_cq = e->cq, .recv_cq = e->cq, .qp_type = IBV_QPT_UD,
				      .cap = {.max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1}};
	e->qp = ibv_create_qp(pd, &qa);
	if (!e->qp)
		die("ibv_create_qp", errno);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = QKEY};
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		die("ibv_modify_qp INIT", errno);
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTR};
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE))
		die("ibv_modify_qp RTR", errno);
	a = (struct ibv_qp_attr){.qp_state = IBV_QPS_RTS};
	if (ibv_modify_qp(e->qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		die("ibv_modify_qp RTS", errno);
}

static void post_recv(struct end *e) {
	struct ibv_sge sg = {.addr = (uintptr_t)e->buf, .length = GRH + MSG, .lkey = e->mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sg, .num_sge = 1}, *bad;
	if (ibv_post_recv(e->qp, &wr, &bad))
		die("ibv_post_recv", errno);
}

static void send_round(struct end *e, long round) {
	uint8_t *m = e->buf + GRH + MSG;
	memset(m, (int)(round & 0xff), MSG);
	memcpy(m, &round, sizeof(round));
	struct ibv_sge sg = {.addr = (uintptr_t)m, .length = MSG, .lkey = e->mr->lkey};
	struct ibv_send_wr wr = {.wr_id = 2, .sg_list = &sg, .num_sge = 1, .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.ud = {.ah = e->ah, .remote_qpn = e->peer->qp->qp_num, .remote_qkey = QKEY}};
	struct ibv_send_wr *bad;
	if (ibv_post_send(e->qp, &wr, &bad))
		die("ibv_post_send", errno);
}

// await polls until the receive of round and the send before it (when there was one) completed.
static void await(struct end *e, long round, int sent) {
	for (int recvd = 0; !recvd || sent;) {
		struct ibv_wc wc;
		int r = ibv_poll_cq(e->cq, 1, &wc);
		if (r < 0)
			die("ibv_poll_cq", -r);
		if (r == 0)
			continue;
		if (wc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "round %ld: %s\n", round, ibv_wc_status_str(wc.status));
			exit(1);
		}
		if (wc.wr_id == 2) {
			sent = 0;
			continue;
		}
		long got;
		memcpy(&got, e->buf + GRH, sizeof(got));
		if (wc.byte_len != GRH + MSG || got != round || e->buf[GRH + MSG - 1] != (uint8_t)(round & 0xff)) {
			fprintf(stderr, "round %ld: message of round %ld, %u bytes\n", round, got, wc.byte_len);
			exit(1);
		}
		recvd = 1;
	}
}

static void *run(void *arg) {
	struct end *e = arg;
	for (long i = 0; i < rounds; i++) {
		if (e->first) {
			send_round(e, i);
			await(e, i, 1);
			post_recv(e);
		} else {
			await(e, i, 0);
			post_recv(e);
			send_round(e, i);
		}
	}
	return NULL;
}

int main(int argc, char **argv) {
	for (int c; (c = getopt(argc, argv, "n:")) != -1;) {
		if (c != 'n')
			return 2;
		rounds = atol(optarg);
	}
	struct ibv_device **devs = ibv_get_device_list(NULL);
	if (!devs || !devs[0])
		die("ibv_get_device_list", ENODEV);
	ctx = ibv_open_device(devs[0]);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	if (!pd)
		die("ibv_open_device/ibv_alloc_pd", errno);
	union ibv_gid gid;
	if (ibv_query_gid(ctx, 1, 0, &gid))
		die("ibv_query_gid", errno);
	static struct end ends[2];
	for (int i = 0; i < 2; i++)
		open_end(&ends[i]);
	for (int i = 0; i < 2; i++) {
		ends[i].peer = &ends[1 - i];
		ends[i].first = i == 0;
		struct ibv_ah_attr aa = {.is_global = 1, .port_num = 1, .grh = {.dgid = gid}};
		ends[i].ah = ibv_create_ah(pd, &aa);
		if (!ends[i].ah)
			die("ibv_create_ah", errno);
		post_recv(&ends[i]);
	}
	pthread_t th[2];
	for (int i = 0; i < 2; i++)
		if ((errno = pthread_create(&th[i], NULL, run, &ends[i])))
			die("pthread_create", errno);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	printf("ok rounds=%ld\n", rounds);
	return 0;
}
