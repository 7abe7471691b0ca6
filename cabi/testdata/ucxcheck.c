// ucxcheck: moves data between two processes with UCP and checks every byte, which
// ucx_perftest does not: tagged messages echoed back (eager, fragmented and rendezvous by size)
// and RDMA put then get into a region of the server's. The workers exchange their addresses, and
// the server its region's address and rkey, over a TCP connection.
//
//   ucxcheck PORT            server
//   ucxcheck PORT HOST       client; prints "ok tag SIZE" and "ok put/get SIZE" lines
//
// Sizes are 8 B, 64 B, ... 256 KiB (times 8) and 4 MiB, ITERS round trips each. Exit status 0 only when
// every byte arrived as sent.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define MAX_SIZE (4u << 20)
#define ITERS 10
#define TAG 0x5eefa

static ucp_worker_h worker;

static void die(const char *what, ucs_status_t st) {
	fprintf(stderr, "ucxcheck: %s: %s\n", what, ucs_status_string(st));
	exit(1);
}

static void xfer(int fd, void *buf, size_t n, int out) {
	char *p = buf;
	while (n > 0) {
		ssize_t r = out ? write(fd, p, n) : read(fd, p, n);
		if (r <= 0) {
			perror("ucxcheck: oob");
			exit(1);
		}
		p += r;
		n -= (size_t)r;
	}
}

// swap sends len bytes of mine and returns the peer's, both prefixed with their length.
static void *swap(int fd, const void *mine, uint64_t len, uint64_t *theirs_len) {
	xfer(fd, &len, sizeof(len), 1);
	xfer(fd, (void *)mine, len, 1);
	xfer(fd, theirs_len, sizeof(*theirs_len), 0);
	void *theirs = malloc(*theirs_len);
	xfer(fd, theirs, *theirs_len, 0);
	return theirs;
}

static void wait_req(void *req, const char *what) {
	if (req == NULL)
		return;
	if (UCS_PTR_IS_ERR(req))
		die(what, UCS_PTR_STATUS(req));
	ucs_status_t st;
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS)
		ucp_worker_progress(worker);
	ucp_request_free(req);
	if (st != UCS_OK)
		die(what, st);
}

// token trades a byte with the peer over the TCP connection, progressing the worker meanwhile (a
// peer's RMA into this process may need it, when UCP emulates RMA with active messages).
static void token(int fd) {
	char tok = 0;
	xfer(fd, &tok, 1, 1);
	struct pollfd pfd = {.fd = fd, .events = POLLIN};
	while (poll(&pfd, 1, 0) == 0)
		ucp_worker_progress(worker);
	xfer(fd, &tok, 1, 0);
}

static void fill(unsigned char *b, size_t n, unsigned seed) {
	for (size_t i = 0; i < n; i++)
		b[i] = (unsigned char)(i * 131 + seed * 7 + (i >> 8));
}

static size_t bad(const unsigned char *b, size_t n, unsigned seed) {
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += b[i] != (unsigned char)(i * 131 + seed * 7 + (i >> 8));
	return k;
}

static void send_buf(ucp_ep_h ep, void *b, size_t n) {
	ucp_request_param_t p = {0};
	wait_req(ucp_tag_send_nbx(ep, b, n, TAG, &p), "tag send");
}

static void recv_buf(void *b, size_t n) {
	ucp_request_param_t p = {0};
	wait_req(ucp_tag_recv_nbx(worker, b, n, TAG, (ucp_tag_t)-1, &p), "tag recv");
}

static void flush_ep(ucp_ep_h ep) {
	ucp_request_param_t p = {0};
	wait_req(ucp_ep_flush_nbx(ep, &p), "flush");
}

