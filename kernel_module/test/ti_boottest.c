// SPDX-License-Identifier: GPL-2.0
/*
 * In-guest checks for turboinfer.ko (virtual=1), run by the initramfs of boottest.sh.
 *
 *   ti_boottest run                  every check; prints "TI-CHECK ok|FAIL <name>"
 *                                    lines and the timing line; exits 1 on failure
 *   ti_boottest attach               turboinfer.ko target=mali on ti_fakegpu.ko: the
 *                                    attach path of a real GPU driver's devfreq
 *   ti_boottest post NAME=RC...      after rmmod: each phase /init ran exited 0,
 *                                    rmmod left nothing behind, the kernel log is
 *                                    clean; prints the verdict line
 *
 * Built static, so the initramfs needs nothing but busybox.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/klog.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../turboinfer_uapi.h"

#define TI_DEV "/dev/turboinfer"
#define TI_DF "/sys/class/devfreq/turboinfer-vgpu"
#define TI_TIMING_ROUNDS 200
#define TI_FUZZ_ROUNDS 10000

static const uint64_t ti_levels[] = {
	305000000, 400000000, 441600000, 490000000, 525000000, 587000000, 670000000,
};
#define TI_NLEVELS (sizeof(ti_levels) / sizeof(ti_levels[0]))
#define TI_TOP 670000000ULL
#define TI_BOTTOM 305000000ULL

static int ti_failures;
static int ti_passes;

static void ti_check(int ok, const char *name, const char *fmt, ...)
{
	va_list ap;

	if (ok) {
		ti_passes++;
		printf("TI-CHECK ok %s\n", name);
		return;
	}
	ti_failures++;
	printf("TI-CHECK FAIL %s: ", name);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
}

static uint64_t ti_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int ti_read_u64(const char *path, uint64_t *v)
{
	char buf[64];
	ssize_t n;
	int fd = open(path, O_RDONLY);

	if (fd < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -EIO;
	buf[n] = 0;
	*v = strtoull(buf, NULL, 10);
	return 0;
}

static int ti_write_str(const char *path, const char *s)
{
	ssize_t n;
	int fd = open(path, O_WRONLY);

	if (fd < 0)
		return -errno;
	n = write(fd, s, strlen(s));
	if (n < 0) {
		int e = -errno;

		close(fd);
		return e;
	}
	return close(fd) ? -errno : 0;
}

static int ti_write_u64(const char *path, uint64_t v)
{
	char buf[32];

	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
	return ti_write_str(path, buf);
}

/* The devfreq node under test: the virtual GPU, or ti_fakegpu in attach mode. */
static const char *ti_df_dir = TI_DF;

static uint64_t ti_cur_freq(void)
{
	char path[256];
	uint64_t v = 0;

	snprintf(path, sizeof(path), "%s/cur_freq", ti_df_dir);
	if (ti_read_u64(path, &v))
		return 0;
	return v;
}

/* ioctl returning 0 or -errno */
static int ti_ioc(int fd, unsigned long cmd, void *arg)
{
	return ioctl(fd, cmd, arg) ? -errno : 0;
}

static int ti_set_freq(int fd, uint64_t hz, uint32_t flags, struct ti_set_freq *out)
{
	struct ti_set_freq req = { .freq_hz = hz, .flags = flags };
	int ret = ti_ioc(fd, TI_SET_FREQ, &req);

	if (out)
		*out = req;
	return ret;
}

static int ti_set_range(int fd, uint64_t lo, uint64_t hi, struct ti_range *out)
{
	struct ti_range req = { .min_hz = lo, .max_hz = hi };
	int ret = ti_ioc(fd, TI_SET_RANGE, &req);

	if (out)
		*out = req;
	return ret;
}

/* Wait up to 2 s for cur_freq to equal want (release after exit is immediate in
 * practice; the wait only keeps a slow TCG guest from failing spuriously). */
static uint64_t ti_wait_freq(uint64_t want)
{
	uint64_t f = 0;
	int i;

	for (i = 0; i < 200; i++) {
		f = ti_cur_freq();
		if (f == want)
			break;
		usleep(10000);
	}
	return f;
}

static int ti_find_cooling(char *dir, size_t len)
{
	char path[300], type[64];
	struct dirent *de;
	DIR *d = opendir("/sys/class/thermal");
	int found = 0;

	if (!d)
		return 0;
	while (!found && (de = readdir(d))) {
		FILE *fp;

		if (strncmp(de->d_name, "cooling_device", 14))
			continue;
		snprintf(path, sizeof(path), "/sys/class/thermal/%s/type", de->d_name);
		fp = fopen(path, "r");
		if (!fp)
			continue;
		if (fgets(type, sizeof(type), fp) && !strncmp(type, "turboinfer\n", 11)) {
			snprintf(dir, len, "/sys/class/thermal/%s", de->d_name);
			found = 1;
		}
		fclose(fp);
	}
	closedir(d);
	return found;
}

static int ti_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static uint64_t ti_median(uint64_t *v, int n)
{
	qsort(v, n, sizeof(*v), ti_cmp_u64);
	return v[n / 2];
}

/*
 * Kernel log problems: oops, WARN, BUG, lockdep, KASAN, UBSAN, hung-task and RCU
 * stall reports. boottest.sh greps the guest's dmesg for the same list.
 */
static int ti_dmesg_clean(char *why, size_t len)
{
	static const char *const bad[] = {
		"Oops", "WARNING:", "BUG:", "kernel BUG", "cut here", "Call Trace",
		"general protection", "possible recursive locking", "circular locking",
		"Kernel panic", "refcount_t:", "list_add corruption", "list_del corruption",
		"UBSAN:", "KASAN:", "blocked for more than", "rcu: INFO:", "self-detected stall",
	};
	int size = klogctl(10, NULL, 0); /* SYSLOG_ACTION_SIZE_BUFFER */
	char *buf;
	size_t i;
	int n;

	if (size <= 0)
		size = 1 << 20;
	buf = calloc(1, size + 1);
	if (!buf)
		return 0;
	n = klogctl(3, buf, size); /* SYSLOG_ACTION_READ_ALL */
	if (n < 0) {
		snprintf(why, len, "klogctl: %s", strerror(errno));
		free(buf);
		return 0;
	}
	buf[n] = 0;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *hit = strstr(buf, bad[i]);

		if (hit) {
			char *end = strchr(hit, '\n');

			if (end)
				*end = 0;
			snprintf(why, len, "kernel log: %.160s", hit);
			free(buf);
			return 0;
		}
	}
	free(buf);
	return 1;
}

static void ti_check_info(int fd)
{
	struct ti_info info;
	char path[300];
	int ret, table_ok = 1;
	size_t i;

	/* Pin first: until then the governor's first poll may move the clock under us. */
	ti_set_freq(fd, 441600000, 0, NULL);
	memset(&info, 0xa5, sizeof(info));
	ret = ti_ioc(fd, TI_GET_INFO, &info);
	ti_check(ret == 0, "get_info", "ret %d", ret);
	ti_check(info.abi_version == TI_ABI_VERSION, "info_abi", "abi %u", info.abi_version);
	for (i = 0; i < TI_NLEVELS; i++)
		table_ok &= info.freqs_hz[i] == ti_levels[i];
	ti_check(info.num_freqs == TI_NLEVELS && table_ok, "info_table",
		 "num_freqs %u", info.num_freqs);
	ti_check(!strcmp(info.name, "turboinfer-vgpu"), "info_name", "name %.64s", info.name);
	ti_check(info.flags & TI_INFO_F_VIRTUAL && !(info.flags & TI_INFO_F_HAS_PMU),
		 "info_flags", "flags %#x", info.flags);
	ti_check(info.cooling_state == 0 && info.max_cooling_state == TI_NLEVELS - 1 &&
			 info.cooling_cap_hz == TI_TOP,
		 "info_cooling", "state %u/%u cap %llu", info.cooling_state,
		 info.max_cooling_state, (unsigned long long)info.cooling_cap_hz);
	ti_check(info.cur_freq_hz == 441600000 && ti_cur_freq() == 441600000 &&
			 info.scaling_max_hz == TI_TOP,
		 "info_cur_freq", "info %llu sysfs %llu scaling_max %llu",
		 (unsigned long long)info.cur_freq_hz, (unsigned long long)ti_cur_freq(),
		 (unsigned long long)info.scaling_max_hz);
	snprintf(path, sizeof(path), "%s", TI_DF "/available_frequencies");
	{
		char buf[256] = "";
		FILE *fp = fopen(path, "r");
		int n = fp ? (int)fread(buf, 1, sizeof(buf) - 1, fp) : 0;

		if (fp)
			fclose(fp);
		ti_check(n > 0 && strstr(buf, "305000000") && strstr(buf, "670000000"),
			 "sysfs_available_frequencies", "%s", buf);
	}
	ti_ioc(fd, TI_RELEASE, NULL);
}

