// SPDX-License-Identifier: MIT
/*
 * ti_hooks: the native cb_eval for llama.cpp's graph scheduler. See ti_hooks.h.
 *
 * Hot path (ti_hook_eval): one clock read, up to three accessor calls, one fixed-size
 * record copy into a preallocated ring. It never blocks, never allocates and never
 * touches Python: llama.cpp calls it directly through the function pointer.
 */
#define _POSIX_C_SOURCE 200809L

#include "ti_hooks.h"
#include "ti_exec.h"

#include <errno.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TI_LAYER_OUT_PREFIX "l_out-" /* llama.cpp's name for a layer's output node */
#define TI_MAX_CAPACITY (1u << 22)   /* 4 Mi records, about 1 GB of ring */
#define TI_TPL_MAX (1u << 15)        /* compact mode: nodes a template holds (8.7 MB) */

struct ti_hook {
	/* Immutable after ti_hook_create; read by both sides without ordering. */
	struct ti_record *ring;
	uint32_t capacity;
	enum ti_granularity granularity;
	struct ti_ggml_api api;
	struct ti_layout layout;

	/*
	 * Ring indices, free-running (slot = index % capacity).
	 * head: written only by the producer (the compute thread inside llama_decode),
	 *       stored with release after the slot is filled; the consumer loads it with
	 *       acquire before copying slots out.
	 * tail: written only by the consumer (Python's drain, serialised by a Python
	 *       lock), stored with release after the copy; the producer loads it with
	 *       acquire before reusing a slot.
	 */
	_Atomic uint64_t head;
	_Atomic uint64_t tail;

	/* Incremented only by the producer (relaxed); read by anyone. */
	_Atomic uint64_t overflow;

	/*
	 * Written by ti_hook_begin_graph between decodes, read by the producer during a
	 * decode. The caller orders them (begin_graph returns before llama_decode starts),
	 * so relaxed accesses suffice; atomics keep them free of data races.
	 */
	_Atomic uint64_t graph;
	_Atomic int32_t next_node;

	/* Producer only: index of the last asked node, for its done record. */
	int32_t cur_node;

	/* Set once by ti_hook_disable from any thread; checked first by the producer. */
	_Atomic bool disabled;

	/*
	 * Compact repeats (ti_hook_set_compact, TI_GRAPH only). Owned by the producer side:
	 * the thread that calls llama_decode (the callback runs on it) and, between its
	 * decodes, ti_hook_begin_graph, ti_hook_end_graph, ti_hook_flush and
	 * ti_hook_copy_template. Nothing here is touched by the ring's consumer otherwise.
	 *
	 * tpl[0..tpl_n): the last graph's records (the template), key[i] a hash of what
	 * tpl[i] holds but t_ns and graph, read from its tensor (ti_tensor_key), which a
	 * repeat's node i must match, t_rep[i] the ask time
	 * of node i in the current graph while it repeats the template. tpl_gen counts
	 * template changes. cur_n: asks in the current graph. repeating: the current
	 * graph's asks so far match the template and are held here, not in the ring.
	 * held: a closed graph (seq held_graph) repeated the whole template; its times wait
	 * for ti_hook_end_graph, or go to the ring as records at the next begin or flush.
	 */
	_Atomic bool compact;
	struct ti_record *tpl;
	uint64_t *key;
	int64_t *t_rep;
	const void **tpl_ptr; /* tpl[i]'s tensor: where a reused graph's node i must be */
	uint32_t tpl_cap;
	uint32_t tpl_n;
	uint64_t tpl_gen;
	uint32_t cur_n;
	bool open;
	bool repeating;
	bool held;
	uint64_t held_graph;

	/*
	 * llama.cpp's graph reuse (ti_hook_set_reuse_probe): when the context's reuse
	 * count went up by one since the last graph's first ask, llama.cpp computes the
	 * very graph it computed last (the same tensors, only inputs set), and a node at
	 * its template node's address is that node: no need to read the tensor. reused:
	 * the count at the last graph's first ask; single: the template came from one
	 * ubatch (its first node was not asked again); trusted: this graph is reused.
	 */
	ti_llama_perf_fn perf;
	const void *perf_ctx;
	int32_t reused;
	bool single;
	bool tpl_single;
	bool trusted;
	const void *first_ptr;
	/* asks told a repeat by address, by key, and recorded (ti_hook_compact_stats) */
	uint64_t n_by_address;
	uint64_t n_by_key;
	uint64_t n_recorded;

