/* Public C ABI of the ahead-of-time exported prefill-attention kernels (cute_kernels/aot.py).
 *
 * One launch function per kernel variant, `cute_aot_<variant>_launch`, all taking this struct: raw
 * device pointers, runtime sizes, and strides in elements for the modes whose stride is not fixed by
 * the variant (rows of q/k/v/out/lse, blocks and slots of the paged caches). head_dim and the 16-token
 * KV block are compiled in. Python mirrors this struct in aot_loader.PrefillArgsC; keep them in sync
 * (the loader checks cute_aot_prefill_args_size() against its own size).
 */
#pragma once
#include <stdint.h>
#include "aot_common.h"

typedef struct {
    void *q, *k, *v;              /* [total_q, heads, d], [total_k, kv_heads, d] x2; bf16 or fp16 */
    void *k_cache, *v_cache;      /* [num_blocks, 16, kv_heads, d] */
    void *block_tables;           /* int32 [batch, max_blocks] */
    void *prefix_lens;            /* int32 [batch] */
    void *cu_seqlens_q, *cu_seqlens_k; /* int32 [batch + 1] */
    void *out;                    /* like q */
    void *lse;                    /* fp32 [total_q, heads] */
    int32_t total_q, heads, total_k, kv_heads;
    int32_t num_blocks, batch, max_blocks, max_seqlen_q;
    int64_t q_stride, k_stride, v_stride, out_stride; /* elements between token rows */
    int64_t k_cache_strides[2], v_cache_strides[2];   /* elements between blocks, between slots */
    int64_t block_tables_stride, lse_stride;          /* elements between rows */
    float softmax_scale_log2;
    void *tile_order;             /* int32 [num_tiles]: linear tile ids, longest first */
    int32_t num_tiles, num_ctas;  /* the persistent grid: num_ctas CTAs walk the list */
    void *k_scale, *v_scale;      /* fp32 [kv_heads]: an e4m3 prefix's dequant scales (_kv_e4m3 variants) */
} cute_aot_prefill_args_t;
