/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * turboinfer.ko user ABI: ioctls on /dev/turboinfer and the records read() returns.
 *
 * Every struct has fixed-size types and explicit padding, so 32- and 64-bit callers
 * share one layout. Padding and reserved fields must be zero on input. Frequencies
 * are in Hz, times in ns of CLOCK_MONOTONIC (ktime_get_ns()).
 *
 * turboinfer_llama/devices/kmod.py mirrors these layouts; tests/test_kmod_layout.py
 * parses this file to check that the two match.
 */
#ifndef TURBOINFER_UAPI_H
#define TURBOINFER_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define TI_ABI_VERSION 1
#define TI_IOC_MAGIC 0xB4
#define TI_MAX_FREQS 32
#define TI_NAME_LEN 64
/* Sampler period bounds, ns. */
#define TI_SAMPLE_PERIOD_MIN_NS 100000
#define TI_SAMPLE_PERIOD_MAX_NS 1000000000

/* ti_info.flags */
#define TI_INFO_F_VIRTUAL 0x1 /* the module hosts a virtual GPU (virtual=1) */
#define TI_INFO_F_HAS_PMU 0x2 /* ti_stats.instructions is a real PMU count */

struct ti_info {
	__u32 abi_version;
	__u32 num_freqs;
	__u32 flags;
	__u32 cooling_state;     /* our cooling device's state, 0 = no cap */
	__u32 max_cooling_state; /* num_freqs - 1 */
	__u32 __pad0;
	__u64 cur_freq_hz;
	__u64 cooling_cap_hz;    /* cap from our cooling device (top level at state 0) */
	__u64 qos_max_hz;        /* aggregate of every max-frequency request, ours
				  * included; 0 when none is set */
	__u64 scaling_max_hz;    /* devfreq's cap from enabled OPPs */
	__u64 freqs_hz[TI_MAX_FREQS]; /* ascending, num_freqs valid */
	char name[TI_NAME_LEN];  /* devfreq device name, NUL-terminated */
};

/* ti_set_freq.flags */
#define TI_SET_FREQ_F_EXACT 0x1 /* reject a frequency that is not a table level */

struct ti_set_freq {
	__u64 freq_hz;    /* in: wanted; snapped to the nearest level (ties go up) */
	__u32 flags;      /* in: TI_SET_FREQ_F_* */
	__u32 __pad0;
	__u64 target_hz;  /* out: the level pinned, after the thermal cap */
	__u64 applied_hz; /* out: devfreq's frequency once the request is in effect */
	__u64 t_ns;       /* out: when it was in effect */
};

struct ti_range {
	__u64 min_hz;         /* in: rounded up to a level */
	__u64 max_hz;         /* in: rounded down to a level */
	__u64 applied_min_hz; /* out: the levels requested */
	__u64 applied_max_hz;
	__u64 cur_freq_hz;    /* out: devfreq's frequency once in effect */
	__u64 t_ns;
};

/* ti_stats.flags and ti_sample.flags */
#define TI_STATS_F_PMU 0x1            /* instructions is valid */
#define TI_STATS_F_BUSY_SIMULATED 0x2 /* busy comes from the virtual GPU's busy_pct */
#define TI_STATS_F_BUSY_ESTIMATED 0x4 /* busy = governor's last-window ratio x time */
#define TI_SAMPLE_F_LOST 0x8          /* records were dropped before this one */

struct ti_stats {
	__u64 t_ns;
	__u64 cur_freq_hz;
	__u64 busy_ns;            /* cumulative since the module loaded */
	__u64 total_ns;
	__u64 window_busy_ns;     /* since this fd's previous TI_GET_STATS (or open) */
	__u64 window_total_ns;
	__u64 transitions;        /* frequency changes since the module loaded */
	__u64 last_transition_ns; /* 0 before the first */
	__u64 instructions;       /* cumulative PMU count when TI_STATS_F_PMU */
	__u32 flags;
	__u32 samples_lost;       /* this fd's sampler records dropped on overflow */
};

/* ti_sample_config.flags */
#define TI_SAMPLE_F_ENABLE 0x1

struct ti_sample_config {
	__u64 period_ns; /* TI_SAMPLE_PERIOD_MIN_NS..MAX when enabling, 0 when stopping */
	__u32 flags;
	__u32 __pad0;
};

/* One record from read(); read() returns whole records only. */
struct ti_sample {
	__u64 t_ns;
	__u64 freq_hz;
	__u64 busy_ns;  /* cumulative, as in ti_stats */
	__u64 total_ns;
	__u64 instructions;
	__u32 seq;      /* per fd, +1 per record taken */
	__u32 flags;    /* TI_STATS_F_* | TI_SAMPLE_F_LOST */
};

#define TI_GET_INFO _IOR(TI_IOC_MAGIC, 1, struct ti_info)
#define TI_SET_FREQ _IOWR(TI_IOC_MAGIC, 2, struct ti_set_freq)
#define TI_SET_RANGE _IOWR(TI_IOC_MAGIC, 3, struct ti_range)
#define TI_RELEASE _IO(TI_IOC_MAGIC, 4)
#define TI_GET_STATS _IOR(TI_IOC_MAGIC, 5, struct ti_stats)
#define TI_SAMPLE_CONFIG _IOW(TI_IOC_MAGIC, 6, struct ti_sample_config)

#endif /* TURBOINFER_UAPI_H */