	/*
	 * The callback's own time (ti_hook_set_self_timing): set between decodes, read by
	 * the producer (relaxed); the sums are written only by the producer (relaxed load
	 * and store) and read by anyone.
	 */
	_Atomic bool self_timing;
	_Atomic int64_t self_ns;
	_Atomic uint64_t self_calls;

	/*
	 * The plan executor fed with every ask and done, or NULL. Set between decodes by
	 * ti_hook_set_executor (release), read by the producer (acquire).
	 */
	_Atomic(struct ti_exec *) exec;

	/*
	 * The planner's wake-up (ti_hook_wait_wake). wake_armed: stored non-zero between
	 * decodes by the engine thread (at ti_hook_wake_flag's address), exchanged to 0 by
	 * the producer at its next ask, which then posts wake_sem: the planner starts
	 * inside llama_decode, where the GIL is free, and the engine thread makes no system
	 * call for it. wake_sem: posted by the producer or by ti_hook_post_wake (any
	 * thread), waited on by one consumer; the caller keeps ti_hook_destroy after every
	 * wait has returned. wake_posts, wake_errors: the producer's posts and failed
	 * posts (written by the producer, relaxed; read by anyone).
	 */
	_Atomic int32_t wake_armed;
	sem_t wake_sem;
	bool wake_ok; /* sem_init succeeded (not where unnamed semaphores are missing) */
	_Atomic uint64_t wake_posts;
	_Atomic uint64_t wake_errors;
};

static int64_t ti_now_ns(void)
{
	struct timespec ts;

	/* CLOCK_MONOTONIC cannot fail on Linux; 0 marks a stamp we could not take. */
	if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0)
		return 0;
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Bounded copy that always NUL-terminates; a NULL source gives "". */
static void ti_copy_str(char *dst, const char *src, size_t cap)
{
	size_t i = 0;

	if (src != NULL) {
		for (; i + 1 < cap && src[i] != '\0'; i++)
			dst[i] = src[i];
	}
	dst[i] = '\0';
}

static void ti_read_shape(const void *tensor, const struct ti_layout *l, int64_t ne[4],
			  int32_t *type)
{
	const char *base = tensor;

	memcpy(ne, base + l->off_ne, 4 * sizeof(ne[0]));
	memcpy(type, base + l->off_type, sizeof(*type));
}

static void ti_fill_shape(struct ti_record *r, const void *tensor, const struct ti_layout *l)
{
	const void *src[2];

	ti_read_shape(tensor, l, r->ne, &r->type);
	r->flags |= TI_HAS_SHAPE;
	memcpy(src, (const char *)tensor + l->off_src, sizeof(src));
	if (src[0] != NULL) {
		ti_read_shape(src[0], l, r->src0_ne, &r->src0_type);
		r->flags |= TI_HAS_SRC0;
	}
	if (src[1] != NULL) {
		ti_read_shape(src[1], l, r->src1_ne, &r->src1_type);
		r->flags |= TI_HAS_SRC1;
	}
}

/* op and nbytes: the node's ggml_op_desc and ggml_nbytes, read once by the caller. */
static void ti_build(const struct ti_hook *h, struct ti_record *r, const void *tensor,
		     const char *name, const char *op, size_t nbytes, int32_t node,
		     enum ti_phase phase, int64_t t_ns)
{
	*r = (struct ti_record){
		.t_ns = t_ns,
		.graph = atomic_load_explicit(&h->graph, memory_order_relaxed),
		.nbytes = nbytes,
		.node = node,
		.type = -1,
		.src0_type = -1,
		.src1_type = -1,
		.phase = (uint8_t)phase,
	};
	ti_copy_str(r->op, op, sizeof(r->op));
	ti_copy_str(r->name, name, sizeof(r->name));
	if (h->layout.valid)
		ti_fill_shape(r, tensor, &h->layout);
}

/*
 * The next free slot (its index in *head), or NULL when the ring is full, counted as
 * overflow. ti_commit publishes it once filled.
 */
static struct ti_record *ti_slot(struct ti_hook *h, uint64_t *head)
{
	uint64_t tail = atomic_load_explicit(&h->tail, memory_order_acquire);

	*head = atomic_load_explicit(&h->head, memory_order_relaxed);
	if (*head - tail >= h->capacity) {
		atomic_fetch_add_explicit(&h->overflow, 1, memory_order_relaxed);
		return NULL;
	}
	return &h->ring[*head % h->capacity];
}

static void ti_commit(struct ti_hook *h, uint64_t head)
{
	atomic_store_explicit(&h->head, head + 1, memory_order_release);
}