static void ti_check_set_freq(int fd)
{
	struct ti_set_freq r;
	uint64_t prev_t = 0;
	int ret, ok = 1;
	size_t i;

	for (i = 0; i < TI_NLEVELS; i++) {
		size_t k = (i * 3) % TI_NLEVELS; /* visit levels out of order */

		ret = ti_set_freq(fd, ti_levels[k], TI_SET_FREQ_F_EXACT, &r);
		if (ret || r.applied_hz != ti_levels[k] || r.target_hz != ti_levels[k] ||
		    ti_cur_freq() != ti_levels[k] || r.t_ns < prev_t) {
			ti_check(0, "set_freq_each_level", "level %llu ret %d applied %llu cur %llu",
				 (unsigned long long)ti_levels[k], ret,
				 (unsigned long long)r.applied_hz,
				 (unsigned long long)ti_cur_freq());
			ok = 0;
			break;
		}
		prev_t = r.t_ns;
	}
	if (ok)
		ti_check(1, "set_freq_each_level", "");

	ret = ti_set_freq(fd, 500000000, 0, &r);
	ti_check(ret == 0 && r.target_hz == 490000000 && ti_cur_freq() == 490000000,
		 "set_freq_snaps_to_nearest", "ret %d target %llu", ret,
		 (unsigned long long)r.target_hz);
	ret = ti_set_freq(fd, 507500000, 0, &r); /* midway 490/525: ties go up */
	ti_check(ret == 0 && r.target_hz == 525000000, "set_freq_tie_goes_up",
		 "ret %d target %llu", ret, (unsigned long long)r.target_hz);
	ret = ti_set_freq(fd, 500000000, TI_SET_FREQ_F_EXACT, NULL);
	ti_check(ret == -EINVAL, "set_freq_rejects_out_of_table", "ret %d", ret);
	ti_check(ti_set_freq(fd, 0, 0, NULL) == -ERANGE &&
			 ti_set_freq(fd, TI_BOTTOM - 1, 0, NULL) == -ERANGE &&
			 ti_set_freq(fd, TI_TOP + 1, 0, NULL) == -ERANGE &&
			 ti_set_freq(fd, UINT64_MAX, 0, NULL) == -ERANGE,
		 "set_freq_rejects_out_of_range", "");
	ti_check(ti_set_freq(fd, TI_TOP, 0x80, NULL) == -EINVAL, "set_freq_rejects_bad_flags",
		 "");
	{
		struct ti_set_freq bad = { .freq_hz = TI_TOP, .__pad0 = 1 };

		ti_check(ti_ioc(fd, TI_SET_FREQ, &bad) == -EINVAL, "set_freq_rejects_padding", "");
	}
	ti_check(ti_cur_freq() == 525000000, "rejections_leave_freq", "cur %llu",
		 (unsigned long long)ti_cur_freq());
}

static void ti_check_set_range(int fd)
{
	struct ti_range r;
	int ret;

	ret = ti_set_range(fd, 400000000, 525000000, &r);
	/* simple_ondemand sees total_time 0 and asks for the top of the range */
	ti_check(ret == 0 && r.applied_min_hz == 400000000 && r.applied_max_hz == 525000000 &&
			 r.cur_freq_hz == 525000000 && ti_cur_freq() == 525000000,
		 "set_range", "ret %d min %llu max %llu cur %llu", ret,
		 (unsigned long long)r.applied_min_hz, (unsigned long long)r.applied_max_hz,
		 (unsigned long long)ti_cur_freq());
	ret = ti_set_range(fd, 350000000, 500000000, &r);
	ti_check(ret == 0 && r.applied_min_hz == 400000000 && r.applied_max_hz == 490000000 &&
			 ti_cur_freq() == 490000000,
		 "set_range_rounds_inward", "ret %d min %llu max %llu", ret,
		 (unsigned long long)r.applied_min_hz, (unsigned long long)r.applied_max_hz);
	ti_check(ti_set_range(fd, 525000000, 400000000, NULL) == -EINVAL,
		 "set_range_rejects_min_above_max", "");
	ti_check(ti_set_range(fd, 450000000, 480000000, NULL) == -EINVAL,
		 "set_range_rejects_empty", "");
	ti_check(ti_set_range(fd, 1000, TI_TOP, NULL) == -ERANGE &&
			 ti_set_range(fd, TI_BOTTOM, 2 * TI_TOP, NULL) == -ERANGE,
		 "set_range_rejects_out_of_range", "");
	{
		struct ti_range bad = { .min_hz = TI_BOTTOM, .max_hz = TI_TOP, .t_ns = 5 };

		ti_check(ti_ioc(fd, TI_SET_RANGE, &bad) == -EINVAL, "set_range_rejects_out_fields",
			 "");
	}
}

static void ti_check_release(int fd)
{
	int ret;

	ret = ti_set_freq(fd, TI_BOTTOM, 0, NULL);
	ti_check(ret == 0 && ti_cur_freq() == TI_BOTTOM, "pin_bottom", "ret %d", ret);
	ret = ti_ioc(fd, TI_RELEASE, NULL);
	ti_check(ret == 0 && ti_cur_freq() == TI_TOP, "release_returns_to_governor",
		 "ret %d cur %llu", ret, (unsigned long long)ti_cur_freq());
	ti_check(ti_ioc(fd, TI_RELEASE, NULL) == 0, "release_twice", "");
	ti_check(ioctl(fd, TI_RELEASE, 1UL) == -1 && errno == EINVAL, "release_rejects_arg", "");
}

static void ti_check_stats(int fd)
{
	struct ti_stats a, b;
	int ra, rb;

	ra = ti_ioc(fd, TI_GET_STATS, &a);
	ti_set_freq(fd, 441600000, 0, NULL);
	usleep(20000);
	rb = ti_ioc(fd, TI_GET_STATS, &b);
	ti_check(ra == 0 && rb == 0, "get_stats", "ret %d %d", ra, rb);
	ti_check(b.transitions > a.transitions && b.last_transition_ns > a.t_ns &&
			 b.last_transition_ns <= b.t_ns,
		 "stats_transitions", "trans %llu->%llu last %llu",
		 (unsigned long long)a.transitions, (unsigned long long)b.transitions,
		 (unsigned long long)b.last_transition_ns);
	ti_check(b.cur_freq_hz == 441600000, "stats_cur_freq", "cur %llu",
		 (unsigned long long)b.cur_freq_hz);
	ti_check(b.total_ns > a.total_ns && b.busy_ns >= a.busy_ns && b.busy_ns <= b.total_ns &&
			 b.window_total_ns == b.total_ns - a.total_ns &&
			 b.window_busy_ns == b.busy_ns - a.busy_ns && b.window_total_ns >= 20000000,
		 "stats_busy_window", "win %llu/%llu",
		 (unsigned long long)b.window_busy_ns, (unsigned long long)b.window_total_ns);
	/* virtual GPU: busy is simulated at vgpu_busy_pct (60 by default) */
	ti_check(b.flags & TI_STATS_F_BUSY_SIMULATED && !(b.flags & TI_STATS_F_PMU) &&
			 b.window_busy_ns * 100 >= b.window_total_ns * 59 &&
			 b.window_busy_ns * 100 <= b.window_total_ns * 61,
		 "stats_flags_and_ratio", "flags %#x busy %llu/%llu", b.flags,
		 (unsigned long long)b.window_busy_ns, (unsigned long long)b.window_total_ns);
	ti_ioc(fd, TI_RELEASE, NULL);
}

static void ti_check_bad_calls(int fd)
{
	int rdonly;
	struct ti_info info;

	ti_check(ioctl(fd, _IO(TI_IOC_MAGIC, 0x7f)) == -1 && errno == ENOTTY,
		 "unknown_cmd_enotty", "errno %d", errno);
	ti_check(ioctl(fd, _IOR(TI_IOC_MAGIC, 1, int), &info) == -1 && errno == ENOTTY,
		 "wrong_size_enotty", "errno %d", errno);
	ti_check(ioctl(fd, TI_GET_INFO, NULL) == -1 && errno == EFAULT &&
			 ioctl(fd, TI_SET_FREQ, (void *)1) == -1 && errno == EFAULT &&
			 ioctl(fd, TI_GET_STATS, (void *)0xffffffff81000000UL) == -1 &&
			 errno == EFAULT,
		 "bad_pointers_efault", "errno %d", errno);
	rdonly = open(TI_DEV, O_RDONLY);
	ti_check(rdonly >= 0 && ti_ioc(rdonly, TI_GET_INFO, &info) == 0 &&
			 ti_set_freq(rdonly, TI_BOTTOM, 0, NULL) == -EBADF,
		 "readonly_fd_cannot_actuate", "");
	if (rdonly >= 0)
		close(rdonly);
}

