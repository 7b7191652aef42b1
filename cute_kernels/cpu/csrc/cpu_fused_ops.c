/* Fused elementwise ops of a decoder layer for the CPU backend, fp32, each one pass over memory.
 *
 * Why they exist: in torch each of these is two to six ops, every one a full pass over a
 * [tokens, hidden] or [tokens, intermediate] buffer with a temporary in between (silu of the gate
 * half alone takes a strided slow path). Together they were ~8% of a 4096-token prefill step and
 * ~10% of a batch-64 decode step on 2 cores. References: cute_kernels/cpu/fused_ops.py.
 * Rows are split over OpenMP threads; small inputs stay on the calling thread.
 */
#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>

#define PARALLEL_MIN 32768 /* elements below which threading costs more than it saves */

/* h = rms_norm(x + residual) * w, and res_out = x + residual; residual NULL means zeros
 * (the first layer), and then res_out is not written. */
void add_rms_norm_f32(const float *x, const float *residual, const float *w, float *res_out, float *h,
                      int64_t rows, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *hr = h + r * dim, sum = 0.f;
        if (residual != NULL) {
            const float *rr = residual + r * dim;
            float *outr = res_out + r * dim;
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < dim; i++) {
                const float s = xr[i] + rr[i];
                outr[i] = s;
                sum += s * s;
            }
            xr = outr;
        } else {
#pragma omp simd reduction(+ : sum)
            for (int64_t i = 0; i < dim; i++) sum += xr[i] * xr[i];
        }
        const float inv = 1.f / sqrtf(sum / (float)dim + eps);
#pragma omp simd
        for (int64_t i = 0; i < dim; i++) hr[i] = xr[i] * inv * w[i];
    }
}

/* out[r] = silu(gate_up[r, :inter]) * gate_up[r, inter:]. */
void silu_and_mul_f32(const float *gate_up, float *out, int64_t rows, int64_t inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
#pragma omp simd  /* vector expf from glibc's libmvec; clamped, so it never overflows */
        for (int64_t i = 0; i < inter; i++) o[i] = g[i] / (1.f + expf(fminf(-g[i], 80.f))) * u[i];
    }
}

/* In place, rotate-half convention: each head vector [x1, x2] of token t becomes
 * [x1 cos - x2 sin, x2 cos + x1 sin] with cos/sin [tokens, d/2]. Token t's heads start at
 * x + t * token_stride and are d apart. */
void rope_f32(float *x, const float *cos_t, const float *sin_t, int64_t tokens, int64_t heads, int64_t d,
              int64_t token_stride) {
    const int64_t half = d / 2;
#pragma omp parallel for schedule(static) if (tokens * heads * d >= PARALLEL_MIN)
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos_t + t * half, *s = sin_t + t * half;
        for (int64_t h = 0; h < heads; h++) {
            float *x1 = x + t * token_stride + h * d, *x2 = x1 + half;
#pragma omp simd
            for (int64_t i = 0; i < half; i++) {
                const float a = x1[i], b = x2[i];
                x1[i] = a * c[i] - b * s[i];
                x2[i] = b * c[i] + a * s[i];
            }
        }
    }
}
