/* Paged decode attention over one task's heads, shared by cpu_decode_attention.c and the fused decode
 * step (cpu_decode_step.c): scores of a GQA group's query heads against the paged K rows, softmax,
 * weighted sum of the V rows. Layouts: k/v cache [num_blocks, BS, HKV, D], a sequence's block table
 * of int32 block ids. */
#ifndef ATTENTION_ROWS_H
#define ATTENTION_ROWS_H
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kv_elem.h"

static inline float dot(const float *restrict a, const float *restrict b, int64_t d) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < d; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int64_t d) {
#pragma omp simd
    for (int64_t i = 0; i < d; i++) y[i] += a * x[i];
}

#ifdef CPU_AVX2

/* The four sums of s0..s3's lanes, in order. */
static inline __m128 hsum4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* out[j] = scale * q . k_j for n rows k_j = k + j * stride (d % 8 == 0): four rows share each
 * horizontal reduction, and q's chunks are loaded once per four rows. */
static inline void dot_rows_avx2(const float *q, const float *k, int64_t stride, int64_t n, int64_t d, float scale,
                          float *out) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + j * stride;
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            s0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), s0);
            s1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + stride + i), s1);
            s2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * stride + i), s2);
            s3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * stride + i), s3);
        }
        _mm_storeu_ps(out + j, _mm_mul_ps(hsum4(s0, s1, s2, s3), _mm_set1_ps(scale)));
    }
    for (; j < n; j++) out[j] = scale * dot(q, k + j * stride, d);
}

/* acc[0:W*8] += sum_j p[j] * v_j[0:W*8] with the W accumulators in registers. */
#define WEIGH_CHUNK(W)                                                                               \
    static inline void weigh_chunk_##W(float *acc, const float *p, const float *v, int64_t stride, int64_t n) { \
        __m256 a[W];                                                                                 \
        for (int r = 0; r < W; r++) a[r] = _mm256_loadu_ps(acc + 8 * r);                             \
        for (int64_t j = 0; j < n; j++, v += stride) {                                               \
            const __m256 pj = _mm256_set1_ps(p[j]);                                                  \
            for (int r = 0; r < W; r++) a[r] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * r), a[r]); \
        }                                                                                            \
        for (int r = 0; r < W; r++) _mm256_storeu_ps(acc + 8 * r, a[r]);                             \
    }
WEIGH_CHUNK(8)
WEIGH_CHUNK(1)

static inline void weigh_rows_avx2(float *acc, const float *p, const float *v, int64_t stride, int64_t n, int64_t d) {
    int64_t i = 0;
    for (; i + 64 <= d; i += 64) weigh_chunk_8(acc + i, p, v + i, stride, n);
    for (; i < d; i += 8) weigh_chunk_1(acc + i, p, v + i, stride, n);
}
#endif

/* A layer's K and V caches of one element type; k_scale / v_scale: an 8-bit cache's fp32 scale per KV
 * head (NULL for the float types); stage: the calling thread's scratch of block_size * head_dim floats,
 * into which a bf16 or 8-bit block's rows of one KV head are widened. */
typedef struct {
    const void *k, *v;
    int kind; /* KV_F32, KV_BF16, KV_I8 or KV_E4M3 */
    float *stage;
    const float *k_scale, *v_scale;
} KVCache;

/* KV head kvh's first n rows of block blk as fp32, *row apart: in place for fp32 (row hkv * d),
 * widened into kc->stage otherwise (row d; once per block and head, reused by the group's heads). */
static inline const float *block_rows_f32(const KVCache *kc, const void *cache, const float *scales, int32_t blk,
                                          int64_t kvh, int64_t n, int64_t hkv, int64_t d, int64_t bs, int64_t *row) {
    const int64_t at = ((int64_t)blk * bs * hkv + kvh) * d;
    if (kc->kind == KV_F32) {
        *row = hkv * d;
        return (const float *)cache + at;
    }
    *row = d;
    const float scale = kv_quantized(kc->kind) ? scales[kvh] : 1.f;
    for (int64_t j = 0; j < n; j++) kv_row_f32(cache, kc->kind, at + j * hkv * d, d, scale, kc->stage + j * d);
    return kc->stage;
}

/* scores[h * len + t] = scale * q_h . k_t for the task's query heads h (those of KV heads kv0..kv1)
 * over its whole context. Blocks are the outer loop, so each block's K rows are streamed from
 * memory once, contiguously, and reused from cache by every head of the task. */
