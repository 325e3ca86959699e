// SPDX-License-Identifier: MIT
/*
 * ti_exec_drive: the native plan executor (hooks/ti_exec.c) against /dev/turboinfer
 * with the KMOD actuator, inside the qemu guest of kernel_module/boottest.sh (after
 * "ti_boottest run", turboinfer.ko virtual=1 loaded). Synthetic plans and synthetic
 * callbacks; after every planned point it reads devfreq's cur_freq, which must follow
 * the plan in order (device-side evidence, not the executor's log). Prints
 * "TI-CHECK ok|FAIL <name>" lines and one TI-TIMING line; exits 1 on a failure.
 *
 * Built static with ti_exec.c and ti_hooks.c, so the initramfs needs nothing else.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "../../kernel_module/turboinfer_uapi.h"
#include "../ti_exec.h"

#define TI_DEV "/dev/turboinfer"
#define TI_MS 1000000LL
#define TI_ROUNDS 256

static int failures;
static char cur_path[160];

static void check(int ok, const char *name, const char *fmt, ...)
{
	va_list ap;

	if (ok) {
		printf("TI-CHECK ok %s\n", name);
		return;
	}
	failures++;
	printf("TI-CHECK FAIL %s: ", name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void sleep_until(int64_t t_ns)
{
	struct timespec ts = { .tv_sec = t_ns / 1000000000LL, .tv_nsec = t_ns % 1000000000LL };

	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

static uint64_t cur_freq(void)
{
	char buf[32] = "";
	ssize_t n;
	int fd = open(cur_path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	return n > 0 ? strtoull(buf, NULL, 10) : 0;
}

static int cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x > y) - (x < y);
}

static struct ti_plan plan;

static void plan_reset(int32_t first, int32_t end)
{
	memset(&plan, 0, sizeof(plan));
	plan.first_level = first;
	plan.end_level = end;
	plan.fallback_level = -1;
}

static void plan_add(int32_t anchor, int64_t key, int32_t level)
{
	plan.switches[plan.n_switches++] = (struct ti_switch){
		.key = key, .expect_ns = -1, .anchor = anchor, .level = level,
	};
}

int main(void)
{
	static struct ti_exec_config cfg;
	static struct ti_applied log[1024];
	static int64_t node_ns[TI_ROUNDS], ioctl_ns[TI_ROUNDS];
	struct ti_exec_status st;
	struct ti_info info;
	struct ti_exec *ex = NULL;
	uint64_t before, lv[TI_MAX_FREQS];
	uint32_t i, n, nlv;
	int fd, ret, ok;
	int64_t t0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	fd = open(TI_DEV, O_RDWR | O_CLOEXEC);
	memset(&info, 0, sizeof(info));
	ret = fd >= 0 ? ioctl(fd, TI_GET_INFO, &info) : -1;
	check(ret == 0 && info.num_freqs >= 4, "exec_info", "fd %d ret %d num %u", fd, ret,
	      info.num_freqs);
	if (ret != 0 || info.num_freqs < 4)
		return 1;
	nlv = info.num_freqs;
	for (i = 0; i < nlv; i++)
		lv[i] = info.freqs_hz[i];
	snprintf(cur_path, sizeof(cur_path), "/sys/class/devfreq/%.64s/cur_freq", info.name);
	before = cur_freq();

	cfg.n_levels = nlv;
	cfg.log_capacity = 1024;
	cfg.actuator = TI_ACT_KMOD;
	cfg.initial_level = -1;
	memcpy(cfg.levels_hz, lv, nlv * sizeof(lv[0]));
	snprintf(cfg.path[0], sizeof(cfg.path[0]), "%s", TI_DEV);
	ret = ti_exec_create(&cfg, &ex);
	check(ret == 0, "exec_create_kmod", "ret %d", ret);
	if (ret != 0)
		return 1;

	/* NODE switches from synthetic callbacks: cur_freq right after each ask */
	plan_reset(0, nlv - 2);
	plan_add(TI_ANCHOR_NODE, 2, 3);
	plan_add(TI_ANCHOR_NODE, 4, 1);
	plan_add(TI_ANCHOR_NODE, 6, (int32_t)nlv - 1);
	plan_add(TI_ANCHOR_NODE, 8, 2);
	ti_exec_set_plan(ex, &plan);
	ti_exec_graph_begin(ex, 1);
	{
		static const int32_t want_level[10] = { 0, 0, 3, 3, 1, 1, -2, -2, 2, 2 };
		ok = 1;
		for (i = 0; i < 10; i++) {
			int32_t w = want_level[i] == -2 ? (int32_t)nlv - 1 : want_level[i];

			ti_exec_on_node(ex, (int32_t)i, true, now_ns());
			if (cur_freq() != lv[w]) {
				ok = 0;
				printf("node %u: cur %llu want %llu\n", i,
				       (unsigned long long)cur_freq(), (unsigned long long)lv[w]);
			}
			ti_exec_on_node(ex, (int32_t)i, false, now_ns());
		}
	}
	ti_exec_graph_end(ex);
	check(ok, "exec_node_switches_move_cur_freq_in_order", "");
	check(cur_freq() == lv[nlv - 2], "exec_end_level", "cur %llu",
	      (unsigned long long)cur_freq());

	/* OFFSET switches from the timer thread: graph granularity, asks at the scan */
	plan_reset((int32_t)nlv - 1, 0);
	plan_add(TI_ANCHOR_OFFSET, 30 * TI_MS, 1);
	plan_add(TI_ANCHOR_OFFSET, 60 * TI_MS, 3);
	ti_exec_set_plan(ex, &plan);
	ti_exec_graph_begin(ex, 2);
	t0 = now_ns();
	for (i = 0; i < 20; i++)
		ti_exec_on_node(ex, (int32_t)i, true, now_ns());
	ok = cur_freq() == lv[nlv - 1];
	sleep_until(t0 + 45 * TI_MS);
	ok = ok && cur_freq() == lv[1];
	sleep_until(t0 + 80 * TI_MS);
	ok = ok && cur_freq() == lv[3];
	ti_exec_graph_end(ex);
	check(ok && cur_freq() == lv[0], "exec_offset_switches_on_the_timer_thread", "cur %llu",
	      (unsigned long long)cur_freq());

	/* a TIME switch in the stall before the next graph */
	plan_reset(-1, -1);
	t0 = now_ns();
	plan_add(TI_ANCHOR_TIME, t0 + 20 * TI_MS, 2);
	ti_exec_set_plan(ex, &plan);
	ok = cur_freq() == lv[0];
	sleep_until(t0 + 50 * TI_MS);
	check(ok && cur_freq() == lv[2], "exec_time_switch_in_the_stall", "cur %llu",
	      (unsigned long long)cur_freq());

	n = ti_exec_drain_log(ex, log, 1024);
	{
		static const int32_t want[] = { 0, 3, 1, -2, 2, -3, -2, 1, 3, 0, 2 };
		ok = n == sizeof(want) / sizeof(want[0]);
		for (i = 0; ok && i < n; i++) {
			int32_t w = want[i] == -2 ? (int32_t)nlv - 1 :
				    want[i] == -3 ? (int32_t)nlv - 2 : want[i];

			ok = log[i].level == w && log[i].err == 0 && log[i].freq_hz == lv[w];
		}
		check(ok, "exec_log_matches_the_device", "n %u", n);
	}

	/* cost per switch: the executor's engine path vs the bare ioctl, same clock */
	plan_reset(-1, -1);
	for (i = 0; i < TI_ROUNDS; i++)
		plan_add(TI_ANCHOR_NODE, i, (int32_t)(i % 2));
	ti_exec_set_plan(ex, &plan);
	ti_exec_graph_begin(ex, 3);
	ti_exec_bench_nodes(ex, 0, TI_ROUNDS, true, node_ns);
	ti_exec_graph_end(ex);
	for (i = 0; i < TI_ROUNDS; i++) {
		struct ti_set_freq req = { .freq_hz = lv[(i + 1) % 2] };
		int64_t t = now_ns();

		ioctl(fd, TI_SET_FREQ, &req);
		ioctl_ns[i] = now_ns() - t;
	}
	ti_exec_status(ex, &st);
	check(st.failed_errno == 0 && st.applied >= TI_ROUNDS,
	      "exec_bench_switches_applied", "errno %d applied %llu", st.failed_errno,
	      (unsigned long long)st.applied);
	qsort(node_ns, TI_ROUNDS, sizeof(node_ns[0]), cmp_i64);
	qsort(ioctl_ns, TI_ROUNDS, sizeof(ioctl_ns[0]), cmp_i64);
	printf("TI-TIMING rounds=%d exec_kmod_switch_median_ns=%lld set_freq_ioctl_median_ns=%lld "
	       "exec_over_ioctl=%.2f\n",
	       TI_ROUNDS, (long long)node_ns[TI_ROUNDS / 2], (long long)ioctl_ns[TI_ROUNDS / 2],
	       (double)node_ns[TI_ROUNDS / 2] / (double)ioctl_ns[TI_ROUNDS / 2]);
	ioctl(fd, TI_RELEASE, NULL);

	/* stop joins and closes the executor's fd: the kernel drops its request at once (a
	 * stopped executor, e.g. after a failed write, pins nothing until destroy) */
	ti_exec_stop(ex);
	t0 = now_ns();
	while (cur_freq() != before && now_ns() - t0 < 2000 * TI_MS)
		usleep(10000);
	check(cur_freq() == before, "exec_stop_releases", "cur %llu before %llu",
	      (unsigned long long)cur_freq(), (unsigned long long)before);
	ti_exec_destroy(ex);
	close(fd);
	printf("TI-EXEC-DRIVE %s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}