static void ti_check_thermal(int fd)
{
	char dir[300], path[340];
	struct ti_set_freq r;
	struct ti_info info;
	uint64_t max_state = 0;
	int ret, ok = 1;
	size_t i;

	if (!ti_find_cooling(dir, sizeof(dir))) {
		ti_check(0, "cooling_device_registered", "no cooling_device of type turboinfer");
		return;
	}
	ti_check(1, "cooling_device_registered", "");
	snprintf(path, sizeof(path), "%s/max_state", dir);
	ti_check(ti_read_u64(path, &max_state) == 0 && max_state == TI_NLEVELS - 1,
		 "cooling_max_state", "max_state %llu", (unsigned long long)max_state);

	ti_set_freq(fd, TI_TOP, 0, NULL);
	snprintf(path, sizeof(path), "%s/cur_state", dir);
	ret = ti_write_u64(path, 3); /* 3 levels below the top: 490 MHz */
	ti_check(ret == 0 && ti_cur_freq() == 490000000, "cooling_cap_lowers_pinned_clock",
		 "ret %d cur %llu", ret, (unsigned long long)ti_cur_freq());
	ti_ioc(fd, TI_GET_INFO, &info);
	ti_check(info.cooling_state == 3 && info.cooling_cap_hz == 490000000 &&
			 info.qos_max_hz == 490000000,
		 "info_reports_cap", "state %u cap %llu qos_max %llu", info.cooling_state,
		 (unsigned long long)info.cooling_cap_hz, (unsigned long long)info.qos_max_hz);
	for (i = 0; i < TI_NLEVELS; i++) {
		ret = ti_set_freq(fd, ti_levels[i], 0, &r);
		if (ret || r.applied_hz > 490000000 || ti_cur_freq() > 490000000) {
			ok = 0;
			break;
		}
	}
	ret = ti_set_range(fd, TI_BOTTOM, TI_TOP, NULL);
	ti_check(ok && ret == 0 && ti_cur_freq() <= 490000000, "set_freq_never_exceeds_cap",
		 "level %zu cur %llu", i, (unsigned long long)ti_cur_freq());
	ti_check(ti_write_u64(path, TI_NLEVELS) != 0, "cooling_rejects_bad_state", "");

	ret = ti_write_u64(path, 0);
	ti_set_freq(fd, TI_TOP, 0, NULL);
	ti_check(ret == 0 && ti_cur_freq() == TI_TOP, "cooling_uncap", "cur %llu",
		 (unsigned long long)ti_cur_freq());

	/* Another party's max request (sysfs max_freq, a PM QoS request too). */
	ret = ti_write_u64(TI_DF "/max_freq", 441600000);
	ti_set_freq(fd, TI_TOP, 0, &r);
	ti_check(ret == 0 && r.applied_hz == 441600000 && ti_cur_freq() == 441600000,
		 "other_max_request_respected", "ret %d applied %llu", ret,
		 (unsigned long long)r.applied_hz);
	ret = ti_write_u64(TI_DF "/max_freq", 0);
	ti_check(ret == 0 && ti_cur_freq() == TI_TOP, "other_max_request_lifted", "cur %llu",
		 (unsigned long long)ti_cur_freq());
	ti_ioc(fd, TI_RELEASE, NULL);
}

static void ti_check_close_releases(void)
{
	int fd2 = open(TI_DEV, O_RDWR);
	int ret = ti_set_freq(fd2, 400000000, 0, NULL);

	ti_check(fd2 >= 0 && ret == 0 && ti_cur_freq() == 400000000, "second_fd_pins", "ret %d",
		 ret);
	close(fd2);
	ti_check(ti_cur_freq() == TI_TOP, "close_releases", "cur %llu",
		 (unsigned long long)ti_cur_freq());
}

static void ti_check_sigkill_releases(void)
{
	int pipefd[2];
	pid_t pid;
	char c = 0;
	uint64_t held, after;
	int status = 0;

	if (pipe(pipefd)) {
		ti_check(0, "sigkill_releases", "pipe: %s", strerror(errno));
		return;
	}
	pid = fork();
	if (pid == 0) {
		int cfd = open(TI_DEV, O_RDWR);

		close(pipefd[0]);
		c = (cfd >= 0 && ti_set_freq(cfd, 441600000, 0, NULL) == 0) ? 'y' : 'n';
		if (write(pipefd[1], &c, 1) != 1)
			_exit(2);
		for (;;)
			pause();
	}
	close(pipefd[1]);
	if (pid < 0 || read(pipefd[0], &c, 1) != 1 || c != 'y') {
		ti_check(0, "sigkill_releases", "child did not pin (pid %d, c %c)", pid, c);
		if (pid > 0)
			kill(pid, SIGKILL);
		close(pipefd[0]);
		return;
	}
	held = ti_cur_freq();
	kill(pid, SIGKILL);
	waitpid(pid, &status, 0);
	after = ti_wait_freq(TI_TOP);
	ti_check(held == 441600000 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL &&
			 after == TI_TOP,
		 "sigkill_releases", "held %llu after %llu status %#x",
		 (unsigned long long)held, (unsigned long long)after, status);
	close(pipefd[0]);
}

static void ti_check_sampler(int fd)
{
	struct ti_sample_config cfg = { .period_ns = 200000, .flags = TI_SAMPLE_F_ENABLE };
	struct ti_sample_config stop = { 0 };
	static struct ti_sample recs[2048];
	struct pollfd pfd = { .fd = fd, .events = POLLIN };
	int n = 0, i, ok = 1, flags, ret;
	ssize_t got;
	char tiny[8];

	ti_check(ti_ioc(fd, TI_SAMPLE_CONFIG, &(struct ti_sample_config){
						   .period_ns = 50000, .flags = TI_SAMPLE_F_ENABLE }) ==
			 -EINVAL &&
		 ti_ioc(fd, TI_SAMPLE_CONFIG, &(struct ti_sample_config){
						   .period_ns = 2000000000ULL,
						   .flags = TI_SAMPLE_F_ENABLE }) == -EINVAL &&
		 ti_ioc(fd, TI_SAMPLE_CONFIG, &(struct ti_sample_config){
						   .period_ns = 200000, .flags = 0x6 }) == -EINVAL &&
		 ti_ioc(fd, TI_SAMPLE_CONFIG, &(struct ti_sample_config){
						   .period_ns = 200000 }) == -EINVAL,
		 "sample_config_rejects_bad", "");
	ti_check(read(fd, recs, sizeof(recs[0])) == 0, "read_without_sampler_is_eof", "");

	ret = ti_ioc(fd, TI_SAMPLE_CONFIG, &cfg);
	ti_check(ret == 0, "sample_config_start", "ret %d", ret);
	ti_check(poll(&pfd, 1, 2000) == 1 && pfd.revents & POLLIN, "sampler_poll", "");
	got = read(fd, recs, 4 * sizeof(recs[0])); /* blocking read */
	ti_check(got > 0 && got % sizeof(recs[0]) == 0, "sampler_blocking_read", "got %zd", got);
	n = got > 0 ? got / sizeof(recs[0]) : 0;
	ti_set_freq(fd, 525000000, 0, NULL);
	usleep(30000);
	ti_set_freq(fd, 400000000, 0, NULL);
	usleep(30000);
	ti_check(read(fd, tiny, sizeof(tiny)) == -1 && errno == EINVAL, "read_rejects_short_buffer",
		 "");
	ret = ti_ioc(fd, TI_SAMPLE_CONFIG, &stop);
	ti_check(ret == 0, "sample_config_stop", "ret %d", ret);
	flags = fcntl(fd, F_GETFL);
	fcntl(fd, F_SETFL, flags | O_NONBLOCK);
	while (n < 2048) {
		got = read(fd, &recs[n], (2048 - n) * sizeof(recs[0]));
		if (got <= 0)
			break;
		n += got / sizeof(recs[0]);
	}
	fcntl(fd, F_SETFL, flags);
	ti_check(n >= 20, "sampler_records", "only %d records in 60 ms at 200 us", n);
	for (i = 1; i < n && ok; i++) {
		const struct ti_sample *p = &recs[i - 1], *q = &recs[i];

		if (q->t_ns <= p->t_ns || q->busy_ns < p->busy_ns || q->total_ns < p->total_ns ||
		    q->busy_ns > q->total_ns ||
		    (q->seq != p->seq + 1 && !(q->flags & TI_SAMPLE_F_LOST))) {
			ti_check(0, "sampler_monotonic", "record %d: t %llu->%llu seq %u->%u", i,
				 (unsigned long long)p->t_ns, (unsigned long long)q->t_ns, p->seq,
				 q->seq);
			ok = 0;
		}
	}
	if (ok)
		ti_check(n > 1, "sampler_monotonic", "n %d", n);
	{
		int saw_525 = 0, saw_400 = 0;

		for (i = 0; i < n; i++) {
			saw_525 |= recs[i].freq_hz == 525000000;
			saw_400 |= recs[i].freq_hz == 400000000;
		}
		ti_check(saw_525 && saw_400, "sampler_sees_frequency_changes", "");
	}
	ti_check(read(fd, recs, sizeof(recs[0])) == 0, "read_after_stop_is_eof", "");
	ti_ioc(fd, TI_RELEASE, NULL);
}

