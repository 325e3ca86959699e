// SPDX-License-Identifier: GPL-2.0
/*
 * turboinfer.ko: immediate GPU frequency actuation and busy sampling for a Linux
 * devfreq GPU, through /dev/turboinfer.
 *
 * Why: the TurboInfer controller lowers the GPU clock during stalls and must act
 * faster than the stall. Android's thermal framework batches requests; here a
 * TI_SET_FREQ pins PM QoS min and max requests on the GPU's devfreq parent, and
 * devfreq's QoS notifier re-evaluates the clock before the ioctl returns.
 *
 * Safety rests on PM QoS aggregation: the effective maximum is the smallest max
 * request of anyone (our cooling device, the GPU's own devfreq cooling device,
 * sysfs max_freq, ours), and devfreq clamps the minimum to that maximum. So no min
 * request of ours can lift the clock above another party's cap. Each open file has
 * its own request pair, removed on TI_RELEASE and on the last close, which the
 * kernel runs even when the process dies by SIGKILL.
 *
 * turboinfer.ko is built from this file (the device, its ioctls, the sampler and
 * the cooling device) and ti_vgpu.c (the virtual=1 test GPU).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/devfreq.h>
#include <linux/device.h>
#include <linux/fs.h>
#include <linux/glob.h>
#include <linux/hrtimer.h>
#include <linux/kfifo.h>
#include <linux/ktime.h>
#include <linux/math64.h>
#include <linux/miscdevice.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/platform_device.h>
#include <linux/pm_qos.h>
#include <linux/poll.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/spinlock.h>
#include <linux/string.h>
#include <linux/thermal.h>
#include <linux/uaccess.h>
#include <linux/units.h>
#include <linux/version.h>
#include <linux/wait.h>

#include "ti_vgpu.h"
#include "turboinfer_uapi.h"

#define TI_RING_RECORDS 1024
#define TI_READ_BATCH 8
#define TI_PPM 1000000U

static char *ti_target = "";
module_param_named(target, ti_target, charp, 0444);
MODULE_PARM_DESC(target,
		 "devfreq device to attach to: a glob (\"*.mali\") or a name that matches exactly or after the last '.' or ',' (\"kgsl-3d0\")");

static bool ti_virtual;
module_param_named(virtual, ti_virtual, bool, 0444);
MODULE_PARM_DESC(virtual, "host our own virtual devfreq GPU (Adreno 650 levels) instead of attaching");

struct ti_dev {
	/* df, parent, is_virtual, nfreqs and freqs_hz: set by ti_init(), constant after. */
	struct devfreq *df;
	struct device *parent; /* df->dev.parent: holds the PM QoS requests */
	bool is_virtual;
	unsigned int nfreqs;
	u64 freqs_hz[TI_MAX_FREQS]; /* ascending, unique */

	/*
	 * lock guards cool_state, cool_cap_hz, cool_req and every ti_file's request
	 * pair (min_req, max_req, has_req, min_khz, max_khz).
	 * Lock order: lock -> PM QoS -> df->lock. Never taken under df->lock, so the
	 * transition notifier (which runs under df->lock) must not take it.
	 */
	struct mutex lock;
	unsigned long cool_state;
	u64 cool_cap_hz;
	struct dev_pm_qos_request cool_req;
	struct thermal_cooling_device *cdev;

	/*
	 * acct_lock (irq-safe: the sampler hrtimer takes it) guards the busy integrator
	 * and the transition record: acct_last_ns, busy_ns, total_ns, busy_ppm, cur_hz,
	 * transitions, last_transition_ns.
	 */
	spinlock_t acct_lock;
	u64 acct_last_ns;
	u64 busy_ns;
	u64 total_ns;
	u32 busy_ppm;
	u64 cur_hz;
	u64 transitions;
	u64 last_transition_ns;

	struct notifier_block trans_nb;
	struct miscdevice misc;
};

static struct ti_dev ti_dev;

struct ti_file {
	struct ti_dev *td;

	/* Guarded by td->lock. min_khz/max_khz are our copy of the request values. */
	struct dev_pm_qos_request min_req;
	struct dev_pm_qos_request max_req;
	bool has_req;
	s32 min_khz;
	s32 max_khz;

	/* lock guards win_busy_ns, win_total_ns, period, ring allocation and starting
	 * or stopping the timer. */
	struct mutex lock;
	u64 win_busy_ns;
	u64 win_total_ns;
	ktime_t period;
	struct hrtimer timer;
	/* Written under lock; read locklessly by read() and poll(). */
	bool sampling;
	/* Set once, with release semantics, after the ring is allocated. */
	bool ring_ready;

