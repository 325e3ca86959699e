// SPDX-License-Identifier: MIT
/*
 * ti_exec: the native plan executor. See ti_exec.h and control/plan.py.
 *
 * Threads:
 *   engine  - the thread inside llama_decode that runs the eval callback
 *             (ti_exec_on_node). It never waits: it trylocks the executor lock and,
 *             when that is busy, hands its event over (a lock-free queue) to whoever
 *             holds the lock, which runs it on its way out (usually the timer thread).
 *   timer   - ours: fires OFFSET/TIME switches, waiting with pthread_cond_timedwait on
 *             a CLOCK_MONOTONIC condition variable (absolute deadline). A condition
 *             variable rather than clock_nanosleep because a new plan, a graph start
 *             (OFFSET switches armed) and stop must wake it early.
 *   python  - set_plan, graph_begin, graph_end, switch_now, status, stop: they may
 *             wait for the lock (never inside llama_decode).
 *
 * Every entry point first fires the timer switches already due at its time, then does
 * its own work, then fires those that became due: the executor's order of switches
 * is a function of the order of its inputs, which is what the Python model reproduces.
 */
#define _GNU_SOURCE

#include "ti_exec.h"
#include "ti_hooks.h"
#include "../kernel_module/turboinfer_uapi.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <time.h>
#include <unistd.h>

#define TI_TIMER_MAX (3 * TI_PLAN_MAX) /* pending, claimed and active plans' TIME */
#define TI_ENDS 4 /* graph ends remembered (ti_end_of) */
#define TI_DEFER_CAP 16384u            /* callback events handed over, power of two */
#define TI_NO_DUE INT64_MAX
#define TI_SYSFS_MAGIC 0x62656572 /* linux/magic.h SYSFS_MAGIC */

struct ti_timer {
	int64_t due_ns;
	int64_t expect_ns;
	uint64_t seq; /* insertion order: equal deadlines fire in plan order */
	uint64_t gen; /* the plan that owns it */
	int32_t level;
	bool graph_bound; /* OFFSET or re-timed NODE: dropped when its graph ends */
};

struct ti_deferred {
	int64_t t_ns;
	int32_t ordinal;
	int32_t ask;
};

/* A plan copy, its NODE switches in key order (stable), and its generation. */
struct ti_slot {
	struct ti_plan plan;
	uint16_t node_order[TI_PLAN_MAX];
	uint32_t n_node;
	uint64_t gen;
};

struct ti_exec {
	/* Immutable after ti_exec_create. */
	uint32_t n_levels;
	uint64_t levels_hz[TI_EXEC_MAX_LEVELS];
	enum ti_actuator_kind actuator;
	int64_t record_cost_ns;
	int fd[2];
	/*
	 * A regular file outside sysfs (a fake tree in tests) keeps the tail of a longer
	 * previous value after a pwrite at offset 0; there we truncate to the value's
	 * length when it is shorter, so the file reads like the attribute. Guarded by mu.
	 */
	bool truncate[2];
	off_t size[2];
	char values[2][TI_EXEC_MAX_LEVELS][TI_EXEC_VALUE_LEN];
	size_t value_len[2][TI_EXEC_MAX_LEVELS];
	struct ti_applied *log;
	uint32_t log_capacity;
	pthread_t timer;
	bool timer_started;
	bool timer_rt; /* the timer thread got SCHED_FIFO (written once under mu, by it) */

	/*
	 * The executor lock. It guards every field from here to "end of mu" and
	 * serialises actuator calls (they are made while holding it). The engine thread
	 * only ever trylocks it. Holders do bounded work and never sleep with it, except
	 * the timer thread inside pthread_cond_timedwait, which releases it.
	 */
	pthread_mutex_t mu;
	pthread_cond_t wake; /* CLOCK_MONOTONIC; signalled under mu when timers change */
	bool stopped;        /* set under mu: after that no actuator call starts */
	int32_t failed_errno;
	int32_t cur_level;
	int32_t floor_level; /* SYSFS_PAIR: level each file holds now */
	int32_t ceiling_level;
	/*
	 * SYSFS_PAIR: the highest level allowed, lowered when the ceiling file is found
	 * holding something other than what we last wrote there (a thermal daemon's cap,
	 * written between two of our switches); never raised. n_levels - 1 = no cap.
	 */
	int32_t cap_level;
	uint64_t caps_seen;
	struct ti_slot slots[4];
	int pending; /* slot index, -1 = none */
	int claimed; /* a plan for the begun graph, behind a later pending one; -1 = none */
	/* graph_end times of the last TI_ENDS graphs, by sequence (a ring) */
	uint64_t end_seq[TI_ENDS];
	int64_t end_ns[TI_ENDS];
	uint32_t end_next;
	/*
	 * The pending plan (gen def_gen) was retargeted past graph def_seq before it
	 * ended: its TIME switches are armed at that graph's end, moved by the time since
	 * def_base_ns (the end of the graph it was solved after). Valid when time_deferred.
	 */
	bool time_deferred;
	uint64_t def_gen;
	uint64_t def_seq;
	int64_t def_base_ns;
	int active;  /* slot index of the last activated plan, -1 = none */
	uint64_t act_gen;
	int32_t last_fallback;
	uint64_t seq;         /* graph sequence of the current/next graph */
	bool awaiting_first;  /* next ask is a graph's first */
	bool in_graph;        /* first ask seen, graph_end not yet */
	bool graph_active;    /* the active plan drives this graph */
	bool mismatched;
	int64_t t0_ns;        /* the first ask of the last graph that started */
	uint64_t started_seq; /* that graph's sequence (0: none yet) */
	int32_t max_ask;
	uint32_t node_cursor;
	int32_t fb_floor;
	int64_t ref_expect_ns;
	int32_t planned_level;
	struct ti_timer timers[TI_TIMER_MAX];
	uint32_t n_timers;
	int64_t next_due_ns;
	/*
	 * The timer thread waits (inside pthread_cond_[timed]wait, mu released) until
	 * wait_due_ns (TI_NO_DUE: until signalled). Both under mu. A change of timers
	 * signals it only when a deadline came earlier than that (ti_wake_timer): a futex
	 * wake of a sleeping thread costs the engine tens of microseconds on a VM.
	 */
	bool timer_waiting;
	int64_t wait_due_ns;
	uint64_t timer_wakes;
	uint64_t timer_seq;
	uint64_t applied, skipped, mismatches, late_plans, plans_set;
	/*
	 * The CPU stand-in for a GPU clock (tests and benchmarks only; see
	 * ti_exec_standin_enable): the graph's work W is its wall time on the host, taken as
	 * the time at the top level; progress runs at rate(level) <= 1 per ns (rate[] per
	 * level, 1 when unknown), integrated piecewise: sp_acc_ns at sp_t_ns, then the
	 * current level's rate since. sp_p0_ns: progress at the graph's first ask.
	 */
	bool standin;
	double standin_rate[TI_EXEC_MAX_LEVELS];
	double sp_acc_ns;
	int64_t sp_t_ns;
	double sp_p0_ns;
	bool sp_begun;          /* ti_exec_standin_begin called, wait not yet */
	int64_t sp_begin_ns;    /* its wall clock */
	int64_t sp_begin_cpu_ns; /* its calling thread's CPU clock */
	uint64_t standin_graphs;
	int64_t standin_waited_ns;
	pthread_cond_t standin_cv; /* CLOCK_MONOTONIC; broadcast under mu at each switch */
	/* end of mu */

