/* One row of each fused elementwise op of a decoder layer, fp32, shared by cpu_fused_ops.c (rows split
 * over threads) and the fused decode step (cpu_decode_step.c). */
#ifndef FUSED_ROWS_H
#define FUSED_ROWS_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "isa.h"

/* h = rms_norm(x + residual) * w, and res_out = x + residual; residual NULL means zeros (the first
 * layer), and then res_out is not written. */
static inline void add_rms_norm_row(const float *xr, const float *rr, const float *w, float *outr, float *hr,
                                    int64_t dim, float eps) {
    float sum = 0.f;
    if (rr != NULL) {
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

/* o = silu(g) * u over n values. */
static inline void silu_mul_row(const float *g, const float *u, float *o, int64_t n) {
#pragma omp simd simdlen(16) /* vector expf from glibc's libmvec; clamped, so it never overflows */
    for (int64_t i = 0; i < n; i++) o[i] = g[i] / (1.f + expf(fminf(-g[i], 80.f))) * u[i];
}

/* In place, rotate-half: head vector [x1, x2] becomes [x1 cos - x2 sin, x2 cos + x1 sin], cos/sin [d/2]. */
static inline void rope_head(float *x1, const float *c, const float *s, int64_t half) {
    float *x2 = x1 + half;
#pragma omp simd
    for (int64_t i = 0; i < half; i++) {
        const float a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
    }
}

#endif