	/* ring_lock (irq-safe) guards ring contents, seq, lost, lost_pending. */
	spinlock_t ring_lock;
	DECLARE_KFIFO_PTR(ring, struct ti_sample);
	u32 seq;
	u32 lost;
	bool lost_pending;
	wait_queue_head_t wq;
};

/* ---- accounting ---------------------------------------------------------- */

static void ti_acct_advance(struct ti_dev *td, u64 now_ns)
{
	u64 dt_ns;

	lockdep_assert_held(&td->acct_lock);
	dt_ns = now_ns - td->acct_last_ns;
	td->total_ns += dt_ns;
	td->busy_ns += mul_u64_u32_div(dt_ns, td->busy_ppm, TI_PPM);
	td->acct_last_ns = now_ns;
}

/* The governor's last-window busy ratio; caller holds df->lock. */
static bool ti_last_status_ppm(struct devfreq *df, u32 *ppm)
{
	const struct devfreq_dev_status *st = &df->last_status;

	lockdep_assert_held(&df->lock);
	if (!st->total_time || st->busy_time > st->total_time)
		return false;
	*ppm = (u32)div64_ul((u64)st->busy_time * TI_PPM, st->total_time);
	return true;
}

static void ti_acct_set_ppm(struct ti_dev *td, u32 ppm)
{
	unsigned long flags;

	spin_lock_irqsave(&td->acct_lock, flags);
	ti_acct_advance(td, ktime_get_ns());
	td->busy_ppm = ppm;
	spin_unlock_irqrestore(&td->acct_lock, flags);
}

static u32 ti_stats_flags(const struct ti_dev *td)
{
	return td->is_virtual ? TI_STATS_F_BUSY_SIMULATED : TI_STATS_F_BUSY_ESTIMATED;
}

/* Runs from devfreq_set_target() with df->lock held. */
static int ti_transition_cb(struct notifier_block *nb, unsigned long event, void *data)
{
	struct ti_dev *td = container_of(nb, struct ti_dev, trans_nb);
	const struct devfreq_freqs *freqs = data;
	unsigned long flags;
	u32 ppm = 0;
	bool have_ppm;

	if (event != DEVFREQ_POSTCHANGE)
		return NOTIFY_DONE;
	have_ppm = !td->is_virtual && ti_last_status_ppm(td->df, &ppm);
	spin_lock_irqsave(&td->acct_lock, flags);
	ti_acct_advance(td, ktime_get_ns());
	if (have_ppm)
		td->busy_ppm = ppm;
	if (freqs->new != td->cur_hz) {
		td->cur_hz = freqs->new;
		td->transitions++;
		td->last_transition_ns = td->acct_last_ns;
	}
	spin_unlock_irqrestore(&td->acct_lock, flags);
	return NOTIFY_OK;
}

/* Start the transition record from devfreq's clock; the notifier keeps it after. */
static void ti_sync_cur_hz(struct ti_dev *td)
{
	unsigned long flags;

	mutex_lock(&td->df->lock);
	spin_lock_irqsave(&td->acct_lock, flags);
	td->cur_hz = td->df->previous_freq;
	spin_unlock_irqrestore(&td->acct_lock, flags);
	mutex_unlock(&td->df->lock);
}

static unsigned long ti_devfreq_cur_hz(struct ti_dev *td)
{
	unsigned long hz;

	mutex_lock(&td->df->lock);
	hz = td->df->previous_freq;
	mutex_unlock(&td->df->lock);
	return hz;
}

/*
 * Aggregate of all max-frequency requests on the parent (ours included), 0 when
 * none; reported by TI_GET_INFO only, never used for decisions, which rest on our
 * own copies. Neither dev_pm_qos_read_value() nor freq_qos_read_value() is exported,
 * so read the constraint's target_value under dev->power.lock, which also guards
 * the power.qos pointer against dev_pm_qos_constraints_destroy().
 */
static u64 ti_qos_max_hz(struct ti_dev *td)
{
	struct device *dev = td->parent;
	s32 khz = FREQ_QOS_MAX_DEFAULT_VALUE;
	unsigned long flags;

	spin_lock_irqsave(&dev->power.lock, flags);
	if (!IS_ERR_OR_NULL(dev->power.qos))
		khz = READ_ONCE(dev->power.qos->freq.max_freq.target_value);
	spin_unlock_irqrestore(&dev->power.lock, flags);
	return khz == FREQ_QOS_MAX_DEFAULT_VALUE ? 0 : (u64)khz * HZ_PER_KHZ;
}