int main(int argc, char **argv) {
	if (argc < 2) {
		fprintf(stderr, "usage: ucxcheck PORT [HOST]\n");
		return 2;
	}
	int server = argc == 2;
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
	int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	if (server) {
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) || listen(fd, 1)) {
			perror("ucxcheck: listen");
			return 1;
		}
		int c = accept(fd, NULL, NULL);
		close(fd);
		fd = c;
	} else {
		inet_pton(AF_INET, argv[2], &sa.sin_addr);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
			perror("ucxcheck: connect");
			return 1;
		}
	}

	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
			       .features = UCP_FEATURE_TAG | UCP_FEATURE_RMA};
	ucp_context_h ctx;
	ucs_status_t st = ucp_init(&params, NULL, &ctx);
	if (st != UCS_OK)
		die("ucp_init", st);
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
				  .thread_mode = UCS_THREAD_MODE_SINGLE};
	if ((st = ucp_worker_create(ctx, &wp, &worker)) != UCS_OK)
		die("ucp_worker_create", st);
	ucp_address_t *addr;
	size_t addr_len;
	if ((st = ucp_worker_get_address(worker, &addr, &addr_len)) != UCS_OK)
		die("ucp_worker_get_address", st);
	uint64_t peer_len;
	void *peer = swap(fd, addr, addr_len, &peer_len);
	ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
				     .address = peer};
	ucp_ep_h ep;
	if ((st = ucp_ep_create(worker, &ep_params, &ep)) != UCS_OK)
		die("ucp_ep_create", st);

	// The server's region for RMA, mapped for both; its address and rkey go to the client.
	void *region = NULL;
	ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH |
						 UCP_MEM_MAP_PARAM_FIELD_FLAGS,
				   .length = MAX_SIZE, .flags = UCP_MEM_MAP_ALLOCATE};
	ucp_mem_h mem;
	if ((st = ucp_mem_map(ctx, &mp, &mem)) != UCS_OK)
		die("ucp_mem_map", st);
	ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS};
	ucp_mem_query(mem, &ma);
	region = ma.address;
	void *rkey_buf;
	size_t rkey_len;
	if ((st = ucp_rkey_pack(ctx, mem, &rkey_buf, &rkey_len)) != UCS_OK)
		die("ucp_rkey_pack", st);
	uint64_t raddr = (uintptr_t)region, peer_raddr, n8;
	xfer(fd, &raddr, sizeof(raddr), 1);
	xfer(fd, &peer_raddr, sizeof(peer_raddr), 0);
	void *peer_rkey_buf = swap(fd, rkey_buf, rkey_len, &n8);
	ucp_rkey_h rkey;
	if ((st = ucp_ep_rkey_unpack(ep, peer_rkey_buf, &rkey)) != UCS_OK)
		die("ucp_ep_rkey_unpack", st);

	unsigned char *buf = malloc(MAX_SIZE), *back = malloc(MAX_SIZE);
	int failed = 0;
	static const size_t sizes[] = {8, 64, 512, 4096, 32768, 262144, MAX_SIZE};
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
		size_t size = sizes[si];
		size_t wrong = 0;
		for (unsigned it = 0; it < ITERS; it++) {
			unsigned seed = (unsigned)size + it;
			if (server) { // echo what arrives, after checking it
				memset(buf, 0, size);
				recv_buf(buf, size);
				wrong += bad(buf, size, seed);
				send_buf(ep, buf, size);
			} else {
				fill(buf, size, seed);
				send_buf(ep, buf, size);
				memset(back, 0, size);
				recv_buf(back, size);
				wrong += bad(back, size, seed);
			}
		}
		if (!server) {
			printf("%s tag %zu B, %u round trips, %zu bytes wrong\n", wrong ? "BAD" : "ok", size,
			       ITERS, wrong);
			// RMA: put a pattern into the server's region, read it back with get.
			size_t rwrong = 0;
			for (unsigned it = 0; it < ITERS; it++) {
				unsigned seed = (unsigned)size * 3 + it;
				ucp_request_param_t p = {0};
				fill(buf, size, seed);
				wait_req(ucp_put_nbx(ep, buf, size, peer_raddr, rkey, &p), "put");
				flush_ep(ep);
				memset(back, 0, size);
				wait_req(ucp_get_nbx(ep, back, size, peer_raddr, rkey, &p), "get");
				flush_ep(ep);
				rwrong += bad(back, size, seed);
			}
			printf("%s put/get %zu B, %u rounds, %zu bytes wrong\n", rwrong ? "BAD" : "ok", size,
			       ITERS, rwrong);
			fflush(stdout);
			failed |= wrong || rwrong;
		} else if (wrong) {
			printf("BAD server received %zu wrong bytes at %zu B\n", wrong, size);
			failed = 1;
		}
		token(fd); // lock step: the server waits for the client's RMA at this size

	}

	ucp_rkey_destroy(rkey);
	ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
				  .flags = UCP_EP_CLOSE_FLAG_FORCE};
	void *req = ucp_ep_close_nbx(ep, &cp);
	if (req != NULL && !UCS_PTR_IS_ERR(req)) {
		while (ucp_request_check_status(req) == UCS_INPROGRESS)
			ucp_worker_progress(worker);
		ucp_request_free(req);
	}
	ucp_rkey_buffer_release(rkey_buf);
	ucp_mem_unmap(ctx, mem);
	ucp_worker_release_address(worker, addr);
	ucp_worker_destroy(worker);
	ucp_cleanup(ctx);
	free(peer);
	free(peer_rkey_buf);
	free(buf);
	free(back);
	close(fd);
	return failed;
}
