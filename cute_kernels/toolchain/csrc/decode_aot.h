/* Public C ABI of the ahead-of-time exported decode-attention kernels (hopper/decode/decode_aot.py).
 *
 * Two kernels per (dtype, head_dim) (and an e4m3 cache: decode_<dtype>_d<d>_kv_e4m3): cute_aot_decode_<dtype>_d<d>_launch takes cute_aot_decode_args_t
 * (with one split it writes out/lse; with several, the fp32 partials), and
 * cute_aot_decode_merge_<dtype>_d<d>_launch takes cute_aot_decode_merge_args_t (partials -> out/lse).
 * Raw device pointers, runtime sizes, and strides in elements for the modes whose stride is not fixed
 * by the variant; head_dim and the 16-token KV block are compiled in. Python mirrors both structs in
 * hopper/decode/decode_aot.py; the loader checks cute_aot_decode_args_size() / _merge_args_size() against them.
 */
#pragma once
#include <stdint.h>

typedef struct {
    void *q;                        /* [total_q, heads, d] bf16 or fp16 */
    void *k_cache, *v_cache;        /* [num_blocks, 16, kv_heads, d] */
    void *block_tables;             /* int32 [batch, max_blocks] */
    void *context_lens;             /* int32 [batch] */
    void *cu_seqlens_q;             /* int32 [batch + 1] */
    void *out;                      /* like q */
    void *lse;                      /* fp32 [total_q, heads] */
    void *out_partial;              /* fp32 [partial_splits, partial_rows, heads, d] */
    void *lse_partial;              /* fp32 [partial_splits, partial_rows, heads] */
    void *k_scale, *v_scale;        /* fp32 [kv_heads]: an e4m3 cache's dequant scales (_kv_e4m3 variants) */
    int32_t total_q, heads, num_blocks, kv_heads;
    int32_t batch, max_blocks, num_splits, partial_splits, partial_rows;
    int64_t q_stride, out_stride;                     /* elements between token rows */
    int64_t k_cache_strides[2], v_cache_strides[2];   /* elements between blocks, between slots */
    int64_t block_tables_stride, lse_stride;          /* elements between rows */
    int64_t out_partial_strides[2], lse_partial_strides[2]; /* between splits, between token rows */
    float softmax_scale_log2;
} cute_aot_decode_args_t;

typedef struct {
    void *out_partial, *lse_partial; /* fp32 [splits, total_q, heads, d], [splits, total_q, heads] */
    void *out, *lse;                 /* [total_q, heads, d] bf16/fp16, fp32 [total_q, heads] */
    int32_t splits, total_q, heads;
    int64_t out_partial_strides[2], lse_partial_strides[2]; /* between splits, between token rows */
    int64_t out_stride, lse_stride;                         /* between token rows */
} cute_aot_decode_merge_args_t;
