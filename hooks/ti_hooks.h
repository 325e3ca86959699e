/* SPDX-License-Identifier: MIT */
/*
 * ti_hooks: a ggml scheduler eval callback (cb_eval) that stamps every graph node
 * into a fixed-size single-producer/single-consumer ring of fixed-size records.
 *
 * The library has no link-time dependency on ggml. The caller (Python, ctypes) passes
 * the addresses of ggml's exported accessors and, when its mirror of the ggml_tensor
 * struct prefix was verified, the byte offsets of the fields that have no accessor
 * (type, ne, src). Without a verified layout, records carry op, name and size only.
 */
#ifndef TI_HOOKS_H
#define TI_HOOKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TI_API __attribute__((visibility("default")))

#define TI_NAME_LEN 64 /* ggml's GGML_MAX_NAME; longer names are truncated */
#define TI_OP_LEN 32   /* longest ggml op description is 23 characters */

enum ti_granularity {
	TI_GRAPH = 0,  /* record asks only, never force a sync */
	TI_LAYER = 1,  /* sync at each layer output node (name "l_out-<i>") */
	TI_KERNEL = 2, /* sync at every node: per-kernel completion times */
};

enum ti_phase {
	TI_ASK = 0,
	TI_DONE = 1,
};

enum ti_record_flags {
	TI_HAS_SHAPE = 1, /* ne and type are valid */
	TI_HAS_SRC0 = 2,  /* src0_ne and src0_type are valid */
	TI_HAS_SRC1 = 4,  /* src1_ne and src1_type are valid */
};

/* One node observation. Layout is checked from Python with ti_record_field_offset. */
struct ti_record {
	int64_t t_ns;       /* CLOCK_MONOTONIC */
	uint64_t graph;     /* graph sequence number, set by ti_hook_begin_graph */
	int64_t ne[4];
	int64_t src0_ne[4];
	int64_t src1_ne[4];
	uint64_t nbytes;    /* ggml_nbytes */
	int32_t node;       /* index of the node in the graph's callback order */
	int32_t type;       /* enum ggml_type, -1 when unknown */
	int32_t src0_type;
	int32_t src1_type;
	uint8_t phase;      /* enum ti_phase */
	uint8_t flags;      /* enum ti_record_flags */
	uint8_t reserved[6];
	char op[TI_OP_LEN];     /* ggml_op_desc, NUL-terminated */
	char name[TI_NAME_LEN]; /* ggml_get_name, NUL-terminated */
};

typedef const char *(*ti_op_desc_fn)(const void *tensor);
typedef const char *(*ti_get_name_fn)(const void *tensor);
typedef size_t (*ti_nbytes_fn)(const void *tensor);

/* Addresses of ggml's accessors in libggml-base; all three are required. */
struct ti_ggml_api {
	ti_op_desc_fn op_desc;
	ti_get_name_fn get_name;
	ti_nbytes_fn nbytes;
};

/* Byte offsets inside struct ggml_tensor, used only when valid != 0. */
struct ti_layout {
	int32_t valid;
	int32_t off_type; /* enum ggml_type (int32) */
	int32_t off_ne;   /* int64_t ne[4] */
	int32_t off_src;  /* struct ggml_tensor *src[...], at least two entries */
};

struct ti_hook_config {
	uint32_t capacity;   /* records in the ring, > 0 */
	int32_t granularity; /* enum ti_granularity */
	struct ti_ggml_api api;
	struct ti_layout layout;
};

struct ti_hook;

/* 0 on success, -EINVAL for a bad config, -ENOMEM when the ring cannot be allocated. */
TI_API int ti_hook_create(const struct ti_hook_config *cfg, struct ti_hook **out);
/* Frees the ring. The callback must no longer be reachable (context freed). */
TI_API void ti_hook_destroy(struct ti_hook *h);
/* The cb_eval itself: pass its address as context_params.cb_eval, h as user data. */
TI_API bool ti_hook_eval(void *tensor, bool ask, void *user_data);
/*
 * Before each llama_decode: graph seq += 1, node index back to 0. Returns the seq.
 * In compact mode it first ends the previous graph (a held repeat goes to the ring).
 */
