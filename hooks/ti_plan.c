// SPDX-License-Identifier: MIT
/*
 * ti_plan: the tmpc planner's per-node arithmetic. See ti_plan.h.
 *
 * In numpy these passes cost ~300 us of a gemma decode graph's ~0.6-1 ms plan (about
 * thirty whole-array operations over 600-800 nodes, each paying numpy's call overhead
 * and a pass over memory); here each is one loop. Every expression follows its numpy
 * twin's order of operations, so the two agree to rounding of the sums.
 */
#include "ti_plan.h"

#include <math.h>

size_t ti_plan_nodes_size(void)
{
	return sizeof(struct ti_plan_nodes);
}

static int ti_plan_nodes_ok(const struct ti_plan_nodes *nodes)
{
	if (!nodes || nodes->n == 0)
		return 0;
	if (!nodes->c_stride || !nodes->m_stride || !nodes->launch_stride)
		return 0;
	return nodes->c_ns && nodes->m_ns && nodes->launch;
}

/* Extra DRAM time at clock f_hz (model.PhaseModel._coupling). */
static double ti_plan_coupling(double f_hz, double f_max_hz, const double *levels_hz,
			       const double *extra, size_t n_levels)
{
	double v = f_hz * 1.0005;
	size_t i = 0;

	if (!extra)
		return f_max_hz / f_hz - 1.0;
	/* searchsorted(levels, v, side="right") - 1, floored at 0 */
	while (i < n_levels && levels_hz[i] <= v)
		i++;
	return extra[i > 0 ? i - 1 : 0];
}

/* np.interp(x, seg_t, integral) over the clock's integral; *k only moves forward. */
static double ti_plan_integral_at(double x, const double *seg_t, const double *integral,
				  size_t n_seg, size_t *k)
{
	size_t j = *k;
	double slope;

	if (x >= seg_t[n_seg])
		return integral[n_seg];
	if (x <= seg_t[0])
		return integral[0];
	while (j + 1 < n_seg && x >= seg_t[j + 1])
		j++;
	*k = j;
	if (x == seg_t[j])
		return integral[j];
	slope = (integral[j + 1] - integral[j]) / (seg_t[j + 1] - seg_t[j]);
	return slope * (x - seg_t[j]) + integral[j];
}