/*
 * The random stream of the fuzz and the concurrency checks. boottest.sh passes a
 * fresh seed as ti_seed= on the kernel command line (the kernel hands it to /init's
 * environment); TI_FUZZ_SEED=<seed> there replays a run.
 */
static uint32_t ti_rng = 0x12345678;

static void ti_seed_from_env(void)
{
	const char *s = getenv("ti_seed");
	unsigned long v;
	char *end;

	if (!s || !*s)
		return;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (!errno && !*end && (uint32_t)v)
		ti_rng = (uint32_t)v;
}

static uint32_t ti_rand(void)
{
	ti_rng ^= ti_rng << 13;
	ti_rng ^= ti_rng >> 17;
	ti_rng ^= ti_rng << 5;
	return ti_rng;
}

static uint64_t ti_rand64(void)
{
	return (uint64_t)ti_rand() << 32 | ti_rand();
}

static const unsigned long ti_cmds[] = {
	TI_GET_INFO, TI_SET_FREQ, TI_SET_RANGE, TI_RELEASE, TI_GET_STATS, TI_SAMPLE_CONFIG,
};
#define TI_NCMDS (sizeof(ti_cmds) / sizeof(ti_cmds[0]))

/* Index of cmd in ti_cmds, or -1: the module answers anything else with ENOTTY. */
static int ti_cmd_index(unsigned long cmd)
{
	size_t i;

	for (i = 0; i < TI_NCMDS; i++)
		if ((unsigned int)cmd == ti_cmds[i])
			return (int)i;
	return -1;
}

static int ti_is_level(const uint64_t *levels, size_t n, uint64_t hz)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (levels[i] == hz)
			return 1;
	return 0;
}

/* Nearest level, ties go to the higher one (as the module snaps). */
static uint64_t ti_snap(const uint64_t *levels, size_t n, uint64_t hz)
{
	uint64_t best = levels[0], best_d = UINT64_MAX, d;
	size_t i;

	for (i = 0; i < n; i++) {
		d = hz > levels[i] ? hz - levels[i] : levels[i] - hz;
		if (d <= best_d) {
			best = levels[i];
			best_d = d;
		}
	}
	return best;
}

/* How the module may reach the memory at an ioctl argument. */
enum ti_access {
	TI_ACC_NONE, /* NULL, unmapped, kernel, non-canonical: every copy faults */
	TI_ACC_EDGE, /* the last 16 bytes before a hole: copies of more fault */
	TI_ACC_RO,   /* a read-only page: copy_from_user works, copy_to_user faults */
	TI_ACC_RW,
};

/*
 * What the module must answer, from an independent reading of the ABI: 0 or -errno
 * for ioctl cmd with argument arg (the bytes at it in `in`, reachable as `acc`) on
 * the virtual GPU with no cooling cap, on an fd opened for writing or not. On
 * success *out_hz is the level the module must report (target_hz / applied_max_hz).
 */
static int ti_fuzz_expect(unsigned long cmd, unsigned long arg, const unsigned char *in,
			  enum ti_access acc, int writable, uint64_t *out_hz)
{
	size_t size = _IOC_SIZE(cmd), i;
	int idx = ti_cmd_index(cmd), readable, can_write;

	*out_hz = 0;
	if (idx < 0)
		return -ENOTTY;
	readable = acc == TI_ACC_RW || acc == TI_ACC_RO || (acc == TI_ACC_EDGE && size <= 16);
	can_write = acc == TI_ACC_RW || (acc == TI_ACC_EDGE && size <= 16);
	switch (ti_cmds[idx]) {
	case TI_GET_INFO:
	case TI_GET_STATS:
		return can_write ? 0 : -EFAULT;
	case TI_RELEASE:
		if (!writable)
			return -EBADF;
		return arg ? -EINVAL : 0;
	case TI_SAMPLE_CONFIG: {
		struct ti_sample_config c;

		if (!readable)
			return -EFAULT;
		memcpy(&c, in, sizeof(c));
		if (c.flags & ~TI_SAMPLE_F_ENABLE || c.__pad0)
			return -EINVAL;
		if (c.flags & TI_SAMPLE_F_ENABLE)
			return c.period_ns < TI_SAMPLE_PERIOD_MIN_NS ||
					       c.period_ns > TI_SAMPLE_PERIOD_MAX_NS ?
				       -EINVAL :
				       0;
		return c.period_ns ? -EINVAL : 0;
	}
	case TI_SET_FREQ: {
		struct ti_set_freq r;

		if (!writable)
			return -EBADF;
		if (!readable)
			return -EFAULT;
		memcpy(&r, in, sizeof(r));
		if (r.flags & ~TI_SET_FREQ_F_EXACT || r.__pad0)
			return -EINVAL;
		if (r.freq_hz < TI_BOTTOM || r.freq_hz > TI_TOP)
			return -ERANGE;
		if (r.flags & TI_SET_FREQ_F_EXACT && !ti_is_level(ti_levels, TI_NLEVELS, r.freq_hz))
			return -EINVAL;
		*out_hz = ti_snap(ti_levels, TI_NLEVELS, r.freq_hz);
		return can_write ? 0 : -EFAULT; /* pinned, but the answer cannot be written */
	}
	case TI_SET_RANGE: {
		struct ti_range r;
		uint64_t lo = 0, hi = 0;

		if (!writable)
			return -EBADF;
		if (!readable)
			return -EFAULT;
		memcpy(&r, in, sizeof(r));
		if (r.applied_min_hz || r.applied_max_hz || r.cur_freq_hz || r.t_ns)
			return -EINVAL;
		if (r.min_hz > r.max_hz)
			return -EINVAL;
		if (r.min_hz < TI_BOTTOM || r.max_hz > TI_TOP)
			return -ERANGE;
		for (i = 0; i < TI_NLEVELS; i++) {
			if (!lo && ti_levels[i] >= r.min_hz)
				lo = ti_levels[i];
			if (ti_levels[i] <= r.max_hz)
				hi = ti_levels[i];
		}
		if (!lo || !hi || lo > hi)
			return -EINVAL;
		*out_hz = hi;
		return can_write ? 0 : -EFAULT;
	}
	}
	return -ENOTTY;
}

/* A frequency: near a level (one below, at, one above), inside or around the table. */
static uint64_t ti_fuzz_hz(void)
{
	switch (ti_rand() % 4) {
	case 0:
		return ti_levels[ti_rand() % TI_NLEVELS] + ti_rand() % 3 - 1;
	case 1:
		return TI_BOTTOM - 1000000 + ti_rand() % (TI_TOP - TI_BOTTOM + 2000000);
	case 2:
		return ti_rand() % 2 ? 0 : ti_rand64();
	default:
		return ti_levels[ti_rand() % TI_NLEVELS];
	}
}

/* Flags and padding as one word: mostly small valid flags with zero padding. */
static uint64_t ti_fuzz_flags(void)
{
	switch (ti_rand() % 6) {
	case 0:
		return ti_rand64();
	case 1:
		return 1ULL << (ti_rand() % 64);
	default:
		return ti_rand() % 2;
	}
}

/*
 * Fill the first 64 bytes at p: random words, or shaped like one of our structs
 * (half the time the one cmd takes) with plausible fields, and then maybe one word
 * spoiled, so that every check of every command is hit from both sides.
 */
static void ti_fuzz_fill(unsigned char *p, unsigned long cmd)
{
	unsigned int shape = ti_rand() % 4;
	uint64_t w[8];
	size_t j;

	if (ti_rand() % 2) {
		if ((unsigned int)cmd == TI_SET_FREQ)
			shape = 0;
		else if ((unsigned int)cmd == TI_SET_RANGE)
			shape = 1;
		else if ((unsigned int)cmd == TI_SAMPLE_CONFIG)
			shape = 2;
	}
	for (j = 0; j < 8; j++)
		w[j] = ti_rand64();
	switch (shape) {
	case 0: /* ti_set_freq: freq_hz, flags|pad */
		w[0] = ti_fuzz_hz();
		w[1] = ti_fuzz_flags();
		break;
	case 1: /* ti_range: min_hz, max_hz, then four output fields that must be 0 */
		w[0] = ti_fuzz_hz();
		w[1] = ti_rand() % 4 ? w[0] + ti_rand() % (TI_TOP - TI_BOTTOM + 1) : ti_fuzz_hz();
		w[2] = w[3] = w[4] = w[5] = 0;
		break;
	case 2: /* ti_sample_config: period_ns, flags|pad */
		w[0] = ti_rand() % 3 ? ti_rand() % 2000000 : ti_rand() % 2 ? 0 : ti_rand64();
		w[1] = ti_fuzz_flags();
		break;
	default:
		break;
	}
	if (ti_rand() % 4 == 0)
		w[ti_rand() % 6] = ti_rand() % 2 ? ti_rand64() : 0;
	memcpy(p, w, sizeof(w));
}

struct ti_fuzz_tally {
	int calls, reads, mismatches;
	int by_ret[5]; /* 0, EFAULT, ENOTTY, EINVAL, ERANGE/EBADF */
	int ok_by_cmd[TI_NCMDS];
	char first[256];
};