TI_API uint64_t ti_hook_begin_graph(struct ti_hook *h);
/* Copies up to max records, oldest first, and frees their slots. Returns the count. */
TI_API uint32_t ti_hook_drain(struct ti_hook *h, struct ti_record *out, uint32_t max);
/* Records waiting in the ring (produced, not yet drained). */
TI_API uint32_t ti_hook_pending(const struct ti_hook *h);
/*
 * The engine's drain at a graph's end when it repeats the last one: if exactly n
 * records wait, all of graph `graph`, and record i equals tpl[i] in every byte but
 * t_ns and graph (the same node, shape, op, name and phase), copies their t_ns to
 * t_ns_out (n entries), frees their slots and returns n; else returns 0 and leaves
 * the ring as it is. tpl[i] with t_ns_out[i] and `graph` is then record i, exactly:
 * an 8-byte copy per record instead of a 240-byte one (one graph of a 270M model is
 * ~800 records, ~200 KB), with nothing allocated.
 */
TI_API uint32_t ti_hook_drain_like(struct ti_hook *h, const struct ti_record *tpl, uint32_t n,
				   uint64_t graph, int64_t *t_ns_out);
/*
 * Compact repeats, at TI_GRAPH granularity: llama.cpp reuses a decode graph token
 * after token, so its ~600 records (240 bytes each) repeat but for t_ns and graph.
 * With compact on, the hook keeps the last graph's records (the template) and, while a
 * graph's asks match it node by node (a 64-bit key per node of what its record holds
 * but t_ns and graph, read from the tensor; or, with the reuse probe below, the
 * node's address alone), keeps only their ask times; at the first difference the held
 * asks go to the ring as the records they would have been, and the rest of the graph
 * is recorded as usual.
 * The ring thus holds every record of every graph except those of whole repeats,
 * which ti_hook_end_graph hands over as times (8 bytes per record).
 *
 * All of these run on the producer side: the thread that calls llama_decode, between
 * its decodes (the callback itself runs inside them).
 *
 * ti_hook_set_compact: 0, -EINVAL (another granularity), -ENOMEM (the template, 264
 * bytes per node for up to min(capacity, 32768) nodes). Off releases what is held.
 * ti_hook_end_graph: ends the current graph. If it repeated the whole template and is
 * graph `graph`, copies its n ask times to t_ns_out and returns n: record i is then
 * template record i with t_ns_out[i] and `graph`. Returns -n (nothing taken, still
 * held) when max < n or t_ns_out is NULL; 0 when the graph is no whole repeat (or another graph was named): its
 * records are in the ring. *gen (may be NULL) gets the template's generation, which
 * changes whenever the template does.
 * ti_hook_flush: ends the current graph; a held repeat goes to the ring as records.
 * Call it before a drain that must see every record (ti_hook_drain).
 * ti_hook_copy_template: copies the template's n records to out and returns n, or -n
 * when max < n; *gen as above. 0 when compact is off.
 */
TI_API int ti_hook_set_compact(struct ti_hook *h, bool on);

/* llama.h's struct llama_perf_context_data, for its graph reuse count. */
struct ti_llama_perf {
	double t_start_ms;
	double t_load_ms;
	double t_p_eval_ms;
	double t_eval_ms;
	int32_t n_p_eval;
	int32_t n_eval;
	int32_t n_reused;
};
typedef struct ti_llama_perf (*ti_llama_perf_fn)(const void *llama_ctx);

/*
 * Compact mode, with llama.cpp's graph reuse: perf is llama_perf_context and llama_ctx
 * the context this hook's callback runs in (both NULL: off). When the context's reuse
 * count went up by exactly one since the last graph's first ask, llama.cpp is
 * computing the graph it computed last, unchanged (the same ggml tensors; only input
 * data is set), so a node at the address of the template's node i, where the template
 * came from one ubatch, is taken as a repeat without reading the tensor. Anything
 * else (another address, a rebuilt graph, a template of several ubatches) goes
 * through the node keys as before. Returns the reuse count now (the caller checks it
 * against llama_perf_context's own) or -EINVAL. Call between decodes; the context
 * must outlive every later decode of this hook, or the probe be cleared first.
 */
TI_API int64_t ti_hook_set_reuse_probe(struct ti_hook *h, ti_llama_perf_fn perf,
				       const void *llama_ctx);