/* Copies r into the next slot. */
static void ti_push_record(struct ti_hook *h, const struct ti_record *r)
{
	uint64_t head;
	struct ti_record *slot = ti_slot(h, &head);

	if (slot == NULL)
		return;
	*slot = *r;
	ti_commit(h, head);
}

/* Builds the record in place: the slot is the only copy. */
static void ti_push(struct ti_hook *h, const void *tensor, const char *name, int32_t node,
		    enum ti_phase phase, int64_t t_ns)
{
	uint64_t head;
	struct ti_record *slot = ti_slot(h, &head);

	if (slot == NULL)
		return;
	ti_build(h, slot, tensor, name, h->api.op_desc(tensor), h->api.nbytes(tensor), node,
		 phase, t_ns);
	ti_commit(h, head);
}

/* One step of a key's lane: a bijection of the lane for a fixed word, and of the word
 * for a fixed lane. */
#define TI_KEY_MUL 0xbf58476d1ce4e5b9u
static inline uint64_t ti_mix(uint64_t lane, uint64_t w)
{
	return (lane ^ w) * TI_KEY_MUL;
}

static inline uint64_t ti_rotl(uint64_t x, unsigned k)
{
	return (x << k) | (x >> (64 - k));
}

/*
 * A node's key: a 64-bit hash of what its record holds but t_ns and graph (the node
 * index, the op description's address, which names one static string, nbytes, the
 * name's bytes, and with a layout the shapes and types of the node and its two
 * sources), read straight from the tensor: no record is built. Four lanes keep the
 * multiplies independent; every step and the final fold are bijections of the lane
 * they change, so two nodes that differ in any one word always differ in key, and
 * nodes differing in several collide with probability ~2^-64. Two op descriptions
 * with the same text at two addresses only make a repeat look new (it is recorded).
 */
static uint64_t ti_tensor_key(const struct ti_hook *h, const void *tensor, const char *name,
			      const char *op, uint64_t nbytes, int32_t node)
{
	uint64_t a = 0x9e3779b97f4a7c15u, b = 0xc2b2ae3d27d4eb4fu;
	uint64_t c = 0x165667b19e3779f9u, d = 0x27d4eb2f165667c5u;
	uint64_t w = 0;
	size_t i;

	a = ti_mix(a, (uint64_t)(uintptr_t)op);
	b = ti_mix(b, nbytes);
	c = ti_mix(c, (uint64_t)(uint32_t)node);
	/* the name, word by word up to the word holding its NUL (a NULL name: none) */
	for (i = 0; name != NULL && i < TI_NAME_LEN; i += sizeof(w)) {
		memcpy(&w, name + i, sizeof(w)); /* ggml's name field is GGML_MAX_NAME bytes */
		d = ti_mix(d, w);
		if (memchr(&w, '\0', sizeof(w)) != NULL)
			break;
	}
	if (h->layout.valid) {
		const struct ti_layout *l = &h->layout;
		const char *base = tensor;
		const void *src[2];
		int64_t ne[4];
		int32_t type;
		int k;

		memcpy(ne, base + l->off_ne, sizeof(ne));
		memcpy(&type, base + l->off_type, sizeof(type));
		a = ti_mix(a, (uint64_t)ne[0]);
		b = ti_mix(b, (uint64_t)ne[1]);
		c = ti_mix(c, (uint64_t)ne[2]);
		d = ti_mix(d, (uint64_t)ne[3]);
		a = ti_mix(a, (uint64_t)(uint32_t)type);
		memcpy(src, base + l->off_src, sizeof(src));
		for (k = 0; k < 2; k++) {
			if (src[k] == NULL) {
				b = ti_mix(b, 0x5a5a5a5a5a5a5a5au + (uint64_t)k); /* absent */
				continue;
			}
			memcpy(ne, (const char *)src[k] + l->off_ne, sizeof(ne));
			memcpy(&type, (const char *)src[k] + l->off_type, sizeof(type));
			b = ti_mix(b, (uint64_t)ne[0]);
			c = ti_mix(c, (uint64_t)ne[1]);
			d = ti_mix(d, (uint64_t)ne[2]);
			a = ti_mix(a, (uint64_t)ne[3]);
			b = ti_mix(b, (uint64_t)(uint32_t)type);
		}
	}
	a ^= a >> 31;
	b ^= b >> 31;
	c ^= c >> 31;
	d ^= d >> 31;
	return a ^ ti_rotl(b, 16) ^ ti_rotl(c, 32) ^ ti_rotl(d, 48);
}