int ti_plan_observe(const struct ti_plan_nodes *nodes, const double *starts_ns,
		    const double *ends_ns, const double *seg_t, const double *seg_hz,
		    size_t n_seg, const double *theta, double f_max_hz,
		    const double *levels_hz, size_t n_levels, const double *coupling_hz,
		    const double *extra, size_t n_coupling, double *x, double *level_ns,
		    double *min_hz)
{
	/* the clock's integral at each boundary: at most this many switches in a graph */
	double integral[TI_PLAN_MAX_SEG + 1];
	size_t i, k_lo = 0, k_hi = 0, k_at = 0;
	double th_c, th_m, th_x, th_o, th_d, lowest = INFINITY;

	if (!ti_plan_nodes_ok(nodes) || !starts_ns || !ends_ns || !seg_t || !seg_hz ||
	    n_seg == 0 || n_seg > TI_PLAN_MAX_SEG || !theta || !levels_hz || n_levels == 0 || !x ||
	    !level_ns || !min_hz || !(f_max_hz > 0.0) || (extra && (!coupling_hz || !n_coupling)))
		return TI_PLAN_EINVAL;
	th_c = theta[0];
	th_m = theta[1];
	th_x = theta[2];
	th_o = theta[3];
	th_d = theta[4];
	integral[0] = 0.0;
	for (i = 0; i < n_seg; i++)
		integral[i + 1] = integral[i] + (seg_t[i + 1] - seg_t[i]) * seg_hz[i];
	for (i = 0; i < TI_PLAN_THETA; i++)
		x[i] = 0.0;
	for (i = 0; i < n_levels; i++)
		level_ns[i] = 0.0;

	for (i = 0; i < nodes->n; i++) {
		double s = starts_ns[i], e = ends_ns[i], span = e - s, f;
		double c = nodes->c_ns[i * nodes->c_stride];
		double m = nodes->m_ns[i * nodes->m_stride];
		double launch = nodes->launch[i * nodes->launch_stride];
		double ratio, cf, md, a, b, hi, lo, floor_ns;
		size_t lv = 0;
		int roof, comp;

		/* tmpc.TubeMPC._mean_hz: the time-weighted mean clock over [s, e] */
		if (n_seg == 1) {
			f = seg_hz[0]; /* no switch landed inside the graph */
		} else if (span > 0.0) {
			double up = ti_plan_integral_at(e, seg_t, integral, n_seg, &k_hi);
			double down = ti_plan_integral_at(s, seg_t, integral, n_seg, &k_lo);

			f = (up - down) / (span > 1.0 ? span : 1.0);
		} else {
			/* the clock in effect at s: searchsorted(seg_t, s, "left") - 1 */
			while (k_at < n_seg && seg_t[k_at] < s)
				k_at++;
			f = seg_hz[k_at > 0 ? k_at - 1 : 0];
		}
		if (f < lowest)
			lowest = f;

		/* tmpc.TubeMPC._note_levels: the level at or above f (0.1% tolerance) */
		while (lv < n_levels && levels_hz[lv] < f * 0.999)
			lv++;
		level_ns[lv < n_levels ? lv : n_levels - 1] += span;

		/* model.PhaseModel.features at this node's clock */
		ratio = f_max_hz / f;
		cf = c * ratio;
		md = m * ti_plan_coupling(f, f_max_hz, coupling_hz, extra, n_coupling);
		a = th_c * cf;
		b = th_m * m + th_d * md;
		comp = a >= b;
		lo = a < b ? a : b;
		hi = a > b ? a : b;
		floor_ns = th_o * TI_PLAN_LAUNCH_NS * launch;
		roof = !(floor_ns > hi + th_x * lo && launch > 0.0);
		if (roof) {
			if (comp)
				x[0] += cf;
			else {
				x[1] += m;
				x[4] += md;
			}
			x[2] += lo;
		} else {
			x[3] += launch;
		}
	}
	x[3] *= TI_PLAN_LAUNCH_NS;
	*min_hz = lowest;
	return TI_PLAN_OK;
}