/*
 * Compact mode's asks so far: out[0] told a repeat by address (a reused graph),
 * out[1] by key, out[2] recorded (ring and template). Between decodes.
 */
TI_API void ti_hook_compact_stats(const struct ti_hook *h, uint64_t out[3]);
TI_API int64_t ti_hook_end_graph(struct ti_hook *h, uint64_t graph, int64_t *t_ns_out,
				 uint32_t max, uint64_t *gen);
TI_API void ti_hook_flush(struct ti_hook *h);
TI_API int64_t ti_hook_copy_template(const struct ti_hook *h, struct ti_record *out,
				     uint32_t max, uint64_t *gen);

/* Records dropped because the ring was full. */
TI_API uint64_t ti_hook_overflow(const struct ti_hook *h);
/* Makes the callback inert at once: no records, false on ask, true on done. */
TI_API void ti_hook_disable(struct ti_hook *h);

/*
 * The callback's own time, for benchmarks: when on, each call adds its duration (a
 * second clock read at its end, ~20 ns) to a sum. ti_hook_self_ns returns the sum in
 * ns since the hook was created and stores the number of calls timed in *calls (may
 * be NULL). Switch it only between decodes.
 */
TI_API void ti_hook_set_self_timing(struct ti_hook *h, bool on);
TI_API int64_t ti_hook_self_ns(const struct ti_hook *h, uint64_t *calls);

/*
 * The planner's wake-up, posted from inside llama_decode: a consumer thread blocks in
 * ti_hook_wait_wake; the engine thread arms the wake between decodes with a plain
 * store of 1 to the int32 at ti_hook_wake_flag(h) (no call, no system call), and the
 * callback's next ask posts it. ti_hook_post_wake posts it from any thread (to stop
 * or hurry the consumer). ti_hook_wait_wake: 0 when woken (the posts that came
 * meanwhile are taken with it), 1 after timeout_ns without a post, -errno on failure.
 * Every wait must have returned before ti_hook_destroy. Where the platform has no
 * unnamed semaphores, ti_hook_wake_flag is NULL and the others return -ENOSYS (the
 * hook works without its wake). ti_hook_wake_stats: out[0] the callback's posts so
 * far, out[1] those that failed.
 */
TI_API void *ti_hook_wake_flag(struct ti_hook *h);
TI_API int ti_hook_post_wake(struct ti_hook *h);
TI_API int ti_hook_wait_wake(struct ti_hook *h, int64_t timeout_ns);
TI_API void ti_hook_wake_stats(const struct ti_hook *h, uint64_t out[2]);

struct ti_exec;
/*
 * Feed a plan executor (hooks/ti_exec.h) from this hook: every ask and done goes to
 * ti_exec_on_node, every begin_graph to ti_exec_graph_begin. NULL detaches. Call only
 * between decodes; the executor must outlive the attachment.
 */
TI_API void ti_hook_set_executor(struct ti_hook *h, struct ti_exec *ex);

/*
 * 1 when records a[i] and b[i] agree, for every i < n, in every byte but t_ns, graph
 * and node (the fields that differ between two graphs of the same shape), else 0.
 * Reads both arrays once, writes nothing: the ingest's per-graph cache check.
 */
TI_API int ti_record_same_shape(const struct ti_record *a, const struct ti_record *b,
				size_t n);

/*
 * One pass over a drained graph's records for the ingest: copies each record's t_ns to
 * t_ns_out (n entries) and returns a bit set: TI_SCAN_OWN_ASKS when every record is an
 * ask of graph `graph`, TI_SCAN_SAME_SHAPE when `seen` (n records, may be NULL) has the
 * same shape (ti_record_same_shape). Reads each array once, allocates nothing.
 */
enum ti_scan_flags {
	TI_SCAN_OWN_ASKS = 1,
	TI_SCAN_SAME_SHAPE = 2,
};
TI_API int ti_record_scan(const struct ti_record *rec, size_t n, uint64_t graph,
			  const struct ti_record *seen, int64_t *t_ns_out);

/* ABI checks for the Python side. */
TI_API size_t ti_record_size(void);
TI_API size_t ti_config_size(void);
/* Offset of a ti_record field by name, -1 when the name is unknown. */
TI_API int64_t ti_record_field_offset(const char *field);

#endif /* TI_HOOKS_H */