/* ---- frequency table ----------------------------------------------------- */

static s32 ti_khz_floor(u64 hz)
{
	return (s32)div_u64(hz, HZ_PER_KHZ);
}

static s32 ti_khz_ceil(u64 hz)
{
	return (s32)div_u64(hz + HZ_PER_KHZ - 1, HZ_PER_KHZ);
}

/* Nearest level, ties go to the higher one. */
static unsigned int ti_snap_idx(const struct ti_dev *td, u64 hz)
{
	unsigned int i, best = 0;
	u64 best_d = U64_MAX, d;

	for (i = 0; i < td->nfreqs; i++) {
		d = hz > td->freqs_hz[i] ? hz - td->freqs_hz[i] : td->freqs_hz[i] - hz;
		if (d <= best_d) {
			best = i;
			best_d = d;
		}
	}
	return best;
}

static bool ti_in_table(const struct ti_dev *td, u64 hz)
{
	unsigned int i;

	for (i = 0; i < td->nfreqs; i++)
		if (td->freqs_hz[i] == hz)
			return true;
	return false;
}

static u64 ti_cap_level(const struct ti_dev *td, u64 hz)
{
	lockdep_assert_held(&td->lock);
	return min(hz, td->cool_cap_hz);
}

static int ti_cmp_u64(const void *a, const void *b)
{
	u64 x = *(const u64 *)a, y = *(const u64 *)b;

	return x < y ? -1 : x > y;
}

/* Copy devfreq's table into td->freqs_hz; returns the count or -E2BIG. */
static int ti_copy_table(struct ti_dev *td)
{
	struct devfreq *df = td->df;
	unsigned int i;

	lockdep_assert_held(&df->lock);
	if (!df->max_state || df->max_state > TI_MAX_FREQS || !df->freq_table) {
		pr_err("%s has %u levels; need 1..%d\n", dev_name(&df->dev), df->max_state,
		       TI_MAX_FREQS);
		return -E2BIG;
	}
	for (i = 0; i < df->max_state; i++)
		td->freqs_hz[i] = df->freq_table[i];
	if (!td->is_virtual && !ti_last_status_ppm(df, &td->busy_ppm))
		td->busy_ppm = 0;
	return df->max_state;
}

static int ti_read_table(struct ti_dev *td)
{
	unsigned int i, n;
	int ret;

	mutex_lock(&td->df->lock);
	ret = ti_copy_table(td);
	mutex_unlock(&td->df->lock);
	if (ret < 0)
		return ret;
	n = ret;
	/* Drivers may list levels descending (KGSL does); keep ours ascending, unique. */
	sort(td->freqs_hz, n, sizeof(u64), ti_cmp_u64, NULL);
	td->nfreqs = 0;
	for (i = 0; i < n; i++)
		if (!td->nfreqs || td->freqs_hz[i] != td->freqs_hz[td->nfreqs - 1])
			td->freqs_hz[td->nfreqs++] = td->freqs_hz[i];
	if (!td->freqs_hz[0])
		return -EINVAL;
	td->cool_cap_hz = td->freqs_hz[td->nfreqs - 1];
	return 0;
}

/* ---- per-file PM QoS requests -------------------------------------------- */

/* First pin of this file: add its max request, then its min request. */
static int ti_file_add_requests(struct ti_file *f, s32 min_khz, s32 max_khz)
{
	struct ti_dev *td = f->td;
	int ret;

	lockdep_assert_held(&td->lock);
	ret = dev_pm_qos_add_request(td->parent, &f->max_req, DEV_PM_QOS_MAX_FREQUENCY,
				     max_khz);
	if (ret < 0)
		return ret;
	ret = dev_pm_qos_add_request(td->parent, &f->min_req, DEV_PM_QOS_MIN_FREQUENCY,
				     min_khz);
	if (ret < 0)
		goto err_max;
	f->has_req = true;
	f->min_khz = min_khz;
	f->max_khz = max_khz;
	return 0;

err_max:
	if (dev_pm_qos_remove_request(&f->max_req) < 0)
		pr_warn("could not drop a max request after a failed add\n");
	return ret;
}

/*
 * Later pins: move the bound on the side we are heading first, so the clock makes
 * one transition, not two. Our copies follow each request that was updated, also
 * when the second update fails.
 */