int ti_plan_tabulate(const struct ti_plan_nodes *nodes, const double *theta,
		     const double *ratio, const double *coupling, const double *busy_w,
		     const double *idle_w, size_t n_levels, double time_scale,
		     double host_ns, const double *block_host, const int64_t *edges,
		     size_t n_blocks, double *kernel_ns, double *graph_ns, double *energy,
		     double *block_ns, double *block_energy, const double *worst, size_t seen,
		     double *safe_graph_ns, double *safe_energy, double *safe_block_ns,
		     double *safe_block_energy)
{
	size_t i, l, blk;
	double launches = 0.0, per_launch, floor_unit;
	double a_k[TI_PLAN_MAX_LEVELS], b_k[TI_PLAN_MAX_LEVELS];

	if (!ti_plan_nodes_ok(nodes) || !theta || !ratio || !coupling || !busy_w ||
	    !idle_w || n_levels == 0 || n_levels > TI_PLAN_MAX_LEVELS || !edges || n_blocks == 0 ||
	    !kernel_ns || !graph_ns || !energy || !block_ns || !block_energy)
		return TI_PLAN_EINVAL;
	if (edges[0] != 0 || edges[n_blocks] != (int64_t)nodes->n)
		return TI_PLAN_EINVAL;
	if (!worst || seen > n_levels - 1 || !safe_graph_ns || !safe_energy || !safe_block_ns ||
	    !safe_block_energy)
		seen = 0, safe_graph_ns = NULL;
	for (blk = 0; blk < n_blocks; blk++)
		if (edges[blk + 1] <= edges[blk])
			return TI_PLAN_EINVAL;

	for (l = 0; l < n_levels; l++) {
		a_k[l] = theta[0] * ratio[l];
		b_k[l] = theta[1] + theta[4] * coupling[l];
		graph_ns[l] = 0.0;
	}
	for (i = 0; i < nodes->n; i++)
		launches += nodes->launch[i * nodes->launch_stride];
	per_launch = host_ns / (launches > 1.0 ? launches : 1.0);
	floor_unit = theta[3] * TI_PLAN_LAUNCH_NS;

	for (blk = 0; blk < n_blocks; blk++) {
		double *bn = block_ns + blk * n_levels;
		double *be = block_energy + blk * n_levels;
		double block_launch = 0.0, host_share;

		for (l = 0; l < n_levels; l++)
			bn[l] = 0.0;
		for (i = (size_t)edges[blk]; i < (size_t)edges[blk + 1]; i++) {
			double c = nodes->c_ns[i * nodes->c_stride];
			double m = nodes->m_ns[i * nodes->m_stride];
			double launch = nodes->launch[i * nodes->launch_stride];
			double floor_ns = floor_unit * launch;
			double *row = kernel_ns + i * n_levels;

			block_launch += launch;
			for (l = 0; l < n_levels; l++) {
				double a = c * a_k[l], b = m * b_k[l];
				double hi = (a > b ? a : b) + theta[2] * (a < b ? a : b);
				double t = hi > floor_ns ? hi : floor_ns;

				row[l] = t * time_scale;
				bn[l] += row[l];
			}
		}
		host_share = block_host ? block_host[blk] : block_launch * per_launch;
		if (safe_graph_ns) {
			/* the levels below `seen` at their worst case: the top level's kernel
			 * time times worst[l], never less than the model's */
			double *sn = safe_block_ns + blk * n_levels;
			double *se = safe_block_energy + blk * n_levels;
			double top_k = bn[n_levels - 1];

			for (l = 0; l < n_levels; l++) {
				double k = bn[l];

				if (l < seen && top_k * worst[l] > k)
					k = top_k * worst[l];
				safe_graph_ns[l] = (blk ? safe_graph_ns[l] : 0.0) + k;
				se[l] = busy_w[l] * k + idle_w[l] * host_share;
				sn[l] = k + host_share;
			}
		}
		for (l = 0; l < n_levels; l++) {
			graph_ns[l] += bn[l];
			be[l] = busy_w[l] * bn[l] + idle_w[l] * host_share;
			bn[l] += host_share;
		}
	}
	for (l = 0; l < n_levels; l++) {
		energy[l] = busy_w[l] * graph_ns[l] + idle_w[l] * host_ns;
		graph_ns[l] += host_ns;
		if (safe_graph_ns) {
			safe_energy[l] = busy_w[l] * safe_graph_ns[l] + idle_w[l] * host_ns;
			safe_graph_ns[l] += host_ns;
		}
	}
	return TI_PLAN_OK;
}

int ti_plan_horizon(const double *energy, const double *time_ns, size_t n_seg,
		    size_t n_levels, const double *penalty, double budget_ns,
		    double first_budget_ns, int64_t *levels, double *used_ns)
{
	size_t n_combos = 1, i, j, best = 0, fastest = 0;
	double best_e = INFINITY, fastest_d = INFINITY, best_d = 0.0;
	size_t digit[TI_PLAN_MAX_HORIZON] = { 0 }; /* the combination's levels */
	int found = 0;

	if (!energy || !time_ns || !penalty || !levels || !used_ns || n_seg == 0 ||
	    n_seg > TI_PLAN_MAX_HORIZON || n_levels == 0 || n_levels > TI_PLAN_MAX_LEVELS)
		return TI_PLAN_EINVAL;
	for (i = 0; i < n_seg; i++) {
		if (n_combos > TI_PLAN_MAX_COMBOS / n_levels)
			return TI_PLAN_EINVAL;
		n_combos *= n_levels;
	}
	for (j = 0; j < n_combos; j++) {
		double e = 0.0, d = 0.0;

		/* outer sums in numpy's order: ((x0 + x1) + x2) ... */
		for (i = 0; i < n_seg; i++) {
			e += energy[i * n_levels + digit[i]];
			d += time_ns[i * n_levels + digit[i]];
		}
		e += penalty[j];
		if (d < fastest_d) {
			fastest_d = d;
			fastest = j;
		}
		if (d <= budget_ns && time_ns[digit[0]] <= first_budget_ns && e < best_e) {
			best_e = e;
			best = j;
			best_d = d;
			found = 1;
		}
		/* the next combination: the last graph's level varies fastest */
		for (i = n_seg; i-- > 0;) {
			if (++digit[i] < n_levels)
				break;
			digit[i] = 0;
		}
	}
	if (!found) {
		best = fastest;
		best_d = fastest_d;
	}
	for (i = n_seg; i-- > 0;) {
		levels[i] = (int64_t)(best % n_levels);
		best /= n_levels;
	}
	*used_ns = best_d;
	return found;
}

