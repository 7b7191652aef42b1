/* Paged decode attention for the CPU backend: one query token per sequence, fp32 with an fp32 or
 * bf16 cache, or an int8 / e4m3 one with an fp32 scale per KV head (kv_elem.h).
 *
 * Why it exists: the torch reference gathers every sequence's K/V rows into a padded batch before
 * its matmuls, so each step moves the whole context three times (read, write, read again). Here
 * each (sequence, KV head) task reads its K and V rows once, straight from the paged cache, and
 * scores all query heads of its GQA group against each K row while it is in registers.
 *
 * Layouts (as cute_kernels/reference.py): q/out [B, H, D]; k/v cache [num_blocks, BS, HKV, D];
 * block_tables [B, max_blocks] int32; context_lens [B] int32 (tokens to attend, >= 1).
 * Threads: OpenMP over B * HKV * chunks split-KV tasks (attention_rows.h); it shares the one libgomp torch has loaded.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention_rows.h"

/* Returns 0 on success, 1 on bad sizes, 2 when a work buffer could not be allocated.
 * Tasks: one per (sequence, chunk of KV_CHUNK tokens, KV head or all of them: heads_per_task), attention_rows.h's
 * split-KV; then one merge per (sequence, KV head). */
int paged_decode_attention_f32(const float *q, const void *k_cache, const void *v_cache,
                               const int32_t *block_tables, const int32_t *context_lens, float *out,
                               int64_t batch, int64_t heads, int64_t hkv, int64_t d, int64_t bs,
                               int64_t max_blocks, float scale, int kv_kind, const float *k_scale,
                               const float *v_scale) {
    if (hkv <= 0 || heads % hkv || d <= 0 || bs <= 0 || !kv_kind_known(kv_kind)) return 1;
    if (kv_quantized(kv_kind) && (k_scale == NULL || v_scale == NULL)) return 1;
    const int64_t g_n = heads / hkv;
    int64_t max_len = 1;
    for (int64_t b = 0; b < batch; b++) max_len = context_lens[b] > max_len ? context_lens[b] : max_len;
    const int64_t max_chunks = num_chunks(max_len, bs), hg = heads_per_task(batch, max_chunks, hkv, omp_get_max_threads());
    const int64_t tasks = batch * hkv / hg * max_chunks;
    const int64_t pairs = batch * hkv * max_chunks; /* one partial per (sequence, KV head, chunk) */
    float *parts = malloc(sizeof(float) * (pairs ? pairs : 1) * partial_floats(g_n, d));
    if (parts == NULL) return 2;
    int status = 0;
#pragma omp parallel
    {
        float *scores = malloc(sizeof(float) * hg * g_n * chunk_tokens(bs));
        const int64_t staged = stage_floats(kv_kind, bs, d);
        KVCache kc = {k_cache, v_cache, kv_kind, staged ? malloc(sizeof(float) * staged) : NULL, k_scale, v_scale};
        const int ok = scores != NULL && (staged == 0 || kc.stage != NULL);
        if (!ok) {
#pragma omp atomic write
            status = 2;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++)
            if (ok)
                attend_task(task, hg, q, heads * d, &kc, block_tables, max_blocks, context_lens, max_chunks, g_n, hkv, d,
                            bs, scale, scores, parts);
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < batch * hkv; pair++)
            if (!status) merge_pair(pair, parts, context_lens, max_chunks, g_n, hkv, d, bs, out, heads * d);
        free(scores);
        free(kc.stage);
    }
    free(parts);
    return status;
}

/* dst[0:rows * heads * d] = src stored as the fused decode step stores K/V rows (kv_elem.h): rounded to
 * bf16, or quantized to int8 / e4m3 with scales[heads], for the tests that hold it to torch's. */
void store_kv_rows(const float *src, void *dst, int64_t rows, int64_t heads, int64_t d, int kind,
                   const float *scales) {
    for (int64_t r = 0; r < rows; r++) kv_store_heads(dst, kind, r * heads * d, src + r * heads * d, heads, d, scales);
}

/* The SIMD route this library was built for (isa.h), so tests and benchmarks can say which ran. */
const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