static inline void score_rows(const float *q, const KVCache *kc, const int32_t *table, int64_t len, int64_t g_n,
                       int64_t kv0, int64_t kv1, int64_t hkv, int64_t d, int64_t bs, float scale, float *scores) {
    for (int64_t t0 = 0, blk = 0; t0 < len; t0 += bs, blk++) {
        const int64_t n = len - t0 < bs ? len - t0 : bs;
        for (int64_t kvh = kv0; kvh < kv1; kvh++) {
            int64_t row;
            const float *k = block_rows_f32(kc, kc->k, kc->k_scale, table[blk], kvh, n, hkv, d, bs, &row);
            for (int64_t g = 0; g < g_n; g++) {
                const int64_t h = (kvh - kv0) * g_n + g;
#ifdef CPU_AVX2
                if (d % 8 == 0) {
                    dot_rows_avx2(q + h * d, k, row, n, d, scale, scores + h * len + t0);
                    continue;
                }
#endif
                for (int64_t j = 0; j < n; j++) scores[h * len + t0 + j] = scale * dot(q + h * d, k + j * row, d);
            }
        }
    }
}

/* In place: each of the n rows of scores becomes exp(s - max); inv_sum gets the rows' 1 / sum. */
static inline void softmax_rows(float *scores, int64_t len, int64_t n, float *inv_sum) {
    for (int64_t g = 0; g < n; g++) {
        float *s = scores + g * len, m = -FLT_MAX, sum = 0.f;
#pragma omp simd reduction(max : m)
        for (int64_t t = 0; t < len; t++) m = s[t] > m ? s[t] : m;
#pragma omp simd reduction(+ : sum)  /* vector expf from glibc's libmvec */
        for (int64_t t = 0; t < len; t++) {
            s[t] = expf(s[t] - m);
            sum += s[t];
        }
        inv_sum[g] = 1.f / sum;
    }
}

/* acc[h] = sum_t probs[h, t] * v_t for the task's heads, blocks outermost as in score_rows. */
static inline void weigh_values(const KVCache *kc, const int32_t *table, const float *probs, int64_t len,
                         int64_t g_n, int64_t kv0, int64_t kv1, int64_t hkv, int64_t d, int64_t bs, float *acc) {
    memset(acc, 0, sizeof(float) * (kv1 - kv0) * g_n * d);
    for (int64_t t0 = 0, blk = 0; t0 < len; t0 += bs, blk++) {
        const int64_t n = len - t0 < bs ? len - t0 : bs;
        for (int64_t kvh = kv0; kvh < kv1; kvh++) {
            int64_t row;
            const float *v = block_rows_f32(kc, kc->v, kc->v_scale, table[blk], kvh, n, hkv, d, bs, &row);
            for (int64_t g = 0; g < g_n; g++) {
                const int64_t h = (kvh - kv0) * g_n + g;
#ifdef CPU_AVX2
                if (d % 8 == 0) {
                    weigh_rows_avx2(acc + h * d, probs + h * len + t0, v, row, n, d);
                    continue;
                }
#endif
                for (int64_t j = 0; j < n; j++) axpy(acc + h * d, probs[h * len + t0 + j], v + j * row, d);
            }
        }
    }
}

/* out[h] = softmax(scale * q_h . K) V for the task's query heads (those of KV heads kv0..kv1) over the
 * first len cached tokens; scores [heads * len], acc [heads * d] and inv_sum [heads] are work space. */
static inline void attend_heads(const float *q, const KVCache *kc, const int32_t *table,
                                int64_t len, int64_t g_n, int64_t kv0, int64_t kv1, int64_t hkv, int64_t d,
                                int64_t bs, float scale, float *scores, float *acc, float *inv_sum, float *out) {
    const int64_t task_heads = (kv1 - kv0) * g_n;
    score_rows(q, kc, table, len, g_n, kv0, kv1, hkv, d, bs, scale, scores);
    softmax_rows(scores, len, task_heads, inv_sum);
    weigh_values(kc, table, scores, len, g_n, kv0, kv1, hkv, d, bs, acc);
    for (int64_t h = 0; h < task_heads; h++)
        for (int64_t i = 0; i < d; i++) out[h * d + i] = acc[h * d + i] * inv_sum[h];
}

#endif