/* Pushes the first n template records as graph `graph`'s, with their held times. */
static void ti_unhold(struct ti_hook *h, uint32_t n, uint64_t graph)
{
	struct ti_record r;
	uint32_t i;

	for (i = 0; i < n; i++) {
		r = h->tpl[i];
		r.t_ns = h->t_rep[i];
		r.graph = graph;
		ti_push_record(h, &r);
	}
}

/* An ask in compact mode: held while the graph repeats the template, else recorded. */
static void ti_compact_ask(struct ti_hook *h, const void *tensor, int32_t node, int64_t t_ns)
{
	uint32_t i = h->cur_n;
	struct ti_record *r;
	const char *name, *op;
	uint64_t k, nbytes;

	if (i == 0) {
		h->first_ptr = tensor;
		h->single = true;
		h->trusted = false;
		if (h->perf != NULL) {
			int32_t now = h->perf(h->perf_ctx).n_reused;

			h->trusted = h->repeating && h->tpl_single && now == h->reused + 1;
			h->reused = now;
		}
	} else if (tensor == h->first_ptr) {
		h->single = false; /* another ubatch of this llama_decode */
	}
	/* a reused graph's node where its template node was: nothing to read */
	if (h->trusted && h->repeating && i < h->tpl_n && h->tpl_ptr[i] == tensor) {
		h->t_rep[i] = t_ns;
		h->cur_n = i + 1;
		h->n_by_address++;
		return;
	}
	name = h->api.get_name(tensor);
	if (i >= h->tpl_cap) { /* past the template's room: recorded, not kept */
		if (h->repeating)
			ti_unhold(h, i, atomic_load_explicit(&h->graph, memory_order_relaxed));
		h->repeating = false;
		ti_push(h, tensor, name, node, TI_ASK, t_ns);
		h->cur_n = i + 1;
		h->n_recorded++;
		return;
	}
	op = h->api.op_desc(tensor);
	nbytes = h->api.nbytes(tensor);
	k = ti_tensor_key(h, tensor, name, op, nbytes, node);
	if (h->repeating) {
		if (i < h->tpl_n && h->key[i] == k) {
			h->t_rep[i] = t_ns;
			h->tpl_ptr[i] = tensor;
			h->cur_n = i + 1;
			h->n_by_key++;
			return;
		}
		/* the first difference: the held asks go to the ring as they were */
		ti_unhold(h, i, atomic_load_explicit(&h->graph, memory_order_relaxed));
		h->repeating = false;
	}
	r = &h->tpl[i];
	ti_build(h, r, tensor, name, op, nbytes, node, TI_ASK, t_ns);
	h->key[i] = k;
	h->tpl_ptr[i] = tensor;
	ti_push_record(h, r);
	h->cur_n = i + 1;
	h->n_recorded++;
}

/* Ends the open graph: a whole repeat is held; anything else becomes the template. */
static void ti_close_graph(struct ti_hook *h)
{
	uint32_t n;

	if (!h->open)
		return;
	h->open = false;
	if (h->cur_n == 0) /* nothing asked (no llama_decode ran): the template stays */
		return;
	n = h->cur_n < h->tpl_cap ? h->cur_n : h->tpl_cap;
	if (h->repeating && h->cur_n == h->tpl_n && n > 0) {
		/* the same records: the template stays, from one ubatch if this was */
		h->tpl_single = h->tpl_single && h->single;
		h->held = true;
		h->held_graph = atomic_load_explicit(&h->graph, memory_order_relaxed);
		return;
	}
	if (h->repeating) /* a shorter graph than the template: its asks are records */
		ti_unhold(h, h->cur_n, atomic_load_explicit(&h->graph, memory_order_relaxed));
	h->repeating = false;
	/* a graph larger than the room is no template: the next one is recorded whole */
	h->tpl_n = h->cur_n <= h->tpl_cap ? n : 0;
	h->tpl_single = h->single;
	h->tpl_gen++;
}

/* A held repeat goes to the ring as records (nobody took its times). */
static void ti_release_held(struct ti_hook *h)
{
	if (!h->held)
		return;
	h->held = false;
	ti_unhold(h, h->tpl_n, h->held_graph);
}

static bool ti_wants_done(const struct ti_hook *h, const char *name)
{
	switch (h->granularity) {
	case TI_KERNEL:
		return true;
	case TI_LAYER:
		return name != NULL &&
		       strncmp(name, TI_LAYER_OUT_PREFIX, sizeof(TI_LAYER_OUT_PREFIX) - 1) == 0;
	case TI_GRAPH:
		break;
	}
	return false;
}