/* The level of one block at a price: the first minimum of energy + price x time. */
static size_t ti_plan_cheapest(const double *e, const double *t, size_t n_levels,
			       double price)
{
	size_t l, arg = 0;
	double best = e[0] + price * t[0];

	for (l = 1; l < n_levels; l++) {
		double v = e[l] + price * t[l];

		if (v < best) {
			best = v;
			arg = l;
		}
	}
	return arg;
}

int ti_plan_block_levels(const double *block_energy, const double *block_ns,
			 size_t n_blocks, size_t n_levels, const double *prices,
			 size_t n_prices, double cap_ns, int64_t *levels, double *used_ns)
{
	size_t choice[TI_PLAN_MAX_BLOCKS], prev[TI_PLAN_MAX_BLOCKS];
	size_t p, b;
	double tot = 0.0, left;

	if (!block_energy || !block_ns || !prices || !levels || !used_ns || n_blocks == 0 ||
	    n_blocks > TI_PLAN_MAX_BLOCKS || n_levels == 0 || n_prices == 0)
		return TI_PLAN_EINVAL;
	for (p = 0; p < n_prices; p++) {
		tot = 0.0;
		for (b = 0; b < n_blocks; b++) {
			const double *e = block_energy + b * n_levels;
			const double *t = block_ns + b * n_levels;

			if (p > 0)
				prev[b] = choice[b];
			choice[b] = ti_plan_cheapest(e, t, n_levels, prices[p]);
			tot += t[choice[b]];
		}
		if (tot <= cap_ns)
			break;
	}
	if (p == n_prices)
		return 0;
	if (p > 0) {
		/* the previous (cheaper) price's blocks, in order, while the time allows */
		double acc = 0.0;

		left = cap_ns - tot;
		for (b = 0; b < n_blocks; b++) {
			double dt = block_ns[b * n_levels + prev[b]] - block_ns[b * n_levels + choice[b]];

			acc += dt;
			if (!(acc <= left))
				break;
			choice[b] = prev[b];
		}
	}
	tot = 0.0;
	for (b = 0; b < n_blocks; b++) {
		levels[b] = (int64_t)choice[b];
		tot += block_ns[b * n_levels + choice[b]];
	}
	*used_ns = tot;
	return 1;
}

int ti_plan_rls(const double *theta, const double *P, const double *x, double y_ns,
		double forget, const double *th_min, double th_max, double p0_trace,
		double *theta_out, double *P_out, double *err)
{
	enum { N = TI_PLAN_THETA };
	double xs[N], px[N], k[N], den = 0.0, fit = 0.0, inv, tr = 0.0;
	size_t i, j;

	if (!theta || !P || !x || !th_min || !theta_out || !P_out || !err ||
	    !(y_ns > 0.0) || !(forget > 0.0))
		return TI_PLAN_EINVAL;
	for (i = 0; i < N; i++)
		xs[i] = x[i] / y_ns;
	for (i = 0; i < N; i++) {
		px[i] = 0.0;
		for (j = 0; j < N; j++)
			px[i] += P[i * N + j] * xs[j];
	}
	for (i = 0; i < N; i++) {
		den += xs[i] * px[i];
		fit += xs[i] * theta[i];
	}
	den += forget;
	*err = 1.0 - fit;
	for (i = 0; i < N; i++) {
		double v;

		k[i] = px[i] / den;
		v = theta[i] + k[i] * *err;
		v = v > th_min[i] ? v : th_min[i];
		theta_out[i] = v < th_max ? v : th_max;
	}
	inv = 1.0 / forget;
	for (i = 0; i < N; i++) {
		for (j = 0; j < N; j++)
			P_out[i * N + j] = (P[i * N + j] - k[i] * px[j]) * inv;
		tr += P_out[i * N + i];
	}
	/* bound covariance windup in directions no observation excites */
	if (tr > p0_trace) {
		double scale = p0_trace / tr;

		for (i = 0; i < N * N; i++)
			P_out[i] *= scale;
	}
	return TI_PLAN_OK;
}

