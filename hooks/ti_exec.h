/* SPDX-License-Identifier: MIT */
/*
 * ti_exec: the native plan executor. It runs one frequency plan per graph inside
 * llama_decode, without the GIL and without allocating: node-keyed switches from the
 * eval callback (ti_hook_eval), time-keyed ones from its own timer thread, through an
 * actuator whose file descriptors were opened once at create.
 *
 * The semantics are those of turboinfer_llama/control/plan.py (the one definition);
 * turboinfer_llama/control/executor_model.py is the same machine in Python.
 * docs/architecture.md ("Native plan executor") describes threads, locks and anchors.
 */
#ifndef TI_EXEC_H
#define TI_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef TI_API
#define TI_API __attribute__((visibility("default")))
#endif

#define TI_PLAN_MAX 256        /* switches per plan (Plan.MAX_SWITCHES) */
#define TI_EXEC_MAX_LEVELS 32  /* frequency levels (as turboinfer_uapi.h's TI_MAX_FREQS) */
#define TI_EXEC_VALUE_LEN 32   /* a preformatted sysfs value, NUL-terminated */
#define TI_EXEC_PATH_LEN 256   /* an actuator path, NUL-terminated */
#define TI_EXEC_MAX_LOG (1u << 20)

enum ti_anchor {
	TI_ANCHOR_NODE = 0,   /* key = node ordinal; fires at that node's ask */
	TI_ANCHOR_OFFSET = 1, /* key = ns after the graph's first ask; timer thread */
	TI_ANCHOR_TIME = 2,   /* key = absolute CLOCK_MONOTONIC ns; timer thread */
};

enum ti_source {
	TI_SRC_FIRST = 0,    /* a plan's first_level (or a late plan's collapsed switch) */
	TI_SRC_NODE = 1,     /* a NODE switch at an ask */
	TI_SRC_TIMER = 2,    /* an OFFSET or TIME switch (or a NODE switch after a mismatch) */
	TI_SRC_FEEDBACK = 3, /* a raise at a node completion that came late */
	TI_SRC_END = 4,      /* end_level at graph end */
	TI_SRC_FALLBACK = 5, /* fallback_level of the last plan, for a graph with none */
	TI_SRC_NOW = 6,      /* ti_exec_switch_now */
};

enum ti_actuator_kind {
	TI_ACT_RECORD = 0,     /* writes only the log record */
	TI_ACT_KMOD = 1,       /* ioctl(TI_SET_FREQ) on path[0] (/dev/turboinfer) */
	TI_ACT_SYSFS_PAIR = 2, /* floor file path[0] with values[0], ceiling path[1], values[1] */
	TI_ACT_SYSFS_ONE = 3,  /* one file path[0] with values[0] */
};

struct ti_switch {
	int64_t key;       /* node ordinal, offset ns or absolute ns (see anchor) */
	int64_t expect_ns; /* nominal elapsed ns from the first ask here; -1 = unknown */
	int32_t anchor;    /* enum ti_anchor */
	int32_t level;     /* index into levels_hz; < 0 = a checkpoint (changes nothing) */
};

/* control/plan.py's Plan. */
struct ti_plan {
	uint64_t graph;       /* graph sequence this plan is for; 0 = the next graph */
	int64_t predicted_ns; /* nominal compute time, first ask to last node */
	int64_t margin_ns;    /* feedback dead band */
	double gain;          /* feedback gain; 0 = none */
	int32_t first_level;  /* -1 = keep */
	int32_t end_level;
	int32_t fallback_level;
	uint32_t n_nodes;     /* 0 = unknown */
	uint32_t n_switches;  /* <= TI_PLAN_MAX */
	uint32_t reserved;
	/*
	 * > 0: the plan was solved after graph after_graph ended (first ask at
	 * after_t0_ns) for the graph after it, and graph is ignored. Set, it is for the
	 * graph after the last one begun: after_graph + 1 when none has since; else that
	 * graph + 1, its TIME switches armed at that graph's end and moved by the time
	 * between the two graphs' ends (the planner ran while the engine ran that one;
	 * by the time between their first asks where the earlier end is not remembered).
	 * Such a plan is never late. 0: graph applies.
	 */
	uint64_t after_graph;
	int64_t after_t0_ns;
	struct ti_switch switches[TI_PLAN_MAX];
};

