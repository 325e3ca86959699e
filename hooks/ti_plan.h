/* SPDX-License-Identifier: MIT */
/*
 * ti_plan: the tmpc planner's per-node arithmetic, done once per graph on the planner
 * thread (never on the executor's path). Each function is the exact twin of a numpy
 * reference in turboinfer_llama/control/ (named below); the Python side falls back to
 * that reference when this library was not built, and tests compare the two.
 *
 * Pure functions: arrays in, arrays out. No allocation, no globals, no locking; the
 * caller owns every buffer and sizes it as documented.
 */
#ifndef TI_PLAN_H
#define TI_PLAN_H

#include <stddef.h>
#include <stdint.h>

#define TI_API __attribute__((visibility("default")))

#define TI_PLAN_THETA 5 /* (th_c, th_m, th_x, th_o, th_d): control/model.py PhaseModel */
#define TI_PLAN_LAUNCH_NS 1000.0 /* unit of th_o (model._LAUNCH_NS) */
#define TI_PLAN_MAX_SEG 2048     /* clock segments inside one graph */
#define TI_PLAN_MAX_LEVELS 64
#define TI_PLAN_MAX_BLOCKS 256
#define TI_PLAN_MAX_HORIZON 16
#define TI_PLAN_MAX_COMBOS (1u << 20)

enum ti_plan_status {
	TI_PLAN_OK = 0,
	TI_PLAN_EINVAL = -22, /* a size is zero where it may not be, or a bad table */
};

/*
 * One graph's nodes, as the planner sees them: compute and memory time at the top
 * clock (ns) and launch flags (1.0 a kernel, 0.0 a no-op), n entries each, node i of
 * each at [i * stride] (strides in doubles: the ingest hands out columns of one
 * (n, 3) array).
 */
struct ti_plan_nodes {
	const double *c_ns;
	const double *m_ns;
	const double *launch;
	size_t n;
	size_t c_stride;
	size_t m_stride;
	size_t launch_stride;
};

/*
 * The clock a graph ran at and what it teaches the model
 * (tmpc.TubeMPC._mean_hz + _note_levels + model.PhaseModel.features).
 *
 * starts_ns/ends_ns: each node's start and end (n each, starts ascending). The clock
 * is piecewise constant: seg_hz[k] from seg_t[k] to seg_t[k+1] (n_seg + 1 boundaries
 * seg_t, n_seg clocks; seg_t[0] <= starts_ns[0], seg_t[n_seg] > ends_ns[n - 1];
 * n_seg <= TI_PLAN_MAX_SEG). One segment: every node ran at seg_hz[0].
 * levels_hz (n_levels, ascending): the controller's levels, for level_ns below.
 * coupling_hz/extra (n_coupling, ascending): the levels of the device's DRAM vote
 * table and each one's extra DRAM time (mem slowdown - 1); extra == NULL selects the
 * smooth shape f_max/f - 1.
 *
 * Out: x[TI_PLAN_THETA] the summed regressors at theta; level_ns[n_levels] the time
 * spent at each level (a node's mean clock rounded up to a level, 0.1% tolerance);
 * *min_hz the lowest mean clock of any node.
 */
TI_API int ti_plan_observe(const struct ti_plan_nodes *nodes, const double *starts_ns,
			   const double *ends_ns, const double *seg_t, const double *seg_hz,
			   size_t n_seg, const double *theta, double f_max_hz,
			   const double *levels_hz, size_t n_levels, const double *coupling_hz,
			   const double *extra, size_t n_coupling, double *x, double *level_ns,
			   double *min_hz);

/*
 * A phase's template at every level (model.PhaseModel.times_at_levels +
 * tmpc_solver.PhaseTemplate.tabulate).
 *
 * ratio[l] = f_max / levels_hz[l]; coupling[l] the level's extra DRAM time; busy_w,
 * idle_w per level; edges: n_blocks + 1 node ordinals (0 = edges[0] < ... =
 * edges[n_blocks] = n). Each node's kernel time at level l is
 * max(max(a, b) + th_x min(a, b), th_o launch 1 us) with a = c th_c ratio[l],
 * b = m (th_m + th_d coupling[l]), times time_scale; host_ns (the graph's host time) is
 * placed in the blocks as block_host gives (n_blocks values summing to host_ns: the
 * measured gaps before each block's nodes), or shared out by launches where block_host
 * is NULL.
 *
 * Out (row-major): kernel_ns[n][n_levels]; graph_ns[n_levels], energy[n_levels]
 * (W x ns); block_ns[n_blocks][n_levels], block_energy[n_blocks][n_levels].
 * With worst (n_levels values) and the safe_* outputs (same shapes as graph_ns,
 * energy, block_ns, block_energy): the same tables with each block's kernel time at
 * the levels below `seen` raised to at least its top-level kernel time times
 * worst[l] (tmpc's cautious tables for levels not run yet); seen 0 copies them.
 */
