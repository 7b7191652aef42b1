/* Fused elementwise ops of a decoder layer for the CPU backend, fp32, each one pass over memory.
 *
 * Why they exist: in torch each of these is two to six ops, every one a full pass over a
 * [tokens, hidden] or [tokens, intermediate] buffer with a temporary in between (silu of the gate
 * half alone takes a strided slow path). Together they were ~8% of a 4096-token prefill step and
 * ~10% of a batch-64 decode step on 2 cores. References: cute_kernels/cpu/fused_ops.py.
 * Rows are split over OpenMP threads; small inputs stay on the calling thread.
 */
#include <omp.h>
#include <stddef.h>
#include <stdint.h>

#include "fused_rows.h"
#include "kv_elem.h"

#define PARALLEL_MIN 32768 /* elements below which threading costs more than it saves */

/* h = rms_norm(x + residual) * w, and res_out = x + residual; residual NULL means zeros
 * (the first layer), and then res_out is not written. */
void add_rms_norm_f32(const float *x, const float *residual, const float *w, float *res_out, float *h,
                      int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++)
        add_rms_norm_row(x + r * dim, residual != NULL ? residual + r * dim : NULL, w, res_out + r * dim,
                         h + r * dim, dim, eps);
}

/* out[r] = silu(gate_up[r, :inter]) * gate_up[r, inter:]. */
void silu_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++)
        silu_mul_row(gate_up + r * 2 * inter, gate_up + r * 2 * inter + inter, out + r * inter, inter);
}

/* In place, rotate-half convention (rope_head) with cos/sin [tokens, d/2]. Token t's heads start at
 * x + t * token_stride and are d apart. */
void rope_f32(float *x, const float *cos_t, const float *sin_t, int64_t tokens, int64_t heads, int64_t d,
              int64_t token_stride) {
    const int64_t half = d / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * d >= PARALLEL_MIN)
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) rope_head(x + t * token_stride + h * d, cos_t + t * half, sin_t + t * half, half);
}

/* 1 when some slots[t] lies outside a cache of `slots` rows (nothing is then read or written), else 0. */
static int slots_outside(const int64_t *slots, int64_t tokens, int64_t rows) {
    int outside = 0;
    for (int64_t t = 0; t < tokens; t++) outside |= slots[t] < 0 || slots[t] >= rows;
    return outside;
}

/* Token t's k or v row (heads x d fp32 at src + t * stride) stored at slot slots[t] of a paged cache of
 * num_slots rows and type kind ([slots, heads, d]) as kv_elem.h stores rows (torch's rounding; 8-bit:
 * scales[h] per head). Returns 0; 1 (and writes nothing) for a slot outside the cache. */
int write_kv_f32(const float *src, int64_t stride, void *cache, int64_t num_slots, const int64_t *slots,
                 int64_t tokens, int64_t heads, int64_t d, int kind, const float *scales) {
    if (slots_outside(slots, tokens, num_slots)) return 1;
#pragma omp parallel for schedule(static) if (tokens * heads * d >= PARALLEL_MIN)
    for (int64_t t = 0; t < tokens; t++) kv_store_heads(cache, kind, slots[t] * heads * d, src + t * stride, heads, d, scales);
    return 0;
}

/* out[t] = the row at slot slots[t] of such a cache as fp32: what a prefix hit reads back. Returns as
 * write_kv_f32. */
int read_kv_f32(const void *cache, int64_t num_slots, const int64_t *slots, int64_t tokens, int64_t heads, int64_t d,
                int kind, const float *scales, float *out) {
    if (slots_outside(slots, tokens, num_slots)) return 1;
#pragma omp parallel for schedule(static) if (tokens * heads * d >= PARALLEL_MIN)
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) {
            float *dst = out + (t * heads + h) * d;
            const float *row = kv_row_f32(cache, kind, (slots[t] * heads + h) * d, d, scales != NULL ? scales[h] : 1.f, dst);
            if (row != dst) memcpy(dst, row, sizeof(float) * (size_t)d);
        }
    return 0;
}

/* The SIMD route this library was built for (isa.h), so tests and benchmarks can say which ran. */
const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
