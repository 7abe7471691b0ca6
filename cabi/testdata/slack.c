// slack: opens the first device (which loads the engine, and starts its Go runtime's threads),
// prints "ready pid=P tid=T slack=S" (its process id, its main thread's id and that thread's timer
// slack in nanoseconds), and waits until its standard input closes, so that its threads can be
// looked at meanwhile (TestEngineTimerSlack).
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(void) {
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		fprintf(stderr, "no device\n");
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx) {
		perror("ibv_open_device");
		return 1;
	}
	printf("ready pid=%d tid=%ld slack=%d\n", getpid(), (long)syscall(SYS_gettid), prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0));
	fflush(stdout);
	char buf[64];
	while (read(0, buf, sizeof(buf)) > 0) {
	}
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