TI_API int ti_plan_tabulate(const struct ti_plan_nodes *nodes, const double *theta,
			    const double *ratio, const double *coupling, const double *busy_w,
			    const double *idle_w, size_t n_levels, double time_scale,
			    double host_ns, const double *block_host, const int64_t *edges,
			    size_t n_blocks, double *kernel_ns, double *graph_ns, double *energy,
			    double *block_ns, double *block_energy, const double *worst,
			    size_t seen, double *safe_graph_ns, double *safe_energy,
			    double *safe_block_ns, double *safe_block_energy);

/*
 * The cheapest combination of per-graph levels over a horizon of n_seg graphs
 * (tmpc_solver.solve_horizon): every one of n_levels ** n_seg combinations, in
 * row-major order (the first graph's level varies slowest). energy, time_ns:
 * n_seg x n_levels; penalty: per combination. A combination fits when its total time
 * is <= budget_ns and its first graph's time <= first_budget_ns (INFINITY: no bound).
 * Out: levels[n_seg] of the cheapest that fits, else of the fastest; *used_ns its
 * time. Returns 1 when one fits, 0 when none does, TI_PLAN_EINVAL on bad sizes.
 */
TI_API int ti_plan_horizon(const double *energy, const double *time_ns, size_t n_seg,
			   size_t n_levels, const double *penalty, double budget_ns,
			   double first_budget_ns, int64_t *levels, double *used_ns);

/*
 * Per-block levels under a time cap (tmpc_solver.block_levels), by a price on time:
 * for each price (ascending), each block takes the level minimising energy + price x
 * time (the first on ties); the first price whose blocks fit cap_ns wins, and the
 * previous price's blocks are then taken in order while the time left allows.
 * block_energy, block_ns: n_blocks x n_levels. Out: levels[n_blocks], *used_ns.
 * Returns 1 when a price fits, 0 when none does (levels untouched).
 */
TI_API int ti_plan_block_levels(const double *block_energy, const double *block_ns,
				size_t n_blocks, size_t n_levels, const double *prices,
				size_t n_prices, double cap_ns, int64_t *levels, double *used_ns);

/*
 * Per-block levels with no run of one level shorter than min_ns
 * (tmpc_solver.dwell_merge, the same operations in the same order): one pass left to
 * right, a short run joins the next block at the higher of the two levels; a short
 * last run joins the run before it. levels_in, levels: nb values; block_ns:
 * [nb][n_levels]. Returns 1 when a level changed, 0 when not, < 0 on bad arguments.
 */
TI_API int ti_plan_dwell(const int64_t *levels_in, const double *block_ns, size_t nb,
			 size_t n_levels, double min_ns, int64_t *levels);

/*
 * A block plan laid out over its graph (tmpc.TubeMPC._plan_next and _block_switches,
 * the same operations in the same order): node i of block j (edges[j] <= i <
 * edges[j + 1], edges[0] = 0, edges[nb] = n) runs at level levels[j] and takes
 * kernel_ns[i][levels[j]] + host_ns[i] (kernel_ns: [n][n_levels]).
 *
 * Out: block_end_ns[nb], the running sum of block_ns[j][levels[j]] (block_ns:
 * [nb][n_levels]); share[n] (NULL: not wanted), the running sum of the nodes' times
 * over their total (at least 1e-9): where in the graph's time each node ends.
 * Returns 0, or TI_PLAN_EINVAL on bad sizes, edges or levels.
 */
TI_API int ti_plan_layout(const double *kernel_ns, const double *host_ns, size_t n,
			  size_t n_levels, const double *block_ns, const int64_t *edges,
			  size_t nb, const int64_t *levels, double *block_end_ns, double *share);

/*
 * One step of recursive least squares with forgetting on the time model
 * (model.PhaseModel.update): regressors x (TI_PLAN_THETA) took y_ns, the row scaled by
 * 1 / y_ns; theta is bounded to [th_min, th_max] and the covariance's trace to
 * p0_trace. Reads theta, P (TI_PLAN_THETA squared, row-major); writes theta_out,
 * P_out (may not alias the inputs) and *err (the relative residual before the step).
 */
TI_API int ti_plan_rls(const double *theta, const double *P, const double *x, double y_ns,
		       double forget, const double *th_min, double th_max, double p0_trace,
		       double *theta_out, double *P_out, double *err);

/* sizeof(struct ti_plan_nodes), checked from Python. */
TI_API size_t ti_plan_nodes_size(void);

#endif /* TI_PLAN_H */