static void ti_fuzz_count(struct ti_fuzz_tally *t, unsigned long cmd, int ret)
{
	int idx = ti_cmd_index(cmd);

	if (!ret && idx >= 0)
		t->ok_by_cmd[idx]++;
	t->by_ret[ret == 0 ? 0 : ret == -EFAULT ? 1 : ret == -ENOTTY ? 2 : ret == -EINVAL ? 3 : 4]++;
}

/*
 * Random commands (real ones, our type with random number, direction and size,
 * real ones with a wrong size), random and plausible contents, and pointers that
 * are NULL, low, non-canonical, kernel, unmapped, read-only or straddle a hole; on
 * the read-write fd and a read-only one. Every answer is compared with
 * ti_fuzz_expect(), and every successful pin with the level it must report.
 */
static void ti_fuzz(int fd)
{
	long page = sysconf(_SC_PAGESIZE);
	struct ti_fuzz_tally t = { 0 };
	unsigned char *buf, *edge, *ro, in[64];
	char why[256] = "";
	int i, rdonly;

	rdonly = open(TI_DEV, O_RDONLY);
	buf = mmap(NULL, 3 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	/* the second page becomes a hole */
	if (buf == MAP_FAILED || rdonly < 0 || munmap(buf + page, page)) {
		ti_check(0, "ioctl_fuzz", "mmap, munmap or open: %s", strerror(errno));
		return;
	}
	edge = buf + page - 16;   /* a struct that runs into the hole */
	ro = buf + 2 * page;
	for (i = 0; i < TI_FUZZ_ROUNDS; i++) {
		int on_rdonly = ti_rand() % 8 == 0, ret, want;
		enum ti_access acc = TI_ACC_NONE;
		unsigned long cmd, arg;
		uint64_t want_hz;

		switch (ti_rand() % 6) {
		case 0:
		case 4:
		case 5: /* a real command, half the time */
			cmd = ti_cmds[ti_rand() % TI_NCMDS];
			break;
		case 1: /* our type, random nr, direction and size */
			cmd = _IOC(ti_rand() % 4, TI_IOC_MAGIC, ti_rand() % 16, ti_rand() % 512);
			break;
		case 2: /* a real command with a wrong size */
			cmd = (ti_cmds[ti_rand() % TI_NCMDS] & ~(_IOC_SIZEMASK << _IOC_SIZESHIFT)) |
			      ((unsigned long)(ti_rand() % 1024) << _IOC_SIZESHIFT);
			break;
		default: /* our type, every other bit random */
			cmd = (ti_rand() & ~(0xffUL << _IOC_TYPESHIFT)) |
			      ((unsigned long)TI_IOC_MAGIC << _IOC_TYPESHIFT);
			break;
		}
		memset(in, 0, sizeof(in));
		switch (ti_rand() % 8) {
		case 0:
			arg = 0;
			break;
		case 1: /* below mmap_min_addr, or non-canonical: never our memory */
			arg = ti_rand() % 2 ? ti_rand() % 65536 : 0x0000800000000000ULL + ti_rand();
			break;
		case 2:
			arg = 0xffffffff81000000UL; /* kernel text */
			break;
		case 3:
			ti_fuzz_fill(in, cmd);
			memcpy(edge, in, 16);
			arg = (unsigned long)edge;
			acc = TI_ACC_EDGE;
			break;
		case 4:
			arg = (unsigned long)(buf + page); /* unmapped */
			break;
		case 5:
			ti_fuzz_fill(in, cmd);
			if (mprotect(ro, page, PROT_READ | PROT_WRITE)) {
				ti_check(0, "ioctl_fuzz", "mprotect: %s", strerror(errno));
				return;
			}
			memcpy(ro, in, sizeof(in));
			if (mprotect(ro, page, PROT_READ)) {
				ti_check(0, "ioctl_fuzz", "mprotect: %s", strerror(errno));
				return;
			}
			arg = (unsigned long)ro;
			acc = TI_ACC_RO;
			break;
		default:
			ti_fuzz_fill(in, cmd);
			memcpy(buf, in, sizeof(in));
			arg = (unsigned long)buf;
			acc = TI_ACC_RW;
			break;
		}
		want = ti_fuzz_expect(cmd, arg, in, acc, !on_rdonly, &want_hz);
		ret = ioctl(on_rdonly ? rdonly : fd, cmd, arg) ? -errno : 0;
		t.calls++;
		ti_fuzz_count(&t, cmd, ret);
		if (ret == 0 && acc == TI_ACC_RW && want_hz) {
			const struct ti_set_freq *sf = (const void *)buf;
			const struct ti_range *sr = (const void *)buf;
			int is_freq = (unsigned int)cmd == TI_SET_FREQ;
			uint64_t got = is_freq ? sf->target_hz : sr->applied_max_hz;
			uint64_t applied = is_freq ? sf->applied_hz : sr->cur_freq_hz;

			/* virtual GPU, no other request, no cap: it runs at what we pinned */
			if (got != want_hz || applied != want_hz)
				want = -EPROTO;
		}
		if (ret != want && !t.mismatches++)
			snprintf(t.first, sizeof(t.first),
				 "call %d cmd %#lx arg %#lx acc %d rdonly %d: ret %d, expected %d", i,
				 cmd, arg, acc, on_rdonly, ret, want);
		if (i % 512 == 0) { /* reads with a kernel buffer: never written */
			int flags = fcntl(fd, F_GETFL);
			ssize_t n = -1;

			errno = EBADF;
			if (flags >= 0 && !fcntl(fd, F_SETFL, flags | O_NONBLOCK))
				n = read(fd, (void *)0xffffffff81000000UL, 4096);
			ret = n < 0 ? -errno : (int)n;
			if (flags < 0 || fcntl(fd, F_SETFL, flags))
				ret = -EPROTO;
			t.reads++;
			if (ret != 0 && ret != -EFAULT && ret != -EAGAIN && !t.mismatches++)
				snprintf(t.first, sizeof(t.first), "read into kernel memory: %d", ret);
		}
	}
	/* a fuzzed TI_SAMPLE_CONFIG may have started the sampler */
	ti_ioc(fd, TI_SAMPLE_CONFIG, &(struct ti_sample_config){ 0 });
	ti_ioc(fd, TI_RELEASE, NULL);
	if (munmap(buf, page) || munmap(ro, page) || close(rdonly)) {
		t.mismatches++;
		snprintf(t.first, sizeof(t.first), "cleanup: %s", strerror(errno));
	}
	printf("TI-FUZZ ioctls=%d reads=%d mismatches=%d ok=%d efault=%d enotty=%d einval=%d "
	       "other=%d ok_get_info=%d ok_set_freq=%d ok_set_range=%d ok_release=%d "
	       "ok_get_stats=%d ok_sample_config=%d\n",
	       t.calls, t.reads, t.mismatches, t.by_ret[0], t.by_ret[1], t.by_ret[2], t.by_ret[3],
	       t.by_ret[4], t.ok_by_cmd[0], t.ok_by_cmd[1], t.ok_by_cmd[2], t.ok_by_cmd[3],
	       t.ok_by_cmd[4], t.ok_by_cmd[5]);
	ti_check(t.calls >= 10000, "ioctl_fuzz_count", "only %d calls", t.calls);
	ti_check(!t.mismatches, "ioctl_fuzz_every_answer_as_the_abi_says", "%d mismatches, first: %s",
		 t.mismatches, t.first);
	ti_check(t.ok_by_cmd[0] && t.ok_by_cmd[1] && t.ok_by_cmd[2] && t.ok_by_cmd[3] &&
			 t.ok_by_cmd[4] && t.ok_by_cmd[5],
		 "ioctl_fuzz_reached_every_success_path", "a command never succeeded");
	ti_check(ti_cur_freq() == TI_TOP, "fuzz_leaves_device_usable", "cur %llu",
		 (unsigned long long)ti_cur_freq());
	ti_check(ti_dmesg_clean(why, sizeof(why)), "ioctl_fuzz_no_oops_no_warn", "%s", why);
}

/* ---- several processes, each with its own requests ------------------------ */

#define TI_OPENERS 4
#define TI_MODEL_STEPS 400
#define TI_STRESS_ROUNDS 6
#define TI_STRESS_CALLS 300

/* The GPU under test as user space sees it. */
struct ti_gpu {
	const uint64_t *levels; /* ascending */
	size_t n;
	/*
	 * Where its governor heads with no request: the top on the virtual GPU
	 * (total_time 0), the bottom on ti_fakegpu (25% busy).
	 */
	int governor_wants_top;
};

enum ti_op_code {
	TI_OP_SET_FREQ,  /* a */
	TI_OP_SET_RANGE, /* [a, b] */
	TI_OP_RELEASE,
	TI_OP_CLOSE,
	TI_OP_OPEN,
	TI_OP_EXIT,   /* _exit() with the fd open: the kernel closes it */
	TI_OP_STRESS, /* random ioctls, then the final request [a, b] (a == 0: none) */
};

struct ti_op {
	int code;
	uint32_t seed;
	uint64_t a, b;
};

struct ti_reply {
	int ret;     /* 0 or -errno */
	uint64_t hz; /* SET_FREQ applied_hz, SET_RANGE cur_freq_hz */
};

/* One opener process and its requests, as the parent's model has them. */
struct ti_opener {
	pid_t pid;
	int to_fd;
	int from_fd;
	int pinned;
	uint64_t min_hz, max_hz;
};

static uint32_t ti_xs(uint32_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 17;
	*x ^= *x << 5;
	return *x;
}

/* Random valid ioctls from one opener, then its final request. */
static int ti_opener_stress(int fd, const struct ti_gpu *g, const struct ti_op *op,
			    uint64_t *hz)
{
	uint32_t x = op->seed | 1;
	struct ti_set_freq sf;
	struct ti_range rg;
	struct ti_stats st;
	struct ti_info info;
	int i, ret = 0, r;

	for (i = 0; i < TI_STRESS_CALLS; i++) {
		size_t lo = ti_xs(&x) % g->n, hi = lo + ti_xs(&x) % (g->n - lo);

		switch (ti_xs(&x) % 5) {
		case 0:
			r = ti_set_freq(fd, g->levels[lo], TI_SET_FREQ_F_EXACT, NULL);
			break;
		case 1:
			r = ti_set_range(fd, g->levels[lo], g->levels[hi], NULL);
			break;
		case 2:
			r = ti_ioc(fd, TI_RELEASE, NULL);
			break;
		case 3:
			r = ti_ioc(fd, TI_GET_STATS, &st);
			break;
		default:
			r = ti_ioc(fd, TI_GET_INFO, &info);
			break;
		}
		if (r && !ret)
			ret = r;
	}
	if (!op->a) {
		r = ti_ioc(fd, TI_RELEASE, NULL);
	} else if (op->a == op->b) {
		r = ti_set_freq(fd, op->a, TI_SET_FREQ_F_EXACT, &sf);
		*hz = sf.applied_hz;
	} else {
		r = ti_set_range(fd, op->a, op->b, &rg);
		*hz = rg.cur_freq_hz;
	}
	return ret ? ret : r;
}

static void __attribute__((noreturn)) ti_opener_main(int in, int out, const struct ti_gpu *g)
{
	struct ti_reply rep = { 0 };
	struct ti_set_freq sf;
	struct ti_range rg;
	struct ti_op op;
	int fd = open(TI_DEV, O_RDWR);

	rep.ret = fd < 0 ? -errno : 0;
	if (write(out, &rep, sizeof(rep)) != sizeof(rep))
		_exit(2);
	while (read(in, &op, sizeof(op)) == sizeof(op)) {
		rep = (struct ti_reply){ 0 };
		switch (op.code) {
		case TI_OP_SET_FREQ:
			rep.ret = ti_set_freq(fd, op.a, TI_SET_FREQ_F_EXACT, &sf);
			rep.hz = sf.applied_hz;
			break;
		case TI_OP_SET_RANGE:
			rep.ret = ti_set_range(fd, op.a, op.b, &rg);
			rep.hz = rg.cur_freq_hz;
			break;
		case TI_OP_RELEASE:
			rep.ret = ti_ioc(fd, TI_RELEASE, NULL);
			break;
		case TI_OP_CLOSE:
			rep.ret = close(fd) ? -errno : 0;
			fd = -1;
			break;
		case TI_OP_OPEN:
			fd = open(TI_DEV, O_RDWR);
			rep.ret = fd < 0 ? -errno : 0;
			break;
		case TI_OP_EXIT:
			_exit(0);
		case TI_OP_STRESS:
			rep.ret = ti_opener_stress(fd, g, &op, &rep.hz);
			break;
		default:
			rep.ret = -EINVAL;
			break;
		}
		if (write(out, &rep, sizeof(rep)) != sizeof(rep))
			_exit(2);
	}
	_exit(0);
}

/* Fork an opener; it opens its own fd. Returns its open() result. */
static int ti_opener_spawn(struct ti_opener *o, const struct ti_gpu *g, int parent_fd)
{
	struct ti_reply rep;
	int to[2], from[2];

	if (pipe(to))
		return -errno;
	if (pipe(from)) {
		close(to[0]);
		close(to[1]);
		return -errno;
	}
	o->pid = fork();
	if (o->pid == 0) {
		close(to[1]);
		close(from[0]);
		if (parent_fd >= 0)
			close(parent_fd); /* only its own fd holds requests */
		ti_opener_main(to[0], from[1], g);
	}
	close(to[0]);
	close(from[1]);
	o->to_fd = to[1];
	o->from_fd = from[0];
	o->pinned = 0;
	if (o->pid < 0) {
		close(o->to_fd);
		close(o->from_fd);
		return -EAGAIN;
	}
	if (read(o->from_fd, &rep, sizeof(rep)) != sizeof(rep))
		return -EIO;
	return rep.ret;
}

/* Wait for a dead opener (exited or killed) and drop its pipes. 0 or -errno. */
static int ti_opener_reap(struct ti_opener *o)
{
	int ret = waitpid(o->pid, NULL, 0) == o->pid ? 0 : -errno;

	close(o->to_fd);
	close(o->from_fd);
	o->pid = -1;
	o->pinned = 0;
	return ret;
}

static int ti_opener_send(struct ti_opener *o, const struct ti_op *op)
{
	return write(o->to_fd, op, sizeof(*op)) == sizeof(*op) ? 0 : -EIO;
}

static int ti_opener_recv(struct ti_opener *o, struct ti_reply *rep)
{
	return read(o->from_fd, rep, sizeof(*rep)) == sizeof(*rep) ? 0 : -EIO;
}

static int ti_opener_do(struct ti_opener *o, const struct ti_op *op, struct ti_reply *rep)
{
	int ret = ti_opener_send(o, op);

	return ret ? ret : ti_opener_recv(o, rep);
}

/*
 * PM QoS as devfreq applies it: the floor is the highest min request, the ceiling
 * the lowest max request, a floor above the ceiling is lowered to it, and the
 * governor's wish is clamped into [floor, ceiling].
 */
static uint64_t ti_qos_expect(const struct ti_gpu *g, const struct ti_opener *o, int n,
			      uint64_t *qos_max_hz)
{
	uint64_t lo = g->levels[0], hi = g->levels[g->n - 1];
	int i;

	*qos_max_hz = 0;
	for (i = 0; i < n; i++) {
		if (!o[i].pinned)
			continue;
		lo = o[i].min_hz > lo ? o[i].min_hz : lo;
		hi = o[i].max_hz < hi ? o[i].max_hz : hi;
		if (!*qos_max_hz || o[i].max_hz < *qos_max_hz)
			*qos_max_hz = o[i].max_hz;
	}
	if (lo > hi)
		lo = hi;
	return g->governor_wants_top ? hi : lo;
}

/* A random request for the model: [a, b] levels, a == b for TI_SET_FREQ. */
static void ti_random_request(const struct ti_gpu *g, struct ti_op *op, int single)
{
	size_t lo = ti_rand() % g->n, hi = single ? lo : lo + ti_rand() % (g->n - lo);

	op->a = g->levels[lo];
	op->b = g->levels[hi];
}

struct ti_conc_tally {
	int steps, checks, mismatches, kills, exits, closes, stress_rounds;
	char first[256];
};

static void ti_conc_compare(struct ti_conc_tally *t, const struct ti_gpu *g,
			    const struct ti_opener *o, int fd, const char *what,
			    const struct ti_reply *rep)
{
	struct ti_info info = { 0 };
	uint64_t qos_max, want = ti_qos_expect(g, o, TI_OPENERS, &qos_max);
	uint64_t cur = ti_wait_freq(want);
	int info_ret = ti_ioc(fd, TI_GET_INFO, &info);

	t->checks++;
	if (cur == want && info_ret == 0 && info.cur_freq_hz == want && info.qos_max_hz == qos_max &&
	    (!rep || (rep->ret == 0 && (!rep->hz || rep->hz == want))))
		return;
	if (!t->mismatches++)
		snprintf(t->first, sizeof(t->first),
			 "step %d after %s: cur_freq %llu want %llu, info %d cur %llu qos_max %llu "
			 "want %llu, reply %d %llu",
			 t->steps, what, (unsigned long long)cur, (unsigned long long)want, info_ret,
			 (unsigned long long)info.cur_freq_hz, (unsigned long long)info.qos_max_hz,
			 (unsigned long long)qos_max, rep ? rep->ret : 0,
			 rep ? (unsigned long long)rep->hz : 0ULL);
}

/* One random step on one opener, then compare with the model. */
static int ti_conc_step(struct ti_conc_tally *t, const struct ti_gpu *g, struct ti_opener *o,
			int fd)
{
	struct ti_opener *c = &o[ti_rand() % TI_OPENERS];
	struct ti_op op = { 0 };
	struct ti_reply rep = { 0 };
	unsigned int dice = ti_rand() % 20;
	const char *what;
	int ret;

	t->steps++;
	if (dice < 7) {
		op.code = dice < 3 ? TI_OP_SET_FREQ : TI_OP_SET_RANGE;
		ti_random_request(g, &op, op.code == TI_OP_SET_FREQ);
		c->pinned = 1;
		c->min_hz = op.a;
		c->max_hz = op.b;
		what = op.code == TI_OP_SET_FREQ ? "set_freq" : "set_range";
		ret = ti_opener_do(c, &op, &rep);
	} else if (dice < 10) {
		op.code = TI_OP_RELEASE;
		c->pinned = 0;
		what = "release";
		ret = ti_opener_do(c, &op, &rep);
	} else if (dice < 13) {
		op.code = TI_OP_CLOSE;
		c->pinned = 0;
		what = "close";
		t->closes++;
		ret = ti_opener_do(c, &op, &rep);
		op.code = TI_OP_OPEN;
		if (!ret && !rep.ret)
			ret = ti_opener_do(c, &op, &rep);
	} else {
		what = dice < 16 ? "exit" : "sigkill";
		if (dice < 16) {
			op.code = TI_OP_EXIT;
			ret = ti_opener_send(c, &op);
			t->exits++;
		} else {
			ret = kill(c->pid, SIGKILL) ? -errno : 0;
			t->kills++;
		}
		ret = ret ? ret : ti_opener_reap(c);
		if (!ret) /* the dead one's requests must be gone before it is replaced */
			ti_conc_compare(t, g, o, fd, what, NULL);
		ret = ret ? ret : ti_opener_spawn(c, g, fd);
		rep.ret = 0;
	}
	if (ret) {
		snprintf(t->first, sizeof(t->first), "step %d %s: opener lost: %d", t->steps, what, ret);
		t->mismatches++;
		return ret;
	}
	ti_conc_compare(t, g, o, fd, what, &rep);
	return 0;
}

/*
 * All openers at once: TI_STRESS_CALLS random ioctls each, then each settles on a
 * final request (or none); in some rounds one opener is SIGKILLed mid-stress.
 */
static int ti_conc_stress(struct ti_conc_tally *t, const struct ti_gpu *g, struct ti_opener *o,
			  int fd)
{
	struct ti_reply rep;
	struct ti_op op;
	int i, victim = -1, ret = 0, r;

	t->stress_rounds++;
	if (t->stress_rounds % 2 == 0)
		victim = (int)(ti_rand() % TI_OPENERS);
	for (i = 0; i < TI_OPENERS; i++) {
		op = (struct ti_op){ .code = TI_OP_STRESS, .seed = ti_rand() };
		if (ti_rand() % 4)
			ti_random_request(g, &op, ti_rand() % 2);
		o[i].pinned = op.a != 0;
		o[i].min_hz = op.a;
		o[i].max_hz = op.b;
		r = ti_opener_send(&o[i], &op);
		ret = ret ? ret : r;
	}
	if (victim >= 0) {
		usleep(ti_rand() % 20000);
		r = kill(o[victim].pid, SIGKILL) ? -errno : 0;
		ret = ret ? ret : r;
		t->kills++;
	}
	for (i = 0; i < TI_OPENERS; i++) {
		if (i == victim)
			continue;
		r = ti_opener_recv(&o[i], &rep);
		if (!r && rep.ret && !t->mismatches++)
			snprintf(t->first, sizeof(t->first), "stress round %d opener %d: ioctl %d",
				 t->stress_rounds, i, rep.ret);
		ret = ret ? ret : r;
	}
	if (victim >= 0) {
		r = ti_opener_reap(&o[victim]);
		r = r ? r : ti_opener_spawn(&o[victim], g, fd);
		ret = ret ? ret : r;
	}
	if (!ret)
		ti_conc_compare(t, g, o, fd, "stress", NULL);
	return ret;
}

/*
 * Several processes, each with its own fd and requests: at every step the clock
 * must be what PM QoS makes of all live requests, and each process's requests must
 * go when it releases, closes, exits or is killed.
 */
static void ti_check_concurrent(int fd, const struct ti_gpu *g, const char *phase)
{
	struct ti_opener o[TI_OPENERS];
	struct ti_conc_tally t = { 0 };
	struct ti_op op = { .code = TI_OP_EXIT };
	char name[64];
	int i, ret = 0, spawned = 0;
	uint64_t after;

	for (i = 0; i < TI_OPENERS && !ret; i++, spawned++)
		ret = ti_opener_spawn(&o[i], g, fd);
	for (i = 0; i < TI_MODEL_STEPS && !ret; i++)
		ret = ti_conc_step(&t, g, o, fd);
	for (i = 0; i < TI_STRESS_ROUNDS && !ret; i++)
		ret = ti_conc_stress(&t, g, o, fd);
	for (i = 0; i < spawned; i++) {
		if (o[i].pid <= 0)
			continue;
		if (ti_opener_send(&o[i], &op) && kill(o[i].pid, SIGKILL) && !ret)
			ret = -errno;
		if (ti_opener_reap(&o[i]) && !ret)
			ret = -ECHILD;
	}
	after = ti_wait_freq(g->governor_wants_top ? g->levels[g->n - 1] : g->levels[0]);
	printf("TI-CONCURRENT phase=%s processes=%d steps=%d stress_rounds=%d checks=%d "
	       "mismatches=%d closes=%d exits=%d kills=%d\n",
	       phase, TI_OPENERS, t.steps, t.stress_rounds, t.checks, t.mismatches, t.closes,
	       t.exits, t.kills);
	snprintf(name, sizeof(name), "%s_concurrent_openers_combine_as_pm_qos", phase);
	ti_check(!ret && !t.mismatches && t.steps == TI_MODEL_STEPS &&
			 t.stress_rounds == TI_STRESS_ROUNDS,
		 name, "ret %d, %d mismatches, first: %s", ret, t.mismatches, t.first);
	snprintf(name, sizeof(name), "%s_concurrent_openers_all_released", phase);
	ti_check(after == (g->governor_wants_top ? g->levels[g->n - 1] : g->levels[0]), name,
		 "cur %llu", (unsigned long long)after);
}

/* ---- rmmod while an fd is open -------------------------------------------- */

/* turboinfer's reference count from /proc/modules, -1 when not loaded. */
static int ti_module_refcount(void)
{
	char line[256], name[64];
	int refs, found = -1;
	FILE *fp = fopen("/proc/modules", "r");

	if (!fp)
		return -1;
	while (fgets(line, sizeof(line), fp))
		if (sscanf(line, "%63s %*u %d", name, &refs) == 2 && !strcmp(name, "turboinfer"))
			found = refs;
	fclose(fp);
	return found;
}

/* An open fd holds the module: delete_module is refused, and the device keeps working. */
static void ti_check_rmmod_refused(int fd)
{
	int before, with_two, after, ret, fd2, pinned;
	struct ti_info info;

	pinned = ti_set_freq(fd, 400000000, 0, NULL);
	before = ti_module_refcount();
	errno = 0;
	ret = syscall(SYS_delete_module, "turboinfer", O_NONBLOCK) ? -errno : 0;
	printf("TI-RMMOD-BUSY delete_module=%d (%s) refcount=%d\n", ret, strerror(-ret), before);
	ti_check(ret == -EAGAIN || ret == -EBUSY, "rmmod_refused_while_fd_open", "ret %d", ret);
	ti_check(pinned == 0 && access(TI_DEV, F_OK) == 0 && ti_cur_freq() == 400000000 &&
			 ti_ioc(fd, TI_GET_INFO, &info) == 0 &&
			 ti_set_freq(fd, 525000000, 0, NULL) == 0 && ti_cur_freq() == 525000000,
		 "device_intact_after_refused_rmmod", "cur %llu", (unsigned long long)ti_cur_freq());
	fd2 = open(TI_DEV, O_RDONLY);
	with_two = ti_module_refcount();
	if (fd2 >= 0)
		close(fd2);
	after = ti_module_refcount();
	ti_check(before >= 1 && fd2 >= 0 && with_two == before + 1 && after == before,
		 "module_refcount_counts_open_fds", "refcount %d, with a second fd %d, after %d",
		 before, with_two, after);
	ti_ioc(fd, TI_RELEASE, NULL);
}

static void ti_timing(int fd)
{
	static uint64_t ioc_ns[TI_TIMING_ROUNDS], sysfs_ns[TI_TIMING_ROUNDS],
		held_ns[TI_TIMING_ROUNDS];
	int i, ok = 1, fmin, fmax;
	uint64_t t0, a, b, c;

	for (i = 0; i < TI_TIMING_ROUNDS; i++) {
		uint64_t hz = i % 2 ? TI_TOP : TI_BOTTOM;

		t0 = ti_now_ns();
		ti_set_freq(fd, hz, 0, NULL);
		ioc_ns[i] = ti_now_ns() - t0;
		ok &= ti_cur_freq() == hz;
	}
	ti_ioc(fd, TI_RELEASE, NULL);
	for (i = 0; i < TI_TIMING_ROUNDS; i++) {
		uint64_t hz = i % 2 ? TI_TOP : TI_BOTTOM;

		/* a controller writing sysfs: open, write, close, max then min */
		t0 = ti_now_ns();
		ti_write_u64(TI_DF "/max_freq", hz);
		ti_write_u64(TI_DF "/min_freq", hz);
		sysfs_ns[i] = ti_now_ns() - t0;
		ok &= ti_cur_freq() == hz;
	}
	fmax = open(TI_DF "/max_freq", O_WRONLY);
	fmin = open(TI_DF "/min_freq", O_WRONLY);
	for (i = 0; i < TI_TIMING_ROUNDS && fmin >= 0 && fmax >= 0; i++) {
		const char *s = i % 2 ? "670000000" : "305000000";

		/* the cheapest sysfs path: files held open, pwrite at offset 0 */
		t0 = ti_now_ns();
		ok &= pwrite(fmax, s, strlen(s), 0) > 0;
		ok &= pwrite(fmin, s, strlen(s), 0) > 0;
		held_ns[i] = ti_now_ns() - t0;
		ok &= ti_cur_freq() == (i % 2 ? TI_TOP : TI_BOTTOM);
	}
	if (fmin >= 0)
		close(fmin);
	if (fmax >= 0)
		close(fmax);
	ti_write_u64(TI_DF "/min_freq", 0);
	ti_write_u64(TI_DF "/max_freq", 0);
	ti_check(ok && ti_cur_freq() == TI_TOP, "timing_runs_took_effect", "cur %llu",
		 (unsigned long long)ti_cur_freq());
	a = ti_median(ioc_ns, TI_TIMING_ROUNDS);
	b = ti_median(sysfs_ns, TI_TIMING_ROUNDS);
	c = ti_median(held_ns, TI_TIMING_ROUNDS);
	printf("TI-TIMING rounds=%d set_freq_ioctl_median_ns=%llu "
	       "sysfs_minmax_open_write_close_median_ns=%llu sysfs_minmax_held_pwrite_median_ns=%llu "
	       "ratio_sysfs_over_ioctl=%.2f ratio_held_sysfs_over_ioctl=%.2f "
	       "(qemu TCG: only the ratios mean anything)\n",
	       TI_TIMING_ROUNDS, (unsigned long long)a, (unsigned long long)b,
	       (unsigned long long)c, a ? (double)b / a : 0.0, a ? (double)c / a : 0.0);
}

static int ti_run(void)
{
	int fd = open(TI_DEV, O_RDWR);

	printf("TI-SEED ti_seed=%u\n", ti_rng);
	ti_check(fd >= 0, "open_dev", "%s", strerror(errno));
	if (fd < 0)
		return 1;
	ti_check_info(fd);
	ti_check_set_freq(fd);
	ti_check_set_range(fd);
	ti_check_release(fd);
	ti_check_stats(fd);
	ti_check_bad_calls(fd);
	ti_check_thermal(fd);
	ti_check_close_releases();
	ti_check_sigkill_releases();
	ti_check_sampler(fd);
	ti_fuzz(fd);
	ti_check_concurrent(fd, &(struct ti_gpu){ .levels = ti_levels, .n = TI_NLEVELS,
						  .governor_wants_top = 1 },
			    "virtual");
	ti_check_rmmod_refused(fd);
	ti_timing(fd);
	close(fd);
	printf("TI-RUN passed=%d failed=%d\n", ti_passes, ti_failures);
	return ti_failures ? 1 : 0;
}

/* Attached to ti_fakegpu.ko's "13000000.mali" (descending table, 25% busy). */
static int ti_attach(void)
{
	static const uint64_t want[] = { 325000000, 572000000, 702000000 };
	char cdir[300], path[340];
	struct ti_set_freq r;
	struct ti_stats a, b;
	struct ti_info info;
	size_t i;
	int fd, ret, ok = 1;

	ti_df_dir = "/sys/class/devfreq/13000000.mali";
	fd = open(TI_DEV, O_RDWR);
	ti_check(fd >= 0, "attach_open_dev", "%s", strerror(errno));
	if (fd < 0)
		return 1;
	ret = ti_ioc(fd, TI_GET_INFO, &info);
	ti_check(ret == 0 && !strcmp(info.name, "13000000.mali") &&
			 !(info.flags & TI_INFO_F_VIRTUAL),
		 "attach_found_by_suffix", "ret %d name %.64s flags %#x", ret, info.name, info.flags);
	for (i = 0; i < 3; i++)
		ok &= info.freqs_hz[i] == want[i];
	ti_check(info.num_freqs == 3 && ok, "attach_table_sorted_ascending", "num %u",
		 info.num_freqs);
	ok = 1;
	for (i = 0; i < 3; i++) {
		ret = ti_set_freq(fd, want[2 - i], TI_SET_FREQ_F_EXACT, &r);
		ok &= ret == 0 && r.applied_hz == want[2 - i] && ti_cur_freq() == want[2 - i];
	}
	ti_check(ok, "attach_set_freq_each_level", "cur %llu", (unsigned long long)ti_cur_freq());
	ti_check(ti_set_freq(fd, 100000000, 0, NULL) == -ERANGE, "attach_rejects_out_of_range",
		 "");

	ti_ioc(fd, TI_GET_STATS, &a);
	usleep(20000);
	ret = ti_ioc(fd, TI_GET_STATS, &b);
	/* the driver reports busy 250 of 1000 in every window */
	ti_check(ret == 0 && b.flags & TI_STATS_F_BUSY_ESTIMATED &&
			 !(b.flags & TI_STATS_F_BUSY_SIMULATED) &&
			 b.window_busy_ns * 100 >= b.window_total_ns * 24 &&
			 b.window_busy_ns * 100 <= b.window_total_ns * 26,
		 "attach_busy_estimated_from_governor_window", "flags %#x busy %llu/%llu",
		 b.flags, (unsigned long long)b.window_busy_ns,
		 (unsigned long long)b.window_total_ns);

	ti_set_freq(fd, 702000000, 0, NULL);
	if (ti_find_cooling(cdir, sizeof(cdir))) {
		snprintf(path, sizeof(path), "%s/cur_state", cdir);
		ret = ti_write_u64(path, 1);
		ti_set_freq(fd, 702000000, 0, &r);
		ti_check(ret == 0 && r.applied_hz == 572000000 && ti_cur_freq() == 572000000,
			 "attach_cooling_cap", "ret %d applied %llu", ret,
			 (unsigned long long)r.applied_hz);
		ti_write_u64(path, 0);
	} else {
		ti_check(0, "attach_cooling_cap", "no turboinfer cooling device");
	}
	/* released: simple_ondemand at 25% busy goes to the lowest level */
	ret = ti_ioc(fd, TI_RELEASE, NULL);
	ti_check(ret == 0 && ti_cur_freq() == 325000000, "attach_release_to_governor",
		 "cur %llu", (unsigned long long)ti_cur_freq());
	/* here the governor heads down, so the min requests show too */
	ti_check_concurrent(fd, &(struct ti_gpu){ .levels = want, .n = 3 }, "attach");
	close(fd);
	printf("TI-ATTACH passed=%d failed=%d\n", ti_passes, ti_failures);
	return ti_failures ? 1 : 0;
}

/* phases: "NAME=RC" for each step /init ran; each must have exited 0. */
static int ti_post(int nphases, char **phases)
{
	char why[256] = "", cdir[300], name[96];
	int clean = ti_dmesg_clean(why, sizeof(why));
	int i, rc;

	for (i = 0; i < nphases; i++) {
		const char *eq = strchr(phases[i], '=');

		rc = eq && eq[1] ? atoi(eq + 1) : -1;
		snprintf(name, sizeof(name), "phase_%.*s_rc_0", eq ? (int)(eq - phases[i]) : 32,
			 phases[i]);
		ti_check(eq && rc == 0, name, "%s", phases[i]);
	}
	ti_check(nphases > 0, "post_got_phases", "no NAME=RC arguments");
	ti_check(access(TI_DEV, F_OK) != 0 && access(TI_DF, F_OK) != 0 &&
			 !ti_find_cooling(cdir, sizeof(cdir)),
		 "rmmod_removed_everything", "");
	ti_check(clean, "kernel_log_clean", "%s", why);
	if (ti_failures)
		printf("TURBOINFER-BOOTTEST: FAIL (%d post checks failed)\n", ti_failures);
	else
		printf("TURBOINFER-BOOTTEST: PASS\n");
	return ti_failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	ti_seed_from_env();
	if (argc == 2 && !strcmp(argv[1], "run"))
		return ti_run();
	if (argc == 2 && !strcmp(argv[1], "attach"))
		return ti_attach();
	if (argc >= 2 && !strcmp(argv[1], "post"))
		return ti_post(argc - 2, argv + 2);
	fprintf(stderr, "usage: %s run | attach | post NAME=RC...\n", argv[0]);
	return 2;
}