int ti_plan_layout(const double *kernel_ns, const double *host_ns, size_t n, size_t n_levels,
		   const double *block_ns, const int64_t *edges, size_t nb, const int64_t *levels,
		   double *block_end_ns, double *share)
{
	double acc = 0.0, total;
	size_t i, j;

	if (!block_ns || !edges || !levels || !block_end_ns || nb == 0 || n_levels == 0 ||
	    n_levels > TI_PLAN_MAX_LEVELS || edges[0] != 0 || edges[nb] != (int64_t)n)
		return TI_PLAN_EINVAL;
	if (share && (!kernel_ns || !host_ns || n == 0))
		return TI_PLAN_EINVAL;
	for (j = 0; j < nb; j++) {
		if (levels[j] < 0 || (size_t)levels[j] >= n_levels || edges[j + 1] < edges[j])
			return TI_PLAN_EINVAL;
		/* np.cumsum: one running sum, left to right */
		acc += block_ns[j * n_levels + (size_t)levels[j]];
		block_end_ns[j] = acc;
	}
	if (!share)
		return TI_PLAN_OK;
	acc = 0.0;
	for (j = 0; j < nb; j++) {
		size_t lv = (size_t)levels[j];

		for (i = (size_t)edges[j]; i < (size_t)edges[j + 1]; i++) {
			acc += kernel_ns[i * n_levels + lv] + host_ns[i];
			share[i] = acc;
		}
	}
	/* Python's max(total, 1e-9): the first unless the second is larger */
	total = 1e-9 > share[n - 1] ? 1e-9 : share[n - 1];
	for (i = 0; i < n; i++)
		share[i] /= total;
	return TI_PLAN_OK;
}

int ti_plan_dwell(const int64_t *levels_in, const double *block_ns, size_t nb, size_t n_levels,
		  double min_ns, int64_t *levels)
{
	double t[TI_PLAN_MAX_BLOCKS], dur;
	size_t i, j, start;
	int changed = 0;

	if (!levels_in || !block_ns || !levels || nb == 0 || nb > TI_PLAN_MAX_BLOCKS ||
	    n_levels == 0 || n_levels > TI_PLAN_MAX_LEVELS)
		return TI_PLAN_EINVAL;
	for (i = 0; i < nb; i++) {
		if (levels_in[i] < 0 || (size_t)levels_in[i] >= n_levels)
			return TI_PLAN_EINVAL;
		levels[i] = levels_in[i];
		t[i] = block_ns[i * n_levels + (size_t)levels[i]];
	}
	if (nb < 2 || !(min_ns > 0.0))
		return 0;
	/* tmpc_solver.dwell_merge, the same operations in the same order */
	start = 0;
	dur = t[0];
	for (i = 1; i < nb; i++) {
		int64_t nw;

		if (levels[i] == levels[start]) {
			dur += t[i];
			continue;
		}
		if (dur >= min_ns) {
			start = i;
			dur = t[i];
			continue;
		}
		nw = levels[start] > levels[i] ? levels[start] : levels[i];
		if (levels[start] != nw) {
			for (j = start; j < i; j++) {
				levels[j] = nw;
				t[j] = block_ns[j * n_levels + (size_t)nw];
			}
			dur = 0.0;
			for (j = start; j < i; j++)
				dur += t[j];
		}
		levels[i] = nw;
		t[i] = block_ns[i * n_levels + (size_t)nw];
		dur += t[i];
		changed = 1;
	}
	while (dur < min_ns && start > 0) {
		size_t p0 = start - 1;
		int64_t nw = levels[start - 1] > levels[start] ? levels[start - 1] : levels[start];

		while (p0 > 0 && levels[p0 - 1] == levels[start - 1])
			p0--;
		for (j = p0; j < nb; j++) {
			if (levels[j] != nw) {
				levels[j] = nw;
				t[j] = block_ns[j * n_levels + (size_t)nw];
			}
		}
		start = p0;
		dur = 0.0;
		for (j = p0; j < nb; j++)
			dur += t[j];
		changed = 1;
	}
	return changed;
}