/* Adds the time since t_ns to the callback's own time, when that is on. */
static void ti_self_time(struct ti_hook *h, int64_t t_ns)
{
	int64_t sum;
	uint64_t calls;

	if (!atomic_load_explicit(&h->self_timing, memory_order_relaxed))
		return;
	sum = atomic_load_explicit(&h->self_ns, memory_order_relaxed);
	calls = atomic_load_explicit(&h->self_calls, memory_order_relaxed);
	atomic_store_explicit(&h->self_ns, sum + (ti_now_ns() - t_ns), memory_order_relaxed);
	atomic_store_explicit(&h->self_calls, calls + 1, memory_order_relaxed);
}

TI_API bool ti_hook_eval(void *tensor, bool ask, void *user_data)
{
	struct ti_hook *h = user_data;
	struct ti_exec *ex;
	const char *name;
	int64_t t_ns;
	int32_t node;
	bool want;

	/* Inert answers: false on ask (no sync), true on done (false would abort). */
	if (h == NULL || tensor == NULL ||
	    atomic_load_explicit(&h->disabled, memory_order_relaxed))
		return !ask;

	if (ask && atomic_load_explicit(&h->wake_armed, memory_order_relaxed) != 0 &&
	    atomic_exchange_explicit(&h->wake_armed, 0, memory_order_relaxed) != 0)
		atomic_fetch_add_explicit(sem_post(&h->wake_sem) == 0 ? &h->wake_posts
								  : &h->wake_errors,
					  1, memory_order_relaxed);
	t_ns = ti_now_ns();
	ex = atomic_load_explicit(&h->exec, memory_order_acquire);
	if (ask && atomic_load_explicit(&h->compact, memory_order_relaxed)) {
		/* graph granularity: never a done to ask for, so the name is the compact
		 * path's to read, only where it must */
		node = atomic_load_explicit(&h->next_node, memory_order_relaxed);
		atomic_store_explicit(&h->next_node, node + 1, memory_order_relaxed);
		h->cur_node = node;
		ti_compact_ask(h, tensor, node, t_ns);
		if (ex != NULL)
			ti_exec_on_node(ex, node, true, t_ns);
		ti_self_time(h, t_ns);
		return false;
	}
	name = h->api.get_name(tensor);
	if (!ask) {
		ti_push(h, tensor, name, h->cur_node, TI_DONE, t_ns);
		if (ex != NULL)
			ti_exec_on_node(ex, h->cur_node, false, t_ns);
		ti_self_time(h, t_ns);
		return true;
	}
	node = atomic_load_explicit(&h->next_node, memory_order_relaxed);
	atomic_store_explicit(&h->next_node, node + 1, memory_order_relaxed);
	h->cur_node = node;
	ti_push(h, tensor, name, node, TI_ASK, t_ns);
	if (ex != NULL)
		ti_exec_on_node(ex, node, true, t_ns);
	want = ti_wants_done(h, name);
	ti_self_time(h, t_ns);
	return want;
}

static bool ti_config_ok(const struct ti_hook_config *cfg)
{
	const struct ti_layout *l;

	if (cfg == NULL || cfg->capacity == 0 || cfg->capacity > TI_MAX_CAPACITY)
		return false;
	if (cfg->granularity != TI_GRAPH && cfg->granularity != TI_LAYER &&
	    cfg->granularity != TI_KERNEL)
		return false;
	if (cfg->api.op_desc == NULL || cfg->api.get_name == NULL || cfg->api.nbytes == NULL)
		return false;
	l = &cfg->layout;
	return !l->valid || (l->off_type >= 0 && l->off_ne >= 0 && l->off_src >= 0);
}

TI_API int ti_hook_create(const struct ti_hook_config *cfg, struct ti_hook **out)
{
	struct ti_hook *h = NULL;
	struct ti_record *ring = NULL;
	int err = -EINVAL;

	if (out == NULL || !ti_config_ok(cfg))
		goto fail;
	err = -ENOMEM;
	h = calloc(1, sizeof(*h));
	if (h == NULL)
		goto fail;
	ring = calloc(cfg->capacity, sizeof(*ring));
	if (ring == NULL)
		goto fail_hook;
	/* without it the hook works, and its consumer wakes its planner otherwise */
	h->wake_ok = sem_init(&h->wake_sem, 0, 0) == 0;

	h->ring = ring;
	h->capacity = cfg->capacity;
	h->granularity = (enum ti_granularity)cfg->granularity;
	h->api = cfg->api;
	h->layout = cfg->layout;
	h->cur_node = -1;
	atomic_init(&h->head, 0);
	atomic_init(&h->tail, 0);
	atomic_init(&h->overflow, 0);
	atomic_init(&h->graph, 0);
	atomic_init(&h->next_node, 0);
	atomic_init(&h->disabled, false);
	atomic_init(&h->exec, NULL);
	atomic_init(&h->compact, false);
	atomic_init(&h->self_timing, false);
	atomic_init(&h->self_ns, 0);
	atomic_init(&h->self_calls, 0);
	atomic_init(&h->wake_armed, 0);
	atomic_init(&h->wake_posts, 0);
	atomic_init(&h->wake_errors, 0);
	*out = h;
	return 0;

fail_hook:
	free(h);
fail:
	return err;
}