static int ti_file_move_requests(struct ti_file *f, s32 min_khz, s32 max_khz)
{
	int ret;

	lockdep_assert_held(&f->td->lock);
	if (max_khz < f->max_khz) {
		ret = dev_pm_qos_update_request(&f->max_req, max_khz);
		if (ret < 0)
			return ret;
		f->max_khz = max_khz;
		ret = dev_pm_qos_update_request(&f->min_req, min_khz);
		if (ret < 0)
			return ret;
		f->min_khz = min_khz;
		return 0;
	}
	ret = dev_pm_qos_update_request(&f->min_req, min_khz);
	if (ret < 0)
		return ret;
	f->min_khz = min_khz;
	ret = dev_pm_qos_update_request(&f->max_req, max_khz);
	if (ret < 0)
		return ret;
	f->max_khz = max_khz;
	return 0;
}

static int ti_file_pin(struct ti_file *f, s32 min_khz, s32 max_khz)
{
	lockdep_assert_held(&f->td->lock);
	if (!f->has_req)
		return ti_file_add_requests(f, min_khz, max_khz);
	return ti_file_move_requests(f, min_khz, max_khz);
}

static int ti_file_unpin(struct ti_file *f)
{
	int ret_min, ret_max;

	lockdep_assert_held(&f->td->lock);
	if (!f->has_req)
		return 0;
	ret_min = dev_pm_qos_remove_request(&f->min_req);
	ret_max = dev_pm_qos_remove_request(&f->max_req);
	f->has_req = false;
	if (ret_min < 0)
		return ret_min;
	return ret_max < 0 ? ret_max : 0;
}

/* ---- ioctls -------------------------------------------------------------- */

static long ti_ioc_get_info(struct ti_file *f, void __user *uarg)
{
	struct ti_dev *td = f->td;
	struct ti_info info = {
		.abi_version = TI_ABI_VERSION,
		.num_freqs = td->nfreqs,
		.flags = td->is_virtual ? TI_INFO_F_VIRTUAL : 0,
		.max_cooling_state = td->nfreqs - 1,
	};

	memcpy(info.freqs_hz, td->freqs_hz, sizeof(u64) * td->nfreqs);
	strscpy(info.name, dev_name(&td->df->dev), sizeof(info.name));
	mutex_lock(&td->lock);
	info.cooling_state = td->cool_state;
	info.cooling_cap_hz = td->cool_cap_hz;
	mutex_unlock(&td->lock);
	mutex_lock(&td->df->lock);
	info.cur_freq_hz = td->df->previous_freq;
	info.scaling_max_hz = td->df->scaling_max_freq;
	mutex_unlock(&td->df->lock);
	info.qos_max_hz = ti_qos_max_hz(td);
	return copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
}