	/*
	 * Hand-over queue, single producer (the engine thread) / single consumer (the
	 * executor lock's holder). dhead: stored by the producer (seq_cst) after filling a
	 * slot; dtail: stored by the consumer (release) after reading. See ti_unlock for
	 * why nothing stays queued.
	 */
	struct ti_deferred defer[TI_DEFER_CAP];
	_Atomic uint64_t dhead;
	_Atomic uint64_t dtail;
	_Atomic uint64_t deferred;       /* producer only */
	_Atomic uint64_t defer_overflow; /* producer only */

	/*
	 * Applied-switch log, single producer (the executor lock's holder) / single
	 * consumer (ti_exec_drain_log, serialised by drain_mu, never by mu). lhead: stored
	 * with release after a record is written; ltail: stored with release after the
	 * consumer copied records out.
	 */
	_Atomic uint64_t lhead;
	_Atomic uint64_t ltail;
	_Atomic uint64_t log_overflow;
	pthread_mutex_t drain_mu;

	_Atomic bool joined; /* ti_exec_stop joined the timer thread */
};

static int64_t ti_thread_cpu_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
		return 0;
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t ti_clock_ns(void)
{
	struct timespec ts;

	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- the CPU stand-in's progress (caller holds mu) -------------------------------- */

static double ti_sp_rate(const struct ti_exec *ex)
{
	return ex->cur_level < 0 ? 1.0 : ex->standin_rate[ex->cur_level];
}

/* Progress (ns of top-level work) done by t_ns at the level in effect since sp_t_ns. */
static double ti_sp_progress(const struct ti_exec *ex, int64_t t_ns)
{
	return ex->sp_acc_ns + (double)(t_ns - ex->sp_t_ns) * ti_sp_rate(ex);
}

/* Called before the level in effect changes at t_ns. */
static void ti_sp_advance(struct ti_exec *ex, int64_t t_ns)
{
	if (!ex->standin)
		return;
	ex->sp_acc_ns = ti_sp_progress(ex, t_ns);
	ex->sp_t_ns = t_ns;
	pthread_cond_broadcast(&ex->standin_cv);
}

/* ---- log ------------------------------------------------------------------------ */

static void ti_log(struct ti_exec *ex, const struct ti_applied *rec)
{
	uint64_t head = atomic_load_explicit(&ex->lhead, memory_order_relaxed);
	uint64_t tail = atomic_load_explicit(&ex->ltail, memory_order_acquire);

	if (head - tail >= ex->log_capacity) {
		atomic_fetch_add_explicit(&ex->log_overflow, 1, memory_order_relaxed);
		return;
	}
	ex->log[head % ex->log_capacity] = *rec;
	atomic_store_explicit(&ex->lhead, head + 1, memory_order_release);
}

/* ---- actuators ------------------------------------------------------------------ */

static int ti_write_value(struct ti_exec *ex, int which, int32_t level)
{
	size_t len = ex->value_len[which][level];
	ssize_t n = pwrite(ex->fd[which], ex->values[which][level], len, 0);

	if (n < 0)
		return errno != 0 ? errno : EIO;
	if ((size_t)n != len)
		return EIO;
	if (ex->truncate[which] && (off_t)len < ex->size[which]) {
		if (ftruncate(ex->fd[which], (off_t)len) != 0)
			return errno != 0 ? errno : EIO;
	}
	if (ex->truncate[which])
		ex->size[which] = (off_t)len;
	return 0;
}

static bool ti_is_space(char c)
{
	return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\0';
}

/*
 * Caller holds mu. SYSFS_PAIR: read the ceiling file back; if it no longer holds what
 * we wrote last, someone capped it since (a thermal daemon writing max_freq or
 * max_pwrlevel): lower cap_level to the highest level whose value is at or below the
 * one found (values in either order: Hz ascend, KGSL power levels descend), and return
 * it. A read that fails changes nothing (the write that follows reports the fault).
 */
static int32_t ti_check_cap(struct ti_exec *ex)
{
	const char *mine = ex->ceiling_level >= 0 ? ex->values[1][ex->ceiling_level] : "";
	size_t mine_len = ex->ceiling_level >= 0 ? ex->value_len[1][ex->ceiling_level] : 0;
	char buf[TI_EXEC_VALUE_LEN];
	long long found, v;
	bool ascending;
	ssize_t n;
	size_t len;
	int32_t i, cap = 0;
	char *end;

	n = pread(ex->fd[1], buf, sizeof(buf) - 1, 0);
	if (n <= 0)
		return ex->cap_level;
	len = (size_t)n;
	while (len > 0 && ti_is_space(buf[len - 1]))
		len--;
	while (mine_len > 0 && ti_is_space(mine[mine_len - 1]))
		mine_len--;
	buf[len] = '\0';
	if (len == mine_len && memcmp(buf, mine, len) == 0)
		return ex->cap_level;
	errno = 0;
	found = strtoll(buf, &end, 10);
	if (errno != 0 || end == buf)
		return ex->cap_level; /* not a number: not ours to judge */
	ascending = strtoll(ex->values[1][0], NULL, 10) <=
		    strtoll(ex->values[1][ex->n_levels - 1], NULL, 10);
	for (i = 0; i < (int32_t)ex->n_levels; i++) {
		v = strtoll(ex->values[1][i], NULL, 10);
		if (ascending ? v <= found : v >= found)
			cap = i;
	}
	if (cap < ex->cap_level) {
		ex->cap_level = cap;
		ex->caps_seen++;
	}
	return ex->cap_level;
}

/* 0 or an errno. SYSFS_PAIR never lets floor > ceiling exist between its writes. */
static int ti_actuate(struct ti_exec *ex, int32_t level)
{
	struct ti_set_freq req = { .freq_hz = ex->levels_hz[level] };
	int err;

	switch (ex->actuator) {
	case TI_ACT_RECORD:
		if (ex->record_cost_ns > 0) {
			int64_t until = ti_clock_ns() + ex->record_cost_ns;

			while (ti_clock_ns() < until)
				;
		}
		return 0;
	case TI_ACT_KMOD:
		if (ioctl(ex->fd[0], TI_SET_FREQ, &req) != 0)
			return errno != 0 ? errno : EIO;
		return 0;
	case TI_ACT_SYSFS_ONE:
		return ti_write_value(ex, 0, level);
	case TI_ACT_SYSFS_PAIR:
		if (level <= ex->ceiling_level) { /* down (or within): floor, then ceiling */
			err = ti_write_value(ex, 0, level);
			if (err != 0)
				return err;
			ex->floor_level = level;
			err = ti_write_value(ex, 1, level);
			if (err == 0)
				ex->ceiling_level = level;
			return err;
		}
		err = ti_write_value(ex, 1, level); /* up: ceiling, then floor */
		if (err != 0)
			return err;
		ex->ceiling_level = level;
		err = ti_write_value(ex, 0, level);
		if (err == 0)
			ex->floor_level = level;
		return err;
	}
	return EINVAL;
}

/* Caller holds mu; the executor has stopped (a failed write, or stop). The kernel module
 * drops an fd's frequency request on its last close: close it now, so a stopped executor
 * no longer pins the clock until ti_exec_destroy (Python restores the device next). */
static void ti_release_kmod(struct ti_exec *ex)
{
	if (ex->actuator != TI_ACT_KMOD || ex->fd[0] < 0)
		return;
	if (close(ex->fd[0]) != 0 && ex->failed_errno == 0)
		ex->failed_errno = errno;
	ex->fd[0] = -1;
}

/* Caller holds mu. Applies one switch unless stopped or already in effect. due_ns: the
 * timer deadline it fires for (-1 when not a timer switch), logged for lateness. */
static void ti_apply_due(struct ti_exec *ex, int32_t level, enum ti_source source, int32_t node,
			 int64_t due_ns)
{
	struct ti_applied rec;
	int64_t t_ns, done_ns;
	int err;

	if (ex->stopped || level < 0)
		return;
	t_ns = ti_clock_ns();
	if (ex->actuator == TI_ACT_SYSFS_PAIR && level > ti_check_cap(ex))
		level = ex->cap_level; /* never above a cap written since our last switch */
	if (level == ex->cur_level) {
		ex->skipped++;
		return;
	}
	err = ti_actuate(ex, level);
	done_ns = ti_clock_ns();
	rec = (struct ti_applied){
		.t_ns = t_ns,
		.freq_hz = ex->levels_hz[level],
		.cost_ns = done_ns - t_ns,
		.graph = ex->seq,
		.level = level,
		.source = (int32_t)source,
		.node = node,
		.err = err,
		.due_ns = due_ns,
	};
	ti_log(ex, &rec);
	if (err != 0) {
		ex->stopped = true;
		ex->failed_errno = err;
		ti_release_kmod(ex);
		pthread_cond_broadcast(&ex->wake); /* the timer thread exits */
		return;
	}
	ti_sp_advance(ex, done_ns); /* the write has landed: the new clock from here */
	ex->cur_level = level;
	ex->applied++;
}

static void ti_apply(struct ti_exec *ex, int32_t level, enum ti_source source, int32_t node)
{
	ti_apply_due(ex, level, source, node, -1);
}

/* ---- timers --------------------------------------------------------------------- */

static void ti_timers_recompute(struct ti_exec *ex)
{
	int64_t next = TI_NO_DUE;
	uint32_t i;

	for (i = 0; i < ex->n_timers; i++) {
		if (ex->timers[i].due_ns < next)
			next = ex->timers[i].due_ns;
	}
	ex->next_due_ns = next;
}

/* Caller holds mu: wakes the timer thread if it sleeps past the earliest deadline. */
static void ti_wake_timer(struct ti_exec *ex)
{
	if (ex->timer_waiting && ex->next_due_ns < ex->wait_due_ns) {
		ex->timer_wakes++;
		pthread_cond_signal(&ex->wake);
	}
}

static void ti_timer_add(struct ti_exec *ex, int64_t due_ns, int64_t expect_ns, int32_t level,
			 uint64_t gen, bool graph_bound)
{
	if (ex->n_timers >= TI_TIMER_MAX)
		return; /* cannot happen: at most one pending and one active plan */
	ex->timers[ex->n_timers++] = (struct ti_timer){
		.due_ns = due_ns,
		.expect_ns = expect_ns,
		.seq = ex->timer_seq++,
		.gen = gen,
		.level = level,
		.graph_bound = graph_bound,
	};
	if (due_ns < ex->next_due_ns)
		ex->next_due_ns = due_ns;
}

/* Drops the timers of plan gen (all of them, or only its graph-bound ones; gen 0 =
 * every plan). Order is kept by seq, so swap-removal is fine. */
static void ti_timers_drop(struct ti_exec *ex, uint64_t gen, bool graph_bound_only)
{
	uint32_t i = 0;

	while (i < ex->n_timers) {
		struct ti_timer *t = &ex->timers[i];

		if ((gen == 0 || t->gen == gen) && (!graph_bound_only || t->graph_bound))
			*t = ex->timers[--ex->n_timers];
		else
			i++;
	}
	ti_timers_recompute(ex);
}

/* A plan switch or checkpoint reached: feedback reference, planned level, floor.
 * due_ns: a timer's deadline (-1 for a node switch). */
static void ti_reach(struct ti_exec *ex, int32_t level, int64_t expect_ns, uint64_t gen,
		     enum ti_source source, int32_t node, int64_t due_ns)
{
	bool mine = ex->graph_active && gen == ex->act_gen;

	if (mine && expect_ns >= 0)
		ex->ref_expect_ns = expect_ns;
	if (level < 0)
		return;
	if (mine)
		ex->planned_level = level;
	ti_apply_due(ex, level > ex->fb_floor ? level : ex->fb_floor, source, node, due_ns);
}

/* Fires the timers due at or before now_ns, earliest first (then plan order). */
static void ti_fire_due(struct ti_exec *ex, int64_t now_ns)
{
	while (ex->next_due_ns <= now_ns && !ex->stopped) {
		uint32_t i, best = 0;
		struct ti_timer t;

		for (i = 1; i < ex->n_timers; i++) {
			const struct ti_timer *c = &ex->timers[i], *b = &ex->timers[best];

			if (c->due_ns < b->due_ns || (c->due_ns == b->due_ns && c->seq < b->seq))
				best = i;
		}
		t = ex->timers[best];
		ex->timers[best] = ex->timers[--ex->n_timers];
		ti_timers_recompute(ex);
		ti_reach(ex, t.level, t.expect_ns, t.gen, TI_SRC_TIMER, -1, t.due_ns);
	}
}

/* ---- plans ---------------------------------------------------------------------- */

static void ti_slot_fill(struct ti_slot *s, const struct ti_plan *plan, uint64_t gen)
{
	uint32_t i, j, n = 0;

	s->plan = *plan;
	s->gen = gen;
	/* Insertion sort by key, stable: done on the Python thread, not at activation. */
	for (i = 0; i < plan->n_switches; i++) {
		if (plan->switches[i].anchor != TI_ANCHOR_NODE)
			continue;
		j = n++;
		while (j > 0 && plan->switches[s->node_order[j - 1]].key > plan->switches[i].key) {
			s->node_order[j] = s->node_order[j - 1];
			j--;
		}
		s->node_order[j] = (uint16_t)i;
	}
	s->n_node = n;
}

static int ti_free_slot(const struct ti_exec *ex)
{
	int i;

	for (i = 0; i < 4; i++) {
		if (i != ex->pending && i != ex->active && i != ex->claimed)
			return i;
	}
	return -1; /* unreachable: four slots, three in use at most */
}

/* Re-times the remaining NODE switches at t0 + expect_ns (a graph of another size). */
static void ti_mismatch(struct ti_exec *ex)
{
	const struct ti_slot *s = &ex->slots[ex->active];

	ex->mismatched = true;
	ex->mismatches++;
	for (; ex->node_cursor < s->n_node; ex->node_cursor++) {
		const struct ti_switch *sw = &s->plan.switches[s->node_order[ex->node_cursor]];

		if (sw->expect_ns >= 0)
			ti_timer_add(ex, ex->t0_ns + sw->expect_ns, sw->expect_ns, sw->level,
				     s->gen, true);
	}
	ti_wake_timer(ex);
}

/* Makes slot idx the active plan for the running graph. */
static void ti_activate(struct ti_exec *ex, int idx)
{
	if (ex->active >= 0 && ex->slots[ex->active].gen != ex->slots[idx].gen)
		ti_timers_drop(ex, ex->slots[ex->active].gen, false);
	ex->active = idx;
	ex->act_gen = ex->slots[idx].gen;
	ex->graph_active = true;
	ex->last_fallback = ex->slots[idx].plan.fallback_level;
	ex->node_cursor = 0;
}

static void ti_arm_offsets(struct ti_exec *ex, const struct ti_slot *s, int64_t now_ns,
			   bool late, int32_t *collapsed)
{
	const struct ti_plan *p = &s->plan;
	uint32_t i;

	for (i = 0; i < p->n_switches; i++) {
		const struct ti_switch *sw = &p->switches[i];
		bool passed = false;

		if (sw->anchor == TI_ANCHOR_OFFSET) {
			passed = late && ex->t0_ns + sw->key <= now_ns;
			if (!passed)
				ti_timer_add(ex, ex->t0_ns + sw->key, sw->expect_ns, sw->level,
					     s->gen, true);
		} else if (late && sw->anchor == TI_ANCHOR_NODE) {
			passed = sw->key <= ex->max_ask;
		} else if (late && sw->anchor == TI_ANCHOR_TIME) {
			passed = sw->key <= now_ns;
			if (!passed)
				ti_timer_add(ex, sw->key, sw->expect_ns, sw->level, s->gen, false);
		}
		if (passed) {
			if (sw->expect_ns >= 0)
				ex->ref_expect_ns = sw->expect_ns;
			if (sw->level >= 0)
				*collapsed = sw->level;
		}
	}
	if (late) {
		while (ex->node_cursor < s->n_node &&
		       p->switches[s->node_order[ex->node_cursor]].key <= ex->max_ask)
			ex->node_cursor++;
	}
}

/* Caller holds mu. Slot idx's plan runs the graph whose first ask came at t_ns. */
static void ti_run_plan(struct ti_exec *ex, int idx, int64_t t_ns)
{
	const struct ti_plan *p = &ex->slots[idx].plan;
	int32_t first = -1;

	ti_activate(ex, idx);
	ti_arm_offsets(ex, &ex->slots[idx], t_ns, false, &first);
	ex->planned_level = p->first_level;
	ti_apply(ex, p->first_level, TI_SRC_FIRST, -1);
	ti_wake_timer(ex);
}

/* The first ask of a graph. */
static void ti_start_graph(struct ti_exec *ex, int64_t t_ns)
{
	const struct ti_plan *p;

	ex->awaiting_first = false;
	ex->in_graph = true;
	ex->graph_active = false;
	ex->mismatched = false;
	ex->t0_ns = t_ns;
	ex->started_seq = ex->seq;
	ex->max_ask = -1;
	ex->fb_floor = -1;
	ex->ref_expect_ns = -1;
	ex->planned_level = -1;
	ex->node_cursor = 0;
	ti_timers_drop(ex, 0, true);
	if (ex->claimed >= 0) {
		int idx = ex->claimed;

		ex->claimed = -1;
		if (ex->slots[idx].plan.graph == ex->seq) {
			ti_run_plan(ex, idx, t_ns);
			return;
		}
		ti_timers_drop(ex, ex->slots[idx].gen, false);
	}
	if (ex->pending >= 0) {
		p = &ex->slots[ex->pending].plan;
		if (p->graph == 0 || p->graph == ex->seq) {
			int idx = ex->pending;

			ex->pending = -1;
			ti_run_plan(ex, idx, t_ns);
			return;
		}
		if (p->graph < ex->seq) { /* stale: for a graph that is gone */
			ti_timers_drop(ex, ex->slots[ex->pending].gen, false);
			ex->pending = -1;
		}
	}
	if (ex->plans_set > 0)
		ex->late_plans++;
	ti_apply(ex, ex->last_fallback, TI_SRC_FALLBACK, -1);
}

/* Caller holds mu. One callback event. */
static void ti_node_locked(struct ti_exec *ex, int32_t ordinal, bool ask, int64_t t_ns)
{
	const struct ti_slot *s;

	ti_fire_due(ex, t_ns);
	if (ask) {
		if (ex->awaiting_first)
			ti_start_graph(ex, t_ns);
		if (ordinal > ex->max_ask)
			ex->max_ask = ordinal;
		if (ex->graph_active) {
			s = &ex->slots[ex->active];
			if (!ex->mismatched && s->plan.n_nodes > 0 &&
			    ordinal >= (int32_t)s->plan.n_nodes) {
				ti_mismatch(ex);
			} else {
				while (ex->node_cursor < s->n_node && !ex->stopped) {
					const struct ti_switch *sw =
						&s->plan.switches[s->node_order[ex->node_cursor]];

					if (sw->key > ordinal)
						break;
					ex->node_cursor++;
					ti_reach(ex, sw->level, sw->expect_ns, s->gen, TI_SRC_NODE,
						 ordinal, -1);
				}
			}
		}
	} else if (ex->graph_active && ex->in_graph) {
		const struct ti_plan *p = &ex->slots[ex->active].plan;
		int64_t err_ns = (t_ns - ex->t0_ns) - ex->ref_expect_ns - p->margin_ns;
		int32_t base = ex->planned_level >= 0 ? ex->planned_level : ex->cur_level;

		if (p->gain > 0 && p->predicted_ns > 0 && ex->ref_expect_ns >= 0 && err_ns > 0 &&
		    base >= 0) {
			double steps = ceil(p->gain * (double)err_ns / (double)p->predicted_ns);
			int32_t top = (int32_t)ex->n_levels - 1;
			int32_t target = steps >= (double)top ? top : base + (int32_t)steps;

			if (target > top)
				target = top;
			if (target > ex->cur_level) {
				if (target > ex->fb_floor)
					ex->fb_floor = target;
				ti_apply(ex, target, TI_SRC_FEEDBACK, ordinal);
			}
		}
	}
	ti_fire_due(ex, t_ns);
}

/* ---- the hand-over queue and the lock ------------------------------------------- */

static void ti_run_deferred(struct ti_exec *ex)
{
	uint64_t tail = atomic_load_explicit(&ex->dtail, memory_order_relaxed);
	uint64_t head = atomic_load_explicit(&ex->dhead, memory_order_acquire);

	for (; tail != head; tail++) {
		struct ti_deferred d = ex->defer[tail % TI_DEFER_CAP];

		ti_node_locked(ex, d.ordinal, d.ask != 0, d.t_ns);
	}
	atomic_store_explicit(&ex->dtail, tail, memory_order_release);
}

static bool ti_deferred_pending(struct ti_exec *ex)
{
	atomic_thread_fence(memory_order_seq_cst);
	return atomic_load_explicit(&ex->dhead, memory_order_acquire) !=
	       atomic_load_explicit(&ex->dtail, memory_order_relaxed);
}

static void ti_lock(struct ti_exec *ex)
{
	pthread_mutex_lock(&ex->mu);
	ti_run_deferred(ex);
}

/*
 * Releases mu with nothing left queued. The engine pushes, fences, then trylocks; we
 * unlock, fence, then look at the queue. With both fences, either the engine's trylock
 * succeeds (it runs the queue itself) or we see its push here and take the lock back.
 */
static void ti_unlock(struct ti_exec *ex)
{
	for (;;) {
		ti_run_deferred(ex);
		pthread_mutex_unlock(&ex->mu);
		if (!ti_deferred_pending(ex) || pthread_mutex_trylock(&ex->mu) != 0)
			return;
	}
}

static bool ti_defer(struct ti_exec *ex, int32_t ordinal, bool ask, int64_t t_ns)
{
	uint64_t head = atomic_load_explicit(&ex->dhead, memory_order_relaxed);
	uint64_t tail = atomic_load_explicit(&ex->dtail, memory_order_acquire);

	if (head - tail >= TI_DEFER_CAP) {
		atomic_fetch_add_explicit(&ex->defer_overflow, 1, memory_order_relaxed);
		return false;
	}
	ex->defer[head % TI_DEFER_CAP] = (struct ti_deferred){
		.t_ns = t_ns,
		.ordinal = ordinal,
		.ask = ask ? 1 : 0,
	};
	atomic_store_explicit(&ex->dhead, head + 1, memory_order_seq_cst);
	atomic_fetch_add_explicit(&ex->deferred, 1, memory_order_relaxed);
	atomic_thread_fence(memory_order_seq_cst);
	return true;
}

/* ---- timer thread --------------------------------------------------------------- */

static void *ti_timer_main(void *arg)
{
	struct ti_exec *ex = arg;
	struct timespec ts;
	const struct sched_param rt = { .sched_priority = 1 };

	/*
	 * Best effort: the lowest real-time priority, so a switch due inside a stall is not
	 * delayed by busy CPUs (the engine's own threads). It needs root or CAP_SYS_NICE
	 * (a rooted phone has it); without it the thread keeps its normal priority. The
	 * thread sleeps between switches and does microseconds of work per switch.
	 */
	bool rt_ok = pthread_setschedparam(pthread_self(), SCHED_FIFO, &rt) == 0;

	ti_lock(ex);
	ex->timer_rt = rt_ok;
	while (!ex->stopped) {
		ti_fire_due(ex, ti_clock_ns());
		ti_run_deferred(ex);
		if (ex->stopped)
			break;
		if (ex->next_due_ns <= ti_clock_ns())
			continue;
		ex->timer_waiting = true;
		ex->wait_due_ns = ex->next_due_ns;
		if (ex->next_due_ns == TI_NO_DUE) {
			pthread_cond_wait(&ex->wake, &ex->mu);
		} else {
			ts.tv_sec = (time_t)(ex->next_due_ns / 1000000000);
			ts.tv_nsec = (long)(ex->next_due_ns % 1000000000);
			pthread_cond_timedwait(&ex->wake, &ex->mu, &ts); /* 0 or ETIMEDOUT */
		}
		ex->timer_waiting = false;
		ti_run_deferred(ex);
	}
	ti_unlock(ex);
	return NULL;
}

/* ---- API ------------------------------------------------------------------------ */

static bool ti_config_ok(const struct ti_exec_config *cfg)
{
	uint32_t i;

	if (cfg == NULL || cfg->n_levels == 0 || cfg->n_levels > TI_EXEC_MAX_LEVELS)
		return false;
	if (cfg->log_capacity == 0 || cfg->log_capacity > TI_EXEC_MAX_LOG)
		return false;
	if (cfg->actuator < TI_ACT_RECORD || cfg->actuator > TI_ACT_SYSFS_ONE)
		return false;
	if (cfg->initial_level < -1 || cfg->initial_level >= (int32_t)cfg->n_levels)
		return false;
	if (cfg->record_cost_ns < 0 || cfg->record_cost_ns > 1000000000)
		return false;
	for (i = 0; i < cfg->n_levels; i++) {
		if (cfg->levels_hz[i] == 0 || (i > 0 && cfg->levels_hz[i] <= cfg->levels_hz[i - 1]))
			return false;
	}
	if (cfg->actuator == TI_ACT_SYSFS_PAIR &&
	    (cfg->initial_floor < 0 || cfg->initial_ceiling < cfg->initial_floor ||
	     cfg->initial_ceiling >= (int32_t)cfg->n_levels))
		return false;
	return true;
}

static bool ti_terminated(const char *s, size_t cap)
{
	return memchr(s, '\0', cap) != NULL;
}

static int ti_open_files(struct ti_exec *ex, const struct ti_exec_config *cfg)
{
	int n_files = cfg->actuator == TI_ACT_SYSFS_PAIR ? 2 : 1;
	bool sysfs = cfg->actuator == TI_ACT_SYSFS_PAIR || cfg->actuator == TI_ACT_SYSFS_ONE;
	int which, err;
	uint32_t i;

	for (which = 0; which < n_files; which++) {
		if (!ti_terminated(cfg->path[which], TI_EXEC_PATH_LEN) ||
		    cfg->path[which][0] == '\0')
			return -EINVAL;
		for (i = 0; sysfs && i < cfg->n_levels; i++) {
			if (!ti_terminated(cfg->values[which][i], TI_EXEC_VALUE_LEN) ||
			    cfg->values[which][i][0] == '\0')
				return -EINVAL;
			memcpy(ex->values[which][i], cfg->values[which][i], TI_EXEC_VALUE_LEN);
			ex->value_len[which][i] = strlen(cfg->values[which][i]);
		}
	}
	for (which = 0; which < n_files; which++) {
		struct stat st;
		struct statfs sfs;

		/* the ceiling is read back before each switch (ti_check_cap) where it can be */
		ex->fd[which] = -1;
		if (cfg->actuator == TI_ACT_SYSFS_PAIR && which == 1)
			ex->fd[which] = open(cfg->path[which], O_RDWR | O_CLOEXEC);
		if (ex->fd[which] < 0)
			ex->fd[which] = open(cfg->path[which], O_WRONLY | O_CLOEXEC);
		if (ex->fd[which] < 0) {
			err = -errno;
			goto fail;
		}
		if (!sysfs)
			continue;
		if (fstat(ex->fd[which], &st) != 0 || fstatfs(ex->fd[which], &sfs) != 0) {
			err = -errno;
			close(ex->fd[which]);
			ex->fd[which] = -1;
			goto fail;
		}
		ex->truncate[which] = S_ISREG(st.st_mode) && sfs.f_type != TI_SYSFS_MAGIC;
		ex->size[which] = st.st_size;
	}
	return 0;

fail:
	while (--which >= 0) {
		close(ex->fd[which]);
		ex->fd[which] = -1;
	}
	return err;
}

TI_API int ti_exec_create(const struct ti_exec_config *cfg, struct ti_exec **out)
{
	struct ti_exec *ex = NULL;
	pthread_condattr_t attr;
	int err = -EINVAL;

	if (out == NULL || !ti_config_ok(cfg))
		goto fail;
	err = -ENOMEM;
	ex = calloc(1, sizeof(*ex));
	if (ex == NULL)
		goto fail;
	ex->log = calloc(cfg->log_capacity, sizeof(*ex->log));
	if (ex->log == NULL)
		goto fail_ex;
	ex->fd[0] = ex->fd[1] = -1;
	ex->n_levels = cfg->n_levels;
	memcpy(ex->levels_hz, cfg->levels_hz, sizeof(ex->levels_hz));
	ex->actuator = (enum ti_actuator_kind)cfg->actuator;
	ex->log_capacity = cfg->log_capacity;
	ex->record_cost_ns = cfg->record_cost_ns;
	ex->cur_level = cfg->initial_level;
	ex->floor_level = cfg->initial_floor;
	ex->ceiling_level = cfg->initial_ceiling;
	ex->cap_level = (int32_t)cfg->n_levels - 1;
	ex->pending = ex->active = ex->claimed = -1;
	ex->last_fallback = -1;
	ex->awaiting_first = true;
	ex->max_ask = -1;
	ex->fb_floor = -1;
	ex->ref_expect_ns = -1;
	ex->planned_level = -1;
	ex->next_due_ns = TI_NO_DUE;
	atomic_init(&ex->dhead, 0);
	atomic_init(&ex->dtail, 0);
	atomic_init(&ex->deferred, 0);
	atomic_init(&ex->defer_overflow, 0);
	atomic_init(&ex->lhead, 0);
	atomic_init(&ex->ltail, 0);
	atomic_init(&ex->log_overflow, 0);
	atomic_init(&ex->joined, false);

	if (ex->actuator != TI_ACT_RECORD) {
		err = ti_open_files(ex, cfg);
		if (err != 0)
			goto fail_log;
	}
	err = -pthread_mutex_init(&ex->mu, NULL);
	if (err != 0)
		goto fail_files;
	err = -pthread_mutex_init(&ex->drain_mu, NULL);
	if (err != 0)
		goto fail_mu;
	err = -pthread_condattr_init(&attr);
	if (err != 0)
		goto fail_drain_mu;
	err = -pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	if (err == 0)
		err = -pthread_cond_init(&ex->wake, &attr);
	if (err == 0) {
		err = -pthread_cond_init(&ex->standin_cv, &attr);
		if (err != 0)
			pthread_cond_destroy(&ex->wake);
	}
	pthread_condattr_destroy(&attr);
	if (err != 0)
		goto fail_drain_mu;
	err = -pthread_create(&ex->timer, NULL, ti_timer_main, ex);
	if (err != 0)
		goto fail_cond;
	ex->timer_started = true;
	*out = ex;
	return 0;

fail_cond:
	pthread_cond_destroy(&ex->standin_cv);
	pthread_cond_destroy(&ex->wake);
fail_drain_mu:
	pthread_mutex_destroy(&ex->drain_mu);
fail_mu:
	pthread_mutex_destroy(&ex->mu);
fail_files:
	if (ex->fd[1] >= 0)
		close(ex->fd[1]);
	if (ex->fd[0] >= 0)
		close(ex->fd[0]);
fail_log:
	free(ex->log);
fail_ex:
	free(ex);
fail:
	return err;
}

TI_API void ti_exec_stop(struct ti_exec *ex)
{
	if (ex == NULL)
		return;
	ti_lock(ex);
	ex->stopped = true; /* under mu: no actuator call is in flight now, none will start */
	ti_release_kmod(ex);
	pthread_cond_broadcast(&ex->wake);
	pthread_cond_broadcast(&ex->standin_cv); /* a stand-in wait ends at once */
	ti_unlock(ex);
	if (ex->timer_started && !atomic_exchange(&ex->joined, true))
		pthread_join(ex->timer, NULL);
}

TI_API void ti_exec_destroy(struct ti_exec *ex)
{
	if (ex == NULL)
		return;
	ti_exec_stop(ex);
	pthread_cond_destroy(&ex->standin_cv);
	pthread_cond_destroy(&ex->wake);
	pthread_mutex_destroy(&ex->drain_mu);
	pthread_mutex_destroy(&ex->mu);
	if (ex->fd[1] >= 0)
		close(ex->fd[1]);
	if (ex->fd[0] >= 0)
		close(ex->fd[0]);
	free(ex->log);
	free(ex);
}

static bool ti_plan_ok(const struct ti_exec *ex, const struct ti_plan *p)
{
	int32_t n = (int32_t)ex->n_levels;
	uint32_t i;

	if (p == NULL || p->n_switches > TI_PLAN_MAX || !(p->gain >= 0) || p->predicted_ns < 0)
		return false;
	if (p->first_level >= n || p->end_level >= n || p->fallback_level >= n)
		return false;
	for (i = 0; i < p->n_switches; i++) {
		const struct ti_switch *sw = &p->switches[i];

		if (sw->anchor < TI_ANCHOR_NODE || sw->anchor > TI_ANCHOR_TIME || sw->level >= n)
			return false;
		if (sw->anchor != TI_ANCHOR_TIME && sw->key < 0)
			return false;
	}
	return true;
}

/* A plan for the graph now running that started without one. */
static void ti_set_late(struct ti_exec *ex, int idx, int64_t now_ns)
{
	const struct ti_slot *s = &ex->slots[idx];
	int32_t collapsed = s->plan.first_level;

	ti_activate(ex, idx);
	ti_arm_offsets(ex, s, now_ns, true, &collapsed);
	ex->planned_level = collapsed;
	if (s->plan.n_nodes > 0 && ex->max_ask >= (int32_t)s->plan.n_nodes)
		ti_mismatch(ex);
	ti_apply(ex, collapsed, TI_SRC_FIRST, -1);
}

TI_API int ti_exec_set_plan(struct ti_exec *ex, const struct ti_plan *plan)
{
	return ti_exec_set_plan_at(ex, plan, NULL);
}

/*
 * Caller holds mu. A plan solved after graph after_graph: for the graph after the last
 * one begun (see struct ti_plan), control/plan.py's retarget.
 */
static void ti_retarget(const struct ti_exec *ex, struct ti_plan *p)
{
	p->graph = (ex->seq > p->after_graph ? ex->seq : p->after_graph) + 1;
}

/* Caller holds mu. The graph_end time of graph seq, or -1 when not remembered. */
static int64_t ti_end_of(const struct ti_exec *ex, uint64_t seq)
{
	uint32_t i;

	for (i = 0; i < TI_ENDS; i++) {
		if (ex->end_seq[i] == seq && ex->end_ns[i] > 0)
			return ex->end_ns[i];
	}
	return -1;
}

/* Caller holds mu. Arms the TIME switches of slot idx, moved by shift_ns. */
static void ti_arm_time(struct ti_exec *ex, int idx, int64_t shift_ns)
{
	const struct ti_plan *p = &ex->slots[idx].plan;
	uint32_t i;

	for (i = 0; i < p->n_switches; i++) {
		const struct ti_switch *sw = &p->switches[i];

		if (sw->anchor == TI_ANCHOR_TIME)
			ti_timer_add(ex, sw->key + shift_ns, sw->expect_ns, sw->level,
				     ex->slots[idx].gen, false);
	}
}

TI_API int ti_exec_set_plan_at(struct ti_exec *ex, const struct ti_plan *plan, int64_t *t_ns)
{
	struct ti_plan *sp;
	int64_t now_ns, after_end_ns = -1, plan_t0_ns;
	bool passed = false;
	int idx;

	if (ex == NULL || !ti_plan_ok(ex, plan))
		return -EINVAL;
	ti_lock(ex);
	now_ns = ti_clock_ns();
	if (t_ns != NULL)
		*t_ns = now_ns;
	ti_fire_due(ex, now_ns);
	idx = ti_free_slot(ex);
	ex->plans_set++;
	ti_slot_fill(&ex->slots[idx], plan, ex->plans_set);
	sp = &ex->slots[idx].plan;
	plan_t0_ns = sp->after_t0_ns;
	if (sp->after_graph > 0) {
		passed = ex->seq > sp->after_graph;
		after_end_ns = ti_end_of(ex, sp->after_graph);
		ti_retarget(ex, sp);
	}
	if (ex->in_graph && (sp->graph == ex->seq || (sp->graph == 0 && !ex->graph_active))) {
		ti_set_late(ex, idx, now_ns);
	} else {
		int64_t shift_ns = 0;
		bool arm = true;

		if (ex->pending >= 0 && ex->awaiting_first &&
		    ex->slots[ex->pending].plan.graph == ex->seq && sp->graph > ex->seq) {
			/* the pending plan is the begun graph's: it stays, claimed */
			if (ex->claimed >= 0)
				ti_timers_drop(ex, ex->slots[ex->claimed].gen, false);
			ex->claimed = ex->pending;
		} else if (ex->pending >= 0) {
			ti_timers_drop(ex, ex->slots[ex->pending].gen, false);
		}
		ex->pending = idx;
		ex->time_deferred = false;
		if (passed && after_end_ns >= 0) {
			int64_t run_end_ns = ti_end_of(ex, ex->seq);

			if (run_end_ns < 0) { /* armed at the passed graph's end */
				ex->time_deferred = true;
				ex->def_gen = ex->slots[idx].gen;
				ex->def_seq = ex->seq;
				ex->def_base_ns = after_end_ns;
				arm = false;
			} else {
				shift_ns = run_end_ns - after_end_ns;
			}
		} else if (passed) {
			shift_ns = ex->t0_ns - plan_t0_ns; /* its end unknown: by the starts */
		}
		if (arm)
			ti_arm_time(ex, idx, shift_ns);
	}
	ti_fire_due(ex, now_ns);
	ti_wake_timer(ex);
	ti_unlock(ex);
	return 0;
}

TI_API void ti_exec_graph_begin(struct ti_exec *ex, uint64_t graph_seq)
{
	if (ex == NULL)
		return;
	ti_lock(ex);
	ti_fire_due(ex, ti_clock_ns());
	if (ex->in_graph) { /* the previous graph never ended: drop its switches */
		ti_timers_drop(ex, 0, true);
		ex->in_graph = false;
		ex->graph_active = false;
		ex->fb_floor = -1;
	}
	ex->seq = graph_seq;
	ex->awaiting_first = true;
	ti_unlock(ex);
}

TI_API void ti_exec_on_node(struct ti_exec *ex, int32_t ordinal, bool ask, int64_t t_ns)
{
	if (ex == NULL)
		return;
	if (pthread_mutex_trylock(&ex->mu) != 0) {
		if (!ti_defer(ex, ordinal, ask, t_ns))
			return;
		if (pthread_mutex_trylock(&ex->mu) != 0) {
			/* The holder runs it on its way out; wake the timer in case it is
			 * the holder and about to wait. */
			pthread_cond_signal(&ex->wake);
			return;
		}
		ti_run_deferred(ex); /* includes ours */
		ti_unlock(ex);
		return;
	}
	ti_run_deferred(ex);
	ti_node_locked(ex, ordinal, ask, t_ns);
	ti_unlock(ex);
}

TI_API void ti_exec_graph_end(struct ti_exec *ex)
{
	ti_exec_graph_end_at(ex, NULL);
}

TI_API void ti_exec_graph_end_at(struct ti_exec *ex, int64_t *t_ns)
{
	int64_t now_ns;

	if (ex == NULL)
		return;
	ti_lock(ex);
	now_ns = ti_clock_ns();
	if (t_ns != NULL)
		*t_ns = now_ns;
	ti_fire_due(ex, now_ns);
	if (ex->in_graph) {
		ex->in_graph = false;
		ex->fb_floor = -1;
		if (ex->graph_active) {
			const struct ti_plan *p = &ex->slots[ex->active].plan;

			ex->graph_active = false;
			if (!ex->mismatched && p->n_nodes > 0 && ex->max_ask + 1 < (int32_t)p->n_nodes)
				ex->mismatches++;
			ti_timers_drop(ex, 0, true);
			ti_apply(ex, p->end_level, TI_SRC_END, -1);
		}
	}
	ex->end_seq[ex->end_next] = ex->seq;
	ex->end_ns[ex->end_next] = now_ns;
	ex->end_next = (ex->end_next + 1) % TI_ENDS;
	if (ex->time_deferred && ex->def_seq == ex->seq) {
		ex->time_deferred = false;
		if (ex->pending >= 0 && ex->slots[ex->pending].gen == ex->def_gen)
			ti_arm_time(ex, ex->pending, now_ns - ex->def_base_ns);
	}
	ex->awaiting_first = true;
	ti_fire_due(ex, now_ns);
	ti_wake_timer(ex); /* a stall raise armed just now may be due before its wait */
	ti_unlock(ex);
}

TI_API int ti_exec_switch_now(struct ti_exec *ex, int32_t level)
{
	if (ex == NULL || level < 0 || level >= (int32_t)ex->n_levels)
		return -EINVAL;
	ti_lock(ex);
	ti_fire_due(ex, ti_clock_ns());
	ti_apply(ex, level, TI_SRC_NOW, -1);
	ti_unlock(ex);
	return 0;
}

TI_API uint32_t ti_exec_drain_log(struct ti_exec *ex, struct ti_applied *out, uint32_t max)
{
	uint64_t tail, head, n, first, run;

	if (ex == NULL || out == NULL)
		return 0;
	pthread_mutex_lock(&ex->drain_mu);
	tail = atomic_load_explicit(&ex->ltail, memory_order_relaxed);
	head = atomic_load_explicit(&ex->lhead, memory_order_acquire);
	n = head - tail;
	if (n > max)
		n = max;
	first = tail % ex->log_capacity;
	run = ex->log_capacity - first;
	if (run > n)
		run = n;
	memcpy(out, &ex->log[first], run * sizeof(*out));
	memcpy(out + run, ex->log, (n - run) * sizeof(*out));
	atomic_store_explicit(&ex->ltail, tail + n, memory_order_release);
	pthread_mutex_unlock(&ex->drain_mu);
	return (uint32_t)n;
}

TI_API void ti_exec_status(struct ti_exec *ex, struct ti_exec_status *out)
{
	if (ex == NULL || out == NULL)
		return;
	ti_lock(ex);
	*out = (struct ti_exec_status){
		.applied = ex->applied,
		.skipped = ex->skipped,
		.mismatches = ex->mismatches,
		.late_plans = ex->late_plans,
		.log_overflow = atomic_load_explicit(&ex->log_overflow, memory_order_relaxed),
		.deferred = atomic_load_explicit(&ex->deferred, memory_order_relaxed),
		.defer_overflow = atomic_load_explicit(&ex->defer_overflow, memory_order_relaxed),
		.plans_set = ex->plans_set,
		.failed_errno = ex->failed_errno,
		.cur_level = ex->cur_level,
		.stopped = ex->stopped ? 1 : 0,
		.timer_rt = ex->timer_rt ? 1 : 0,
		.timer_wakes = ex->timer_wakes,
	};
	ti_unlock(ex);
}

/* ---- the CPU stand-in for a GPU clock (tests and benchmarks only) ---------------- */

TI_API int ti_exec_standin_enable(struct ti_exec *ex, double memory_share)
{
	int which, n_files;
	uint32_t i;
	double f_top;

	if (ex == NULL || !(memory_share >= 0.0 && memory_share < 1.0))
		return -EINVAL;
	/* Never on hardware: a real clock already sets graph time there. Only the recording
	 * actuator, or sysfs actuators whose files are regular files outside sysfs (a fake
	 * tree: ti_open_files set truncate for exactly those). */
	if (ex->actuator == TI_ACT_KMOD)
		return -EPERM;
	n_files = ex->actuator == TI_ACT_SYSFS_PAIR ? 2 : ex->actuator == TI_ACT_SYSFS_ONE ? 1 : 0;
	for (which = 0; which < n_files; which++) {
		if (!ex->truncate[which])
			return -EPERM;
	}
	f_top = (double)ex->levels_hz[ex->n_levels - 1];
	ti_lock(ex);
	for (i = 0; i < ex->n_levels; i++) {
		double slow = (1.0 - memory_share) * f_top / (double)ex->levels_hz[i] + memory_share;

		ex->standin_rate[i] = 1.0 / slow;
	}
	if (!ex->standin) {
		ex->sp_acc_ns = 0.0;
		ex->sp_t_ns = ti_clock_ns();
		ex->sp_p0_ns = 0.0;
	}
	ex->standin = true;
	ti_unlock(ex);
	return 0;
}

TI_API void ti_exec_standin_begin(struct ti_exec *ex)
{
	int64_t cpu_ns = ti_thread_cpu_ns();

	if (ex == NULL)
		return;
	ti_lock(ex);
	if (ex->standin) {
		ex->sp_begun = true;
		ex->sp_begin_ns = ti_clock_ns();
		ex->sp_begin_cpu_ns = cpu_ns;
		ex->sp_p0_ns = ti_sp_progress(ex, ex->sp_begin_ns);
	}
	ti_unlock(ex);
}

TI_API int64_t ti_exec_standin_wait(struct ti_exec *ex)
{
	int64_t cpu_ns = ti_thread_cpu_ns();
	int64_t start_ns, now_ns, wall_ns, work_ns;
	double done, left, base;

	if (ex == NULL)
		return -1;
	ti_lock(ex);
	if (!ex->standin || !ex->sp_begun) {
		ti_unlock(ex);
		return -1;
	}
	ex->sp_begun = false;
	start_ns = now_ns = ti_clock_ns();
	wall_ns = now_ns - ex->sp_begin_ns;
	work_ns = cpu_ns - ex->sp_begin_cpu_ns;
	if (work_ns > wall_ns)
		work_ns = wall_ns;
	/* The host was productive work/wall of the time: the work done at the levels in
	 * effect meanwhile is that share of their progress; the rest is done now. */
	base = ti_sp_progress(ex, now_ns);
	done = wall_ns > 0 ? (base - ex->sp_p0_ns) * (double)work_ns / (double)wall_ns : 0.0;
	left = (double)work_ns - done;
	while (!ex->stopped) {
		double rest = left - (ti_sp_progress(ex, now_ns) - base);
		int64_t due_ns;
		struct timespec ts;

		if (rest <= 0.0)
			break;
		/* done at the current clock by due_ns; a switch meanwhile wakes us early */
		due_ns = now_ns + (int64_t)(rest / ti_sp_rate(ex)) + 1;
		ts.tv_sec = (time_t)(due_ns / 1000000000);
		ts.tv_nsec = (long)(due_ns % 1000000000);
		pthread_cond_timedwait(&ex->standin_cv, &ex->mu, &ts); /* 0 or ETIMEDOUT */
		ti_run_deferred(ex);
		now_ns = ti_clock_ns();
	}
	ex->standin_graphs++;
	ex->standin_waited_ns += now_ns - start_ns;
	ti_unlock(ex);
	return now_ns - start_ns;
}

TI_API void ti_exec_standin_status(struct ti_exec *ex, uint64_t *graphs, int64_t *waited_ns)
{
	if (ex == NULL || graphs == NULL || waited_ns == NULL)
		return;
	ti_lock(ex);
	*graphs = ex->standin_graphs;
	*waited_ns = ex->standin_waited_ns;
	ti_unlock(ex);
}

/* ---- ABI checks ----------------------------------------------------------------- */

struct ti_abi_field {
	const char *type;
	const char *name;
	size_t offset;
};

#define TI_F(s, f) { #s, #f, offsetof(struct s, f) }

static const struct ti_abi_field ti_abi_fields[] = {
	TI_F(ti_switch, key),	     TI_F(ti_switch, expect_ns),  TI_F(ti_switch, anchor),
	TI_F(ti_switch, level),	     TI_F(ti_plan, graph),	  TI_F(ti_plan, predicted_ns),
	TI_F(ti_plan, margin_ns),    TI_F(ti_plan, gain),	  TI_F(ti_plan, first_level),
	TI_F(ti_plan, end_level),    TI_F(ti_plan, fallback_level), TI_F(ti_plan, n_nodes),
	TI_F(ti_plan, n_switches),   TI_F(ti_plan, after_graph),  TI_F(ti_plan, after_t0_ns),
	TI_F(ti_plan, switches),	  TI_F(ti_applied, t_ns),
	TI_F(ti_applied, freq_hz),   TI_F(ti_applied, cost_ns),	  TI_F(ti_applied, graph),
	TI_F(ti_applied, level),     TI_F(ti_applied, source),	  TI_F(ti_applied, node),
	TI_F(ti_applied, err),	     TI_F(ti_applied, due_ns),	  TI_F(ti_exec_config, n_levels),
	TI_F(ti_exec_config, log_capacity), TI_F(ti_exec_config, actuator),
	TI_F(ti_exec_config, initial_level), TI_F(ti_exec_config, initial_floor),
	TI_F(ti_exec_config, initial_ceiling), TI_F(ti_exec_config, record_cost_ns),
	TI_F(ti_exec_config, levels_hz),
	TI_F(ti_exec_config, path),  TI_F(ti_exec_config, values),
	TI_F(ti_exec_status, applied), TI_F(ti_exec_status, skipped),
	TI_F(ti_exec_status, mismatches), TI_F(ti_exec_status, late_plans),
	TI_F(ti_exec_status, log_overflow), TI_F(ti_exec_status, deferred),
	TI_F(ti_exec_status, defer_overflow), TI_F(ti_exec_status, plans_set),
	TI_F(ti_exec_status, failed_errno), TI_F(ti_exec_status, cur_level),
	TI_F(ti_exec_status, stopped), TI_F(ti_exec_status, timer_rt),
	TI_F(ti_exec_status, timer_wakes),
};

TI_API int64_t ti_exec_struct_size(const char *name)
{
	static const struct {
		const char *name;
		size_t size;
	} sizes[] = {
		{ "ti_switch", sizeof(struct ti_switch) },
		{ "ti_plan", sizeof(struct ti_plan) },
		{ "ti_applied", sizeof(struct ti_applied) },
		{ "ti_exec_config", sizeof(struct ti_exec_config) },
		{ "ti_exec_status", sizeof(struct ti_exec_status) },
	};
	size_t i;

	if (name == NULL)
		return -1;
	for (i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		if (strcmp(sizes[i].name, name) == 0)
			return (int64_t)sizes[i].size;
	}
	return -1;
}

TI_API int64_t ti_exec_field_offset(const char *name, const char *field)
{
	size_t i;

	if (name == NULL || field == NULL)
		return -1;
	for (i = 0; i < sizeof(ti_abi_fields) / sizeof(ti_abi_fields[0]); i++) {
		if (strcmp(ti_abi_fields[i].type, name) == 0 &&
		    strcmp(ti_abi_fields[i].name, field) == 0)
			return (int64_t)ti_abi_fields[i].offset;
	}
	return -1;
}

/* ---- benchmarks ----------------------------------------------------------------- */

TI_API void ti_exec_bench_nodes(struct ti_exec *ex, int32_t first, uint32_t n, bool ask,
				int64_t *out_ns)
{
	uint32_t i;

	if (ex == NULL || out_ns == NULL)
		return;
	for (i = 0; i < n; i++) {
		int64_t t = ti_clock_ns();

		ti_exec_on_node(ex, first + (int32_t)i, ask, t);
		out_ns[i] = ti_clock_ns() - t;
	}
}

TI_API void ti_exec_bench_eval(void *tensor, void *hook, uint32_t n, int64_t *out_ns)
{
	uint32_t i;

	if (tensor == NULL || hook == NULL || out_ns == NULL)
		return;
	for (i = 0; i < n; i++) {
		int64_t t = ti_clock_ns();

		if (ti_hook_eval(tensor, true, hook))
			ti_hook_eval(tensor, false, hook);
		out_ns[i] = ti_clock_ns() - t;
	}
}
