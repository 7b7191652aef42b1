/* What the two bf16 prefill attention routes share (the AMX tiles in attention_tiles.h, vdpbf16ps in
 * cpu_prefill_attention_amx.c): exp2 for the online softmax in base 2, fp32 -> bf16 pairs, and a key's
 * K and V rows as fp32 wherever they live (the paged prefix, the new rows). */
#ifndef BF16_ATTENTION_H
#define BF16_ATTENTION_H
#include <stdint.h>
#include <string.h>

#include "bf16_dot.h" /* CPU_BF16 */
#include "kv_elem.h"
#include "prefill_problem.h"

#if defined(CPU_BF16)
#define LOG2E 1.4426950408889634f
#define NEG (-1e30f)

/* 2^x for x <= 0 (below -1000: 0): 2^f on f in [-1/2, 1/2] by Taylor to degree 5, times 2^n exactly
 * (relative error 3e-6). */
static inline __m512 exp2_ps(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-1000.f));
    const __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_set1_ps(1.3333558e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

/* 32 floats as 16 bf16 pairs, word w = (x[2w], x[2w + 1]), rounded to nearest even as f32_to_bf16. */
static inline __m512i bf16_pairs(const float *x) {
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x));
}

/* The last of n non-decreasing starts at or below i: which sequence (or (sequence, KV head)) packed block
 * i of a call belongs to, where starts[j] is the first block of the j-th. */
static inline int64_t owner_of(const int64_t *starts, int64_t n, int64_t i) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        const int64_t mid = (lo + hi + 1) / 2;
        if (starts[mid] <= i) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Key t's K and V rows of (sequence b, KV head kvh) as fp32 (zeros past the sequence's keys). */
static inline void key_rows(const Problem *p, int64_t b, int64_t kvh, int64_t t, float *stage, const float **kr,
                            const float **vr) {
    const int64_t d = p->d;
    if (t >= keys_of(p, b)) {
        memset(stage, 0, sizeof(float) * 2 * d);
        *kr = stage, *vr = stage + d;
        return;
    }
    int in_cache;
    const int64_t off = key_offset(p, b, t, p->prefix[b], kvh, &in_cache);
    const float ks = p->k_scale != NULL ? p->k_scale[kvh] : 1.f, vs = p->v_scale != NULL ? p->v_scale[kvh] : 1.f;
    *kr = in_cache ? kv_row_f32(p->k_cache, p->kv_kind, off, d, ks, stage) : p->k + off;
    *vr = in_cache ? kv_row_f32(p->v_cache, p->kv_kind, off, d, vs, stage + d) : p->v + off;
}
#endif
#endif