static long ti_ioc_set_freq(struct ti_file *f, struct file *file, void __user *uarg)
{
	struct ti_dev *td = f->td;
	struct ti_set_freq req;
	u64 level;
	int ret;

	if (!(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.flags & ~TI_SET_FREQ_F_EXACT || req.__pad0)
		return -EINVAL;
	if (req.freq_hz < td->freqs_hz[0] || req.freq_hz > td->freqs_hz[td->nfreqs - 1])
		return -ERANGE;
	if (req.flags & TI_SET_FREQ_F_EXACT && !ti_in_table(td, req.freq_hz))
		return -EINVAL;
	level = td->freqs_hz[ti_snap_idx(td, req.freq_hz)];

	mutex_lock(&td->lock);
	level = ti_cap_level(td, level);
	ret = ti_file_pin(f, ti_khz_floor(level), ti_khz_ceil(level));
	mutex_unlock(&td->lock);
	if (ret < 0)
		return ret;

	req.target_hz = level;
	req.applied_hz = ti_devfreq_cur_hz(td);
	req.t_ns = ktime_get_ns();
	return copy_to_user(uarg, &req, sizeof(req)) ? -EFAULT : 0;
}

static long ti_ioc_set_range(struct ti_file *f, struct file *file, void __user *uarg)
{
	struct ti_dev *td = f->td;
	struct ti_range req;
	unsigned int i;
	u64 lo = 0, hi = 0;
	int ret;

	if (!(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (copy_from_user(&req, uarg, sizeof(req)))
		return -EFAULT;
	if (req.applied_min_hz || req.applied_max_hz || req.cur_freq_hz || req.t_ns)
		return -EINVAL;
	if (req.min_hz > req.max_hz)
		return -EINVAL;
	if (req.min_hz < td->freqs_hz[0] || req.max_hz > td->freqs_hz[td->nfreqs - 1])
		return -ERANGE;
	for (i = 0; i < td->nfreqs; i++) {
		if (!lo && td->freqs_hz[i] >= req.min_hz)
			lo = td->freqs_hz[i];
		if (td->freqs_hz[i] <= req.max_hz)
			hi = td->freqs_hz[i];
	}
	if (!lo || !hi || lo > hi)
		return -EINVAL; /* no level inside [min, max] */

	mutex_lock(&td->lock);
	hi = ti_cap_level(td, hi);
	lo = min(lo, hi);
	ret = ti_file_pin(f, ti_khz_floor(lo), ti_khz_ceil(hi));
	mutex_unlock(&td->lock);
	if (ret < 0)
		return ret;

	req.applied_min_hz = lo;
	req.applied_max_hz = hi;
	req.cur_freq_hz = ti_devfreq_cur_hz(td);
	req.t_ns = ktime_get_ns();
	return copy_to_user(uarg, &req, sizeof(req)) ? -EFAULT : 0;
}

static long ti_ioc_release(struct ti_file *f, struct file *file, unsigned long arg)
{
	int ret;

	if (!(file->f_mode & FMODE_WRITE))
		return -EBADF;
	if (arg)
		return -EINVAL;
	mutex_lock(&f->td->lock);
	ret = ti_file_unpin(f);
	mutex_unlock(&f->td->lock);
	return ret;
}

static void ti_snapshot(struct ti_dev *td, u64 *t_ns, u64 *freq_hz, u64 *busy_ns,
			u64 *total_ns)
{
	unsigned long flags;

	spin_lock_irqsave(&td->acct_lock, flags);
	ti_acct_advance(td, ktime_get_ns());
	*t_ns = td->acct_last_ns;
	*freq_hz = td->cur_hz;
	*busy_ns = td->busy_ns;
	*total_ns = td->total_ns;
	spin_unlock_irqrestore(&td->acct_lock, flags);
}

static long ti_ioc_get_stats(struct ti_file *f, void __user *uarg)
{
	struct ti_dev *td = f->td;
	struct ti_stats st = { .flags = ti_stats_flags(td) };
	unsigned long flags;
	bool have_ppm;
	u32 ppm = 0;

	if (!td->is_virtual) {
		mutex_lock(&td->df->lock);
		have_ppm = ti_last_status_ppm(td->df, &ppm);
		mutex_unlock(&td->df->lock);
		if (have_ppm)
			ti_acct_set_ppm(td, ppm);
	}
	ti_snapshot(td, &st.t_ns, &st.cur_freq_hz, &st.busy_ns, &st.total_ns);
	spin_lock_irqsave(&td->acct_lock, flags);
	st.transitions = td->transitions;
	st.last_transition_ns = td->last_transition_ns;
	spin_unlock_irqrestore(&td->acct_lock, flags);

	mutex_lock(&f->lock);
	st.window_busy_ns = st.busy_ns - f->win_busy_ns;
	st.window_total_ns = st.total_ns - f->win_total_ns;
	f->win_busy_ns = st.busy_ns;
	f->win_total_ns = st.total_ns;
	mutex_unlock(&f->lock);

	spin_lock_irqsave(&f->ring_lock, flags);
	st.samples_lost = f->lost;
	spin_unlock_irqrestore(&f->ring_lock, flags);
	return copy_to_user(uarg, &st, sizeof(st)) ? -EFAULT : 0;
}

/* ---- sampler ------------------------------------------------------------- */

static enum hrtimer_restart ti_sample_tick(struct hrtimer *timer)
{
	struct ti_file *f = container_of(timer, struct ti_file, timer);
	struct ti_sample s = { .flags = ti_stats_flags(f->td) };
	unsigned long flags;

	ti_snapshot(f->td, &s.t_ns, &s.freq_hz, &s.busy_ns, &s.total_ns);
	spin_lock_irqsave(&f->ring_lock, flags);
	s.seq = f->seq++;
	if (f->lost_pending)
		s.flags |= TI_SAMPLE_F_LOST;
	if (kfifo_put(&f->ring, s)) {
		f->lost_pending = false;
	} else {
		f->lost++;
		f->lost_pending = true;
	}
	spin_unlock_irqrestore(&f->ring_lock, flags);
	wake_up_interruptible(&f->wq);
	hrtimer_forward_now(timer, f->period);
	return HRTIMER_RESTART;
}

static void ti_sampler_stop(struct ti_file *f)
{
	lockdep_assert_held(&f->lock);
	if (!f->sampling)
		return;
	hrtimer_cancel(&f->timer);
	WRITE_ONCE(f->sampling, false);
	wake_up_interruptible(&f->wq);
}

/* Allocate the ring on first use, then arm the timer. */
static int ti_sampler_start(struct ti_file *f, ktime_t period)
{
	int ret;

	lockdep_assert_held(&f->lock);
	if (!f->ring_ready) {
		ret = kfifo_alloc(&f->ring, TI_RING_RECORDS, GFP_KERNEL);
		if (ret)
			return ret;
		smp_store_release(&f->ring_ready, true);
	}
	f->period = period;
	WRITE_ONCE(f->sampling, true);
	hrtimer_start(&f->timer, f->period, HRTIMER_MODE_REL);
	return 0;
}

static long ti_ioc_sample_config(struct ti_file *f, void __user *uarg)
{
	struct ti_sample_config cfg;
	int ret = 0;

	if (copy_from_user(&cfg, uarg, sizeof(cfg)))
		return -EFAULT;
	if (cfg.flags & ~TI_SAMPLE_F_ENABLE || cfg.__pad0)
		return -EINVAL;
	if (cfg.flags & TI_SAMPLE_F_ENABLE) {
		if (cfg.period_ns < TI_SAMPLE_PERIOD_MIN_NS ||
		    cfg.period_ns > TI_SAMPLE_PERIOD_MAX_NS)
			return -EINVAL;
	} else if (cfg.period_ns) {
		return -EINVAL;
	}

	mutex_lock(&f->lock);
	ti_sampler_stop(f);
	if (cfg.flags & TI_SAMPLE_F_ENABLE)
		ret = ti_sampler_start(f, ns_to_ktime(cfg.period_ns));
	mutex_unlock(&f->lock);
	return ret;
}

static bool ti_ring_empty(struct ti_file *f)
{
	unsigned long flags;
	bool empty;

	spin_lock_irqsave(&f->ring_lock, flags);
	empty = kfifo_is_empty(&f->ring);
	spin_unlock_irqrestore(&f->ring_lock, flags);
	return empty;
}

static ssize_t ti_read(struct file *file, char __user *buf, size_t count, loff_t *ppos)
{
	struct ti_file *f = file->private_data;
	struct ti_sample batch[TI_READ_BATCH];
	size_t want, copied = 0;
	unsigned long flags;
	unsigned int got;
	int ret;

	if (count < sizeof(struct ti_sample))
		return -EINVAL;
	if (!smp_load_acquire(&f->ring_ready))
		return 0;
	while (ti_ring_empty(f)) {
		if (!READ_ONCE(f->sampling))
			return 0;
		if (file->f_flags & O_NONBLOCK)
			return -EAGAIN;
		ret = wait_event_interruptible(f->wq, !ti_ring_empty(f) ||
						      !READ_ONCE(f->sampling));
		if (ret)
			return ret;
	}
	while (copied + sizeof(struct ti_sample) <= count) {
		want = min_t(size_t, TI_READ_BATCH,
			     (count - copied) / sizeof(struct ti_sample));
		spin_lock_irqsave(&f->ring_lock, flags);
		got = kfifo_out(&f->ring, batch, want);
		spin_unlock_irqrestore(&f->ring_lock, flags);
		if (!got)
			break;
		if (copy_to_user(buf + copied, batch, got * sizeof(struct ti_sample)))
			return copied ? copied : -EFAULT;
		copied += got * sizeof(struct ti_sample);
	}
	return copied;
}

static __poll_t ti_poll(struct file *file, struct poll_table_struct *wait)
{
	struct ti_file *f = file->private_data;

	poll_wait(file, &f->wq, wait);
	if (smp_load_acquire(&f->ring_ready) && !ti_ring_empty(f))
		return EPOLLIN | EPOLLRDNORM;
	return 0;
}

/* ---- file operations ----------------------------------------------------- */

static long ti_ioctl(struct file *file, unsigned int cmd, unsigned long arg)
{
	struct ti_file *f = file->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case TI_GET_INFO:
		return ti_ioc_get_info(f, uarg);
	case TI_SET_FREQ:
		return ti_ioc_set_freq(f, file, uarg);
	case TI_SET_RANGE:
		return ti_ioc_set_range(f, file, uarg);
	case TI_RELEASE:
		return ti_ioc_release(f, file, arg);
	case TI_GET_STATS:
		return ti_ioc_get_stats(f, uarg);
	case TI_SAMPLE_CONFIG:
		return ti_ioc_sample_config(f, uarg);
	default:
		return -ENOTTY;
	}
}

/* hrtimer_setup() arrived in 6.13 and hrtimer_init() left in 6.15. */
static void ti_sampler_init(struct ti_file *f)
{
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 13, 0)
	hrtimer_setup(&f->timer, ti_sample_tick, CLOCK_MONOTONIC, HRTIMER_MODE_REL);
#else
	hrtimer_init(&f->timer, CLOCK_MONOTONIC, HRTIMER_MODE_REL);
	f->timer.function = ti_sample_tick;
#endif
}

static int ti_open(struct inode *inode, struct file *file)
{
	struct ti_file *f;
	u64 t_ns, hz;
	int ret;

	f = kzalloc(sizeof(*f), GFP_KERNEL);
	if (!f)
		return -ENOMEM;
	f->td = &ti_dev;
	mutex_init(&f->lock);
	spin_lock_init(&f->ring_lock);
	init_waitqueue_head(&f->wq);
	ti_sampler_init(f);
	ti_snapshot(f->td, &t_ns, &hz, &f->win_busy_ns, &f->win_total_ns);
	ret = nonseekable_open(inode, file);
	if (ret) {
		kfree(f);
		return ret;
	}
	file->private_data = f;
	return 0;
}

/* Last close of the file, also when its process was killed: drop our requests. */
static int ti_release(struct inode *inode, struct file *file)
{
	struct ti_file *f = file->private_data;
	int ret;

	mutex_lock(&f->lock);
	ti_sampler_stop(f);
	mutex_unlock(&f->lock);

	mutex_lock(&f->td->lock);
	ret = ti_file_unpin(f);
	mutex_unlock(&f->td->lock);
	if (ret < 0)
		pr_warn("dropping requests on close failed: %d\n", ret);

	if (f->ring_ready)
		kfifo_free(&f->ring);
	mutex_destroy(&f->lock);
	kfree(f);
	return 0;
}

static const struct file_operations ti_fops = {
	.owner = THIS_MODULE,
	.open = ti_open,
	.release = ti_release,
	.read = ti_read,
	.poll = ti_poll,
	.unlocked_ioctl = ti_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
};

/* ---- cooling device ------------------------------------------------------ */

/* State s caps the clock at the s-th level from the top; 0 is no cap. */
static int ti_cool_get_max_state(struct thermal_cooling_device *cdev, unsigned long *state)
{
	struct ti_dev *td = cdev->devdata;

	*state = td->nfreqs - 1;
	return 0;
}

static int ti_cool_get_cur_state(struct thermal_cooling_device *cdev, unsigned long *state)
{
	struct ti_dev *td = cdev->devdata;

	mutex_lock(&td->lock);
	*state = td->cool_state;
	mutex_unlock(&td->lock);
	return 0;
}

static int ti_cool_set_cur_state(struct thermal_cooling_device *cdev, unsigned long state)
{
	struct ti_dev *td = cdev->devdata;
	u64 cap_hz;
	int ret;

	if (state >= td->nfreqs)
		return -EINVAL;
	cap_hz = td->freqs_hz[td->nfreqs - 1 - state];
	mutex_lock(&td->lock);
	ret = dev_pm_qos_update_request(&td->cool_req,
					state ? ti_khz_ceil(cap_hz) :
						PM_QOS_MAX_FREQUENCY_DEFAULT_VALUE);
	if (ret >= 0) {
		td->cool_state = state;
		td->cool_cap_hz = cap_hz;
	}
	mutex_unlock(&td->lock);
	return ret < 0 ? ret : 0;
}

static const struct thermal_cooling_device_ops ti_cool_ops = {
	.get_max_state = ti_cool_get_max_state,
	.get_cur_state = ti_cool_get_cur_state,
	.set_cur_state = ti_cool_set_cur_state,
};

/* ---- attaching to a real devfreq GPU ------------------------------------- */

static bool ti_name_matches(const char *pattern, const char *name)
{
	size_t pl = strlen(pattern), nl = strlen(name);

	if (glob_match(pattern, name))
		return true;
	/* "kgsl-3d0" matches "5000000.qcom,kgsl-3d0". */
	return nl > pl && !strcmp(name + nl - pl, pattern) &&
	       (name[nl - pl - 1] == '.' || name[nl - pl - 1] == ',');
}

/* device_find_child() passes its match data as const from 6.14. */
#if LINUX_VERSION_CODE >= KERNEL_VERSION(6, 14, 0)
typedef const void ti_match_data;
#else
typedef void ti_match_data;
#endif

static int ti_is_target_devfreq(struct device *dev, ti_match_data *pattern)
{
	return dev->class && !strcmp(dev->class->name, "devfreq") &&
	       ti_name_matches(pattern, dev_name(dev));
}

struct ti_find {
	const char *pattern;
	struct device *found; /* holds a reference */
};

static int ti_find_in_parent(struct device *parent, void *data)
{
	struct ti_find *find = data;

	find->found = device_find_child(parent, (void *)find->pattern, ti_is_target_devfreq);
	return find->found ? 1 : 0;
}

static int ti_attach(struct ti_dev *td)
{
	struct ti_find find = { .pattern = ti_target };
	int ret;

	if (!ti_target[0]) {
		pr_err("name a devfreq device with target=<name> or load with virtual=1\n");
		return -EINVAL;
	}
	ret = bus_for_each_dev(&platform_bus_type, NULL, &find, ti_find_in_parent);
	if (ret < 0)
		return ret;
	if (!find.found) {
		pr_err("no devfreq device on the platform bus matches \"%s\"\n", ti_target);
		return -ENODEV;
	}
	td->df = container_of(find.found, struct devfreq, dev);
	td->parent = find.found->parent;
	return 0;
}

/* Host the virtual GPU; attach to it as to any devfreq device. */
static int ti_attach_virtual(struct ti_dev *td)
{
	unsigned int busy_pct;
	int ret;

	ret = ti_vgpu_create(&td->df, &busy_pct);
	if (ret)
		return ret;
	td->parent = td->df->dev.parent;
	td->busy_ppm = busy_pct * (TI_PPM / 100);
	return 0;
}

static void ti_detach(struct ti_dev *td)
{
	if (td->is_virtual)
		ti_vgpu_destroy(td->df);
	else
		put_device(&td->df->dev);
}

/* ---- module -------------------------------------------------------------- */

static int __init ti_init(void)
{
	struct ti_dev *td = &ti_dev;
	int ret;

	mutex_init(&td->lock);
	spin_lock_init(&td->acct_lock);
	td->is_virtual = ti_virtual;
	ret = td->is_virtual ? ti_attach_virtual(td) : ti_attach(td);
	if (ret)
		return ret;
	ret = ti_read_table(td);
	if (ret)
		goto err_detach;
	td->acct_last_ns = ktime_get_ns();

	td->trans_nb.notifier_call = ti_transition_cb;
	ret = devfreq_register_notifier(td->df, &td->trans_nb, DEVFREQ_TRANSITION_NOTIFIER);
	if (ret)
		goto err_detach;
	ti_sync_cur_hz(td);

	ret = dev_pm_qos_add_request(td->parent, &td->cool_req, DEV_PM_QOS_MAX_FREQUENCY,
				     PM_QOS_MAX_FREQUENCY_DEFAULT_VALUE);
	if (ret < 0)
		goto err_notifier;

	td->cdev = thermal_cooling_device_register("turboinfer", td, &ti_cool_ops);
	if (IS_ERR(td->cdev)) {
		ret = PTR_ERR(td->cdev);
		goto err_cool_req;
	}

	td->misc = (struct miscdevice){
		.minor = MISC_DYNAMIC_MINOR,
		.name = "turboinfer",
		.fops = &ti_fops,
		.mode = 0660,
	};
	ret = misc_register(&td->misc);
	if (ret)
		goto err_cdev;

	pr_info("attached to %s (%u levels, %llu..%llu Hz)%s\n", dev_name(&td->df->dev),
		td->nfreqs, td->freqs_hz[0], td->freqs_hz[td->nfreqs - 1],
		td->is_virtual ? ", virtual GPU" : "");
	return 0;

err_cdev:
	thermal_cooling_device_unregister(td->cdev);
err_cool_req:
	if (dev_pm_qos_remove_request(&td->cool_req) < 0)
		pr_warn("could not drop the cooling request\n");
err_notifier:
	if (devfreq_unregister_notifier(td->df, &td->trans_nb, DEVFREQ_TRANSITION_NOTIFIER))
		pr_warn("could not unregister the transition notifier\n");
err_detach:
	ti_detach(td);
	return ret;
}

static void __exit ti_exit(void)
{
	struct ti_dev *td = &ti_dev;

	misc_deregister(&td->misc);
	thermal_cooling_device_unregister(td->cdev);
	if (dev_pm_qos_remove_request(&td->cool_req) < 0)
		pr_warn("could not drop the cooling request\n");
	if (devfreq_unregister_notifier(td->df, &td->trans_nb, DEVFREQ_TRANSITION_NOTIFIER))
		pr_warn("could not unregister the transition notifier\n");
	ti_detach(td);
	mutex_destroy(&td->lock);
}

module_init(ti_init);
module_exit(ti_exit);

MODULE_LICENSE("GPL");
MODULE_AUTHOR("turboinfer-llama");
MODULE_DESCRIPTION("Immediate devfreq GPU frequency actuation, busy sampling and a turboinfer cooling device");