/* One applied (or failed) switch: control/plan.py's Applied plus errno. */
struct ti_applied {
	int64_t t_ns;    /* when the actuator call started (CLOCK_MONOTONIC) */
	uint64_t freq_hz;
	int64_t cost_ns; /* duration of the actuator call */
	uint64_t graph;
	int32_t level;
	int32_t source;  /* enum ti_source */
	int32_t node;    /* ordinal for NODE and FEEDBACK switches, else -1 */
	int32_t err;     /* 0, or the errno that stopped the executor */
	int64_t due_ns;  /* TIMER: the deadline it fired for (t_ns - due_ns = lateness); else -1 */
};

struct ti_exec_config {
	uint32_t n_levels;     /* 1..TI_EXEC_MAX_LEVELS */
	uint32_t log_capacity; /* applied records kept between drains, 1..TI_EXEC_MAX_LOG */
	int32_t actuator;      /* enum ti_actuator_kind */
	int32_t initial_level; /* level in effect at create; -1 = unknown */
	int32_t initial_floor;   /* SYSFS_PAIR: level the floor file holds now */
	int32_t initial_ceiling; /* SYSFS_PAIR: level the ceiling file holds now */
	int64_t record_cost_ns;  /* RECORD: spin this long per switch (tests: a slow actuator) */
	uint64_t levels_hz[TI_EXEC_MAX_LEVELS]; /* ascending */
	char path[2][TI_EXEC_PATH_LEN];
	char values[2][TI_EXEC_MAX_LEVELS][TI_EXEC_VALUE_LEN]; /* bytes written per level */
};

struct ti_exec_status {
	uint64_t applied;        /* successful actuator calls */
	uint64_t skipped;        /* switches to the level already in effect */
	uint64_t mismatches;     /* graphs whose node count differed from the plan's */
	uint64_t late_plans;     /* graphs that started with no plan for them */
	uint64_t log_overflow;   /* log records dropped (log full) */
	uint64_t deferred;       /* callback events handed over: executor lock was busy */
	uint64_t defer_overflow; /* callback events dropped: hand-over queue full */
	uint64_t plans_set;
	int32_t failed_errno;    /* 0 = ok; else the actuator error that stopped us */
	int32_t cur_level;       /* level in effect, -1 unknown */
	int32_t stopped;
	int32_t timer_rt;        /* 1: the timer thread runs SCHED_FIFO; 0: normal priority */
	uint64_t timer_wakes;    /* signals to the sleeping timer thread: a deadline came earlier */
};

struct ti_exec;

/*
 * 0, or -EINVAL (bad config), -ENOMEM, -errno from opening an actuator file, or from
 * starting the timer thread. Files (and the KMOD device) are opened O_WRONLY|O_CLOEXEC.
 */
TI_API int ti_exec_create(const struct ti_exec_config *cfg, struct ti_exec **out);
/* Stops the executor and joins its timer thread: once this returns, no actuator call is
 * in flight and none will start. Idempotent; safe from any thread but the timer. */
TI_API void ti_exec_stop(struct ti_exec *ex);
/* Stops, closes the files, frees. No hook may still point at ex. */
TI_API void ti_exec_destroy(struct ti_exec *ex);
/* Copies the plan (pending, or active at once when late). 0 or -EINVAL. */
TI_API int ti_exec_set_plan(struct ti_exec *ex, const struct ti_plan *plan);
/* The same; when t_ns is not NULL it receives the executor's clock at which it took the
 * plan (what passed switches and due TIME switches are judged at; replay sets the plan
 * at the same instant). */