TI_API void ti_hook_destroy(struct ti_hook *h)
{
	if (h == NULL)
		return;
	if (h->wake_ok)
		(void)sem_destroy(&h->wake_sem); /* fails only for an invalid semaphore */
	free(h->tpl_ptr);
	free(h->t_rep);
	free(h->key);
	free(h->tpl);
	free(h->ring);
	free(h);
}

TI_API uint64_t ti_hook_begin_graph(struct ti_hook *h)
{
	uint64_t seq;

	if (h == NULL)
		return 0;
	if (atomic_load_explicit(&h->compact, memory_order_relaxed)) {
		ti_close_graph(h);
		ti_release_held(h);
		h->open = true;
		h->cur_n = 0;
		h->repeating = h->tpl_n > 0;
	}
	seq = atomic_load_explicit(&h->graph, memory_order_relaxed) + 1;
	atomic_store_explicit(&h->graph, seq, memory_order_relaxed);
	atomic_store_explicit(&h->next_node, 0, memory_order_relaxed);
	ti_exec_graph_begin(atomic_load_explicit(&h->exec, memory_order_acquire), seq);
	return seq;
}

TI_API void *ti_hook_wake_flag(struct ti_hook *h)
{
	return h == NULL || !h->wake_ok ? NULL : &h->wake_armed;
}

TI_API int ti_hook_post_wake(struct ti_hook *h)
{
	if (h == NULL)
		return -EINVAL;
	if (!h->wake_ok)
		return -ENOSYS;
	return sem_post(&h->wake_sem) == 0 ? 0 : -errno;
}

TI_API int ti_hook_wait_wake(struct ti_hook *h, int64_t timeout_ns)
{
	struct timespec until;
	int rc;

	if (h == NULL || timeout_ns < 0)
		return -EINVAL;
	if (!h->wake_ok)
		return -ENOSYS;
	if (clock_gettime(CLOCK_REALTIME, &until) != 0)
		return -errno;
	until.tv_sec += (time_t)(timeout_ns / 1000000000);
	until.tv_nsec += (long)(timeout_ns % 1000000000);
	if (until.tv_nsec >= 1000000000L) {
		until.tv_sec += 1;
		until.tv_nsec -= 1000000000L;
	}
	do
		rc = sem_timedwait(&h->wake_sem, &until);
	while (rc != 0 && errno == EINTR);
	if (rc != 0)
		return errno == ETIMEDOUT ? 1 : -errno;
	/* one wake however many posts came meanwhile: the consumer takes all work then */
	while (sem_trywait(&h->wake_sem) == 0)
		;
	return 0;
}

TI_API void ti_hook_wake_stats(const struct ti_hook *h, uint64_t out[2])
{
	if (out == NULL)
		return;
	out[0] = h == NULL ? 0 : atomic_load_explicit(&h->wake_posts, memory_order_relaxed);
	out[1] = h == NULL ? 0 : atomic_load_explicit(&h->wake_errors, memory_order_relaxed);
}

TI_API void ti_hook_set_executor(struct ti_hook *h, struct ti_exec *ex)
{
	if (h != NULL)
		atomic_store_explicit(&h->exec, ex, memory_order_release);
}

TI_API uint32_t ti_hook_drain(struct ti_hook *h, struct ti_record *out, uint32_t max)
{
	uint64_t tail, head, n, first, run;

	if (h == NULL || out == NULL)
		return 0;
	tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
	head = atomic_load_explicit(&h->head, memory_order_acquire);
	n = head - tail;
	if (n > max)
		n = max;
	first = tail % h->capacity;
	run = h->capacity - first;
	if (run > n)
		run = n;
	memcpy(out, &h->ring[first], run * sizeof(*out));
	memcpy(out + run, h->ring, (n - run) * sizeof(*out));
	atomic_store_explicit(&h->tail, tail + n, memory_order_release);
	return (uint32_t)n;
}

