// SPDX-License-Identifier: GPL-2.0
/*
 * In-guest checks for turboinfer.ko (virtual=1), run by the initramfs of boottest.sh.
 *
 *   ti_boottest run                  every check; prints "TI-CHECK ok|FAIL <name>"
 *                                    lines and the timing line; exits 1 on failure
 *   ti_boottest attach               turboinfer.ko target=mali on ti_fakegpu.ko: the
 *                                    attach path of a real GPU driver's devfreq
 *   ti_boottest post RUN_RC RMMOD_RC ATTACH_RC
 *                                    after rmmod: checks it left nothing behind and
 *                                    a clean kernel log; prints the verdict line
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../turboinfer_uapi.h"

#define TI_DEV "/dev/turboinfer"
#define TI_DF "/sys/class/devfreq/turboinfer-vgpu"
#define TI_TIMING_ROUNDS 200
#define TI_FUZZ_ROUNDS 4000

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

/* Kernel log problems: oops, WARN, BUG, lockdep or KASAN reports. */
static int ti_dmesg_clean(char *why, size_t len)
{
	static const char *const bad[] = {
		"Oops", "WARNING:", "BUG:", "Call Trace", "general protection",
		"possible recursive locking", "circular locking", "Kernel panic",
		"refcount_t:", "list_add corruption", "list_del corruption",
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

static uint32_t ti_rng = 0x12345678;

static uint32_t ti_rand(void)
{
	ti_rng ^= ti_rng << 13;
	ti_rng ^= ti_rng >> 17;
	ti_rng ^= ti_rng << 5;
	return ti_rng;
}

static void ti_fuzz(int fd)
{
	static const unsigned long cmds[] = {
		TI_GET_INFO, TI_SET_FREQ, TI_SET_RANGE, TI_RELEASE, TI_GET_STATS, TI_SAMPLE_CONFIG,
	};
	long page = sysconf(_SC_PAGESIZE);
	unsigned char *buf, *edge;
	char why[256] = "";
	int i, crashes = 0;

	buf = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED) {
		ti_check(0, "ioctl_fuzz", "mmap");
		return;
	}
	munmap(buf + page, page); /* the second page is now a hole */
	edge = buf + page - 16;   /* a struct that runs into the hole */
	for (i = 0; i < TI_FUZZ_ROUNDS; i++) {
		unsigned long cmd;
		void *arg;
		uint32_t r = ti_rand();
		size_t j;

		switch (r % 4) {
		case 0: /* a real command */
			cmd = cmds[ti_rand() % 6];
			break;
		case 1: /* our type, random nr, direction and size */
			cmd = _IOC(ti_rand() % 4, TI_IOC_MAGIC, ti_rand() % 16, ti_rand() % 512);
			break;
		case 2: /* a real command with a wrong size */
			cmd = (cmds[ti_rand() % 6] & ~(_IOC_SIZEMASK << _IOC_SIZESHIFT)) |
			      ((unsigned long)(ti_rand() % 1024) << _IOC_SIZESHIFT);
			break;
		default: /* our type, every other bit random */
			cmd = (ti_rand() & ~(0xffUL << _IOC_TYPESHIFT)) |
			      ((unsigned long)TI_IOC_MAGIC << _IOC_TYPESHIFT);
			break;
		}
		for (j = 0; j < (size_t)page; j += 4)
			*(uint32_t *)(buf + j) = ti_rand();
		if (ti_rand() % 3 == 0) /* plausible frequencies now and then */
			*(uint64_t *)buf = ti_levels[ti_rand() % TI_NLEVELS] + ti_rand() % 3 - 1;
		if (ti_rand() % 5 == 0)
			*(uint64_t *)(buf + 8) = ti_rand() % 2;
		switch (ti_rand() % 6) {
		case 0:
			arg = NULL;
			break;
		case 1: /* below mmap_min_addr, or non-canonical: never our memory */
			arg = (void *)(uintptr_t)(ti_rand() % 2 ? ti_rand() % 65536 :
							   0x0000800000000000ULL + ti_rand());
			break;
		case 2:
			arg = (void *)0xffffffff81000000UL; /* kernel text */
			break;
		case 3:
			arg = edge;
			break;
		case 4:
			arg = buf + page; /* unmapped */
			break;
		default:
			arg = buf;
			break;
		}
		ioctl(fd, cmd, arg);
		if (i % 512 == 0) /* reads with bad buffers too */
			(void)!read(fd, (void *)0xffffffff81000000UL, 4096);
	}
	/* a fuzzed TI_SAMPLE_CONFIG may have started the sampler */
	ti_ioc(fd, TI_SAMPLE_CONFIG, &(struct ti_sample_config){ 0 });
	ti_ioc(fd, TI_RELEASE, NULL);
	munmap(buf, page);
	ti_check(ti_cur_freq() == TI_TOP, "fuzz_leaves_device_usable", "cur %llu",
		 (unsigned long long)ti_cur_freq());
	crashes = !ti_dmesg_clean(why, sizeof(why));
	ti_check(!crashes, "ioctl_fuzz_no_oops_no_warn", "%s", why);
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
	close(fd);
	printf("TI-ATTACH passed=%d failed=%d\n", ti_passes, ti_failures);
	return ti_failures ? 1 : 0;
}

static int ti_post(int run_rc, int rmmod_rc, int attach_rc)
{
	char why[256] = "", cdir[300];
	int clean = ti_dmesg_clean(why, sizeof(why));

	ti_check(run_rc == 0, "run_phase_passed", "rc %d", run_rc);
	ti_check(rmmod_rc == 0, "rmmod_clean", "rmmod rc %d", rmmod_rc);
	ti_check(attach_rc == 0, "attach_phase_passed", "rc %d", attach_rc);
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
	if (argc == 2 && !strcmp(argv[1], "run"))
		return ti_run();
	if (argc == 2 && !strcmp(argv[1], "attach"))
		return ti_attach();
	if (argc == 5 && !strcmp(argv[1], "post"))
		return ti_post(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]));
	fprintf(stderr, "usage: %s run | attach | post RUN_RC RMMOD_RC ATTACH_RC\n", argv[0]);
	return 2;
}