TI_API int ti_exec_set_plan_at(struct ti_exec *ex, const struct ti_plan *plan, int64_t *t_ns);
/* Before each graph (ti_hook_begin_graph calls it when an executor is attached). */
TI_API void ti_exec_graph_begin(struct ti_exec *ex, uint64_t graph_seq);
/* From the eval callback: never waits (trylock; hands the event over when busy). */
TI_API void ti_exec_on_node(struct ti_exec *ex, int32_t ordinal, bool ask, int64_t t_ns);
/* Right after llama_decode returns. */
TI_API void ti_exec_graph_end(struct ti_exec *ex);
/* ti_exec_graph_end, storing in *t_ns (when not NULL) the clock it ended the graph at. */
TI_API void ti_exec_graph_end_at(struct ti_exec *ex, int64_t *t_ns);
/* Immediate switch (source NOW). 0 or -EINVAL. */
TI_API int ti_exec_switch_now(struct ti_exec *ex, int32_t level);
/* Copies up to max applied records, oldest first; never waits for the executor. */
TI_API uint32_t ti_exec_drain_log(struct ti_exec *ex, struct ti_applied *out, uint32_t max);
TI_API void ti_exec_status(struct ti_exec *ex, struct ti_exec_status *out);

/*
 * TESTS AND BENCHMARKS ONLY: a CPU stand-in for a GPU clock. When the model runs on the
 * host's CPU, graph time does not follow the steered GPU's clock, and a controller
 * rightly learns that a low clock costs nothing. With the stand-in on, a graph's work W
 * is the CPU time the engine thread spent between ti_exec_standin_begin (right before
 * llama_decode) and ti_exec_standin_wait (right after it returns, before
 * ti_exec_graph_end): its time at the top level on an unloaded host (with llama.cpp's
 * CPU threads sharing the work evenly; preemption by other processes is not work).
 * Work is done at rate(f) = 1 / ((1 - m) * f_top / f + m) per ns while level f is in
 * effect (the level this executor last applied, from the moment its write returned;
 * unknown = the top; m = memory_share, the part of the time that does not scale with
 * the clock); during the host's compute, at that rate times its productive share
 * W / wall. ti_exec_standin_wait sleeps (executor lock released, timer switches still
 * firing, each waking it) until W is done: the graph takes its host time plus what the
 * levels the plan applied add to its work, W * (f_top / f - 1) at a constant level f.
 *
 * ti_exec_standin_enable: 0; -EINVAL (memory_share outside [0, 1)); -EPERM for hardware:
 * the kmod actuator, or a sysfs actuator whose files are not regular files outside
 * sysfs (only fake trees and the recording actuator qualify).
 * ti_exec_standin_wait: ns slept, or -1 (off, or no begin since the last wait).
 */
TI_API int ti_exec_standin_enable(struct ti_exec *ex, double memory_share);
TI_API void ti_exec_standin_begin(struct ti_exec *ex);
TI_API int64_t ti_exec_standin_wait(struct ti_exec *ex);
TI_API void ti_exec_standin_status(struct ti_exec *ex, uint64_t *graphs, int64_t *waited_ns);

/* ABI checks for the Python side: sizeof a struct by name, offsetof a field (-1). */
TI_API int64_t ti_exec_struct_size(const char *name);
TI_API int64_t ti_exec_field_offset(const char *name, const char *field);

/*
 * Benchmarks (turboinfer_llama.bench.executor_cost): time each of n calls, ns into
 * out_ns[n]. ti_exec_bench_nodes calls ti_exec_on_node(ex, first + i, ask, now);
 * ti_exec_bench_eval calls ti_hook_eval(tensor, true, hook) then (false) when asked.
 */
TI_API void ti_exec_bench_nodes(struct ti_exec *ex, int32_t first, uint32_t n, bool ask,
				int64_t *out_ns);
TI_API void ti_exec_bench_eval(void *tensor, void *hook, uint32_t n, int64_t *out_ns);

#endif /* TI_EXEC_H */