TI_API uint32_t ti_hook_pending(const struct ti_hook *h)
{
	uint64_t tail, head;

	if (h == NULL)
		return 0;
	tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
	head = atomic_load_explicit(&h->head, memory_order_acquire);
	return (uint32_t)(head - tail);
}

/* Records agree in every byte but t_ns and graph (the node included): [ne, end). */
static bool ti_record_repeat_eq(const struct ti_record *a, const struct ti_record *b)
{
	const size_t lo = offsetof(struct ti_record, ne);

	return memcmp((const char *)a + lo, (const char *)b + lo, sizeof(*a) - lo) == 0;
}

TI_API uint32_t ti_hook_drain_like(struct ti_hook *h, const struct ti_record *tpl, uint32_t n,
				   uint64_t graph, int64_t *t_ns_out)
{
	uint64_t tail, head, i;
	const struct ti_record *r;

	if (h == NULL || tpl == NULL || t_ns_out == NULL || n == 0)
		return 0;
	tail = atomic_load_explicit(&h->tail, memory_order_relaxed);
	head = atomic_load_explicit(&h->head, memory_order_acquire);
	if (head - tail != n)
		return 0;
	for (i = 0; i < n; i++) {
		r = &h->ring[(tail + i) % h->capacity];
		if (r->graph != graph || !ti_record_repeat_eq(r, &tpl[i]))
			return 0;
		t_ns_out[i] = r->t_ns;
	}
	atomic_store_explicit(&h->tail, tail + n, memory_order_release);
	return n;
}

TI_API int ti_hook_set_compact(struct ti_hook *h, bool on)
{
	uint32_t cap;

	if (h == NULL || (on && h->granularity != TI_GRAPH))
		return -EINVAL;
	if (!on) {
		ti_close_graph(h);
		ti_release_held(h);
		h->open = false;
		h->tpl_n = 0;
		atomic_store_explicit(&h->compact, false, memory_order_relaxed);
		return 0;
	}
	if (h->tpl == NULL) {
		cap = h->capacity < TI_TPL_MAX ? h->capacity : TI_TPL_MAX;
		h->tpl = calloc(cap, sizeof(*h->tpl));
		h->key = calloc(cap, sizeof(*h->key));
		h->t_rep = calloc(cap, sizeof(*h->t_rep));
		h->tpl_ptr = calloc(cap, sizeof(*h->tpl_ptr));
		if (h->tpl == NULL || h->key == NULL || h->t_rep == NULL || h->tpl_ptr == NULL)
			goto fail;
		h->tpl_cap = cap;
	}
	atomic_store_explicit(&h->compact, true, memory_order_relaxed);
	return 0;

fail:
	free(h->tpl_ptr);
	free(h->t_rep);
	free(h->key);
	free(h->tpl);
	h->tpl_ptr = NULL;
	h->t_rep = NULL;
	h->key = NULL;
	h->tpl = NULL;
	return -ENOMEM;
}

TI_API int64_t ti_hook_set_reuse_probe(struct ti_hook *h, ti_llama_perf_fn perf,
					const void *llama_ctx)
{
	if (h == NULL || (perf == NULL) != (llama_ctx == NULL))
		return -EINVAL;
	h->perf = perf;
	h->perf_ctx = llama_ctx;
	h->tpl_single = false; /* trust nothing recorded before the probe */
	if (perf == NULL)
		return 0;
	h->reused = perf(llama_ctx).n_reused;
	return h->reused;
}

TI_API void ti_hook_compact_stats(const struct ti_hook *h, uint64_t out[3])
{
	if (h == NULL || out == NULL)
		return;
	out[0] = h->n_by_address;
	out[1] = h->n_by_key;
	out[2] = h->n_recorded;
}

TI_API int64_t ti_hook_end_graph(struct ti_hook *h, uint64_t graph, int64_t *t_ns_out,
				 uint32_t max, uint64_t *gen)
{
	uint32_t n;

	if (h == NULL || !atomic_load_explicit(&h->compact, memory_order_relaxed))
		return 0;
	ti_close_graph(h);
	if (gen != NULL)
		*gen = h->tpl_gen;
	if (!h->held)
		return 0;
	n = h->tpl_n;
	if (h->held_graph != graph) {
		ti_release_held(h);
		return 0;
	}
	if (max < n || t_ns_out == NULL)
		return -(int64_t)n;
	memcpy(t_ns_out, h->t_rep, n * sizeof(*t_ns_out));
	h->held = false;
	return n;
}

TI_API void ti_hook_flush(struct ti_hook *h)
{
	if (h == NULL || !atomic_load_explicit(&h->compact, memory_order_relaxed))
		return;
	ti_close_graph(h);
	ti_release_held(h);
}

