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
 * Threads: OpenMP over B * HKV tasks; it shares the one libgomp torch has loaded.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention_rows.h"

/* Returns 0 on success, 1 on bad sizes, 2 when a work buffer could not be allocated.
 * A task is one sequence (all its KV heads: whole blocks stream contiguously), or, for batches too
 * small to keep every thread busy, one (sequence, KV head) pair. */
int paged_decode_attention_f32(const float *q, const void *k_cache, const void *v_cache,
                               const int32_t *block_tables, const int32_t *context_lens, float *out,
                               int64_t batch, int64_t heads, int64_t hkv, int64_t d, int64_t bs,
                               int64_t max_blocks, float scale, int kv_kind, const float *k_scale,
                               const float *v_scale) {
    if (hkv <= 0 || heads % hkv || d <= 0 || bs <= 0 || !kv_kind_known(kv_kind)) return 1;
    if (kv_quantized(kv_kind) && (k_scale == NULL || v_scale == NULL)) return 1;
    const int64_t g_n = heads / hkv;
    const int64_t kv_per_task = batch >= 4 * omp_get_max_threads() ? hkv : 1;
    const int64_t tasks_per_seq = hkv / kv_per_task, task_heads = kv_per_task * g_n;
    int status = 0;
#pragma omp parallel
    {
        float *scores = NULL, *acc = malloc(sizeof(float) * task_heads * d);
        float *inv_sum = malloc(sizeof(float) * task_heads);
        KVCache kc = {k_cache, v_cache, kv_kind, kv_kind == KV_F32 ? NULL : malloc(sizeof(float) * bs * d),
                      k_scale, v_scale};
        int64_t capacity = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < batch * tasks_per_seq; task++) {
            const int64_t b = task / tasks_per_seq, kv0 = task % tasks_per_seq * kv_per_task;
            const int64_t kv1 = kv0 + kv_per_task, len = context_lens[b];
            if (len > capacity) {
                free(scores);
                capacity = len + 1024;
                scores = malloc(sizeof(float) * task_heads * capacity);
            }
            if (scores == NULL || acc == NULL || inv_sum == NULL || (kv_kind != KV_F32 && kc.stage == NULL)) {
                capacity = 0;
#pragma omp atomic write
                status = 2;
                continue;
            }
            const int64_t at = (b * heads + kv0 * g_n) * d;
            attend_heads(q + at, &kc, block_tables + b * max_blocks, len, g_n, kv0, kv1, hkv, d, bs,
                         scale, scores, acc, inv_sum, out + at);
        }
        free(scores);
        free(acc);
        free(inv_sum);
        free(kc.stage);
    }
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