TI_API int64_t ti_hook_copy_template(const struct ti_hook *h, struct ti_record *out,
				     uint32_t max, uint64_t *gen)
{
	if (h == NULL || !atomic_load_explicit(&h->compact, memory_order_relaxed))
		return 0;
	if (gen != NULL)
		*gen = h->tpl_gen;
	if (max < h->tpl_n)
		return -(int64_t)h->tpl_n;
	if (out != NULL)
		memcpy(out, h->tpl, h->tpl_n * sizeof(*out));
	return h->tpl_n;
}

TI_API uint64_t ti_hook_overflow(const struct ti_hook *h)
{
	if (h == NULL)
		return 0;
	return atomic_load_explicit(&h->overflow, memory_order_relaxed);
}

TI_API void ti_hook_disable(struct ti_hook *h)
{
	if (h != NULL)
		atomic_store_explicit(&h->disabled, true, memory_order_relaxed);
}

TI_API void ti_hook_set_self_timing(struct ti_hook *h, bool on)
{
	if (h != NULL)
		atomic_store_explicit(&h->self_timing, on, memory_order_relaxed);
}

TI_API int64_t ti_hook_self_ns(const struct ti_hook *h, uint64_t *calls)
{
	if (h == NULL)
		return 0;
	if (calls != NULL)
		*calls = atomic_load_explicit(&h->self_calls, memory_order_relaxed);
	return atomic_load_explicit(&h->self_ns, memory_order_relaxed);
}

TI_API size_t ti_record_size(void)
{
	return sizeof(struct ti_record);
}

TI_API size_t ti_config_size(void)
{
	return sizeof(struct ti_hook_config);
}

/* Records agree in every byte but t_ns, graph and node: [ne, node) and (node, end). */
static bool ti_record_shape_eq(const struct ti_record *a, const struct ti_record *b)
{
	const size_t lo0 = offsetof(struct ti_record, ne);
	const size_t hi0 = offsetof(struct ti_record, node);
	const size_t lo1 = hi0 + sizeof(a->node);
	const char *x = (const char *)a, *y = (const char *)b;

	_Static_assert(offsetof(struct ti_record, ne) == 2 * sizeof(int64_t),
		       "t_ns and graph lead the record");
	return memcmp(x + lo0, y + lo0, hi0 - lo0) == 0 &&
	       memcmp(x + lo1, y + lo1, sizeof(struct ti_record) - lo1) == 0;
}

TI_API int ti_record_same_shape(const struct ti_record *a, const struct ti_record *b,
				size_t n)
{
	size_t i;

	if (n > 0 && (a == NULL || b == NULL))
		return 0;
	for (i = 0; i < n; i++) {
		if (!ti_record_shape_eq(&a[i], &b[i]))
			return 0;
	}
	return 1;
}

TI_API int ti_record_scan(const struct ti_record *rec, size_t n, uint64_t graph,
			  const struct ti_record *seen, int64_t *t_ns_out)
{
	bool own = true, same = seen != NULL;
	size_t i;

	if (n > 0 && (rec == NULL || t_ns_out == NULL))
		return 0;
	for (i = 0; i < n; i++) {
		t_ns_out[i] = rec[i].t_ns;
		own = own && rec[i].graph == graph && rec[i].phase == TI_ASK;
		same = same && ti_record_shape_eq(&rec[i], &seen[i]);
	}
	return (own ? TI_SCAN_OWN_ASKS : 0) | (same ? TI_SCAN_SAME_SHAPE : 0);
}

#define TI_FIELD(f) { #f, offsetof(struct ti_record, f) }

static const struct {
	const char *name;
	size_t offset;
} ti_record_fields[] = {
	TI_FIELD(t_ns),	     TI_FIELD(graph),	  TI_FIELD(ne),	       TI_FIELD(src0_ne),
	TI_FIELD(src1_ne),   TI_FIELD(nbytes),	  TI_FIELD(node),      TI_FIELD(type),
	TI_FIELD(src0_type), TI_FIELD(src1_type), TI_FIELD(phase),     TI_FIELD(flags),
	TI_FIELD(op),	     TI_FIELD(name),
};

TI_API int64_t ti_record_field_offset(const char *field)
{
	size_t i;

	if (field == NULL)
		return -1;
	for (i = 0; i < sizeof(ti_record_fields) / sizeof(ti_record_fields[0]); i++) {
		if (strcmp(ti_record_fields[i].name, field) == 0)
			return (int64_t)ti_record_fields[i].offset;
	}
	return -1;
}
