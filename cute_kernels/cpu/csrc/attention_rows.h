/* Paged decode attention, shared by cpu_decode_attention.c and the fused decode step (cpu_decode_step.c):
 * scores of a GQA group's query heads against the paged K rows, softmax, weighted sum of the V rows.
 * Layouts: k/v cache [num_blocks, BS, HKV, D], a sequence's block table of int32 block ids.
 *
 * Split-KV: a sequence's context is cut into chunks of KV_CHUNK tokens (whole blocks), each a task of its
 * own (per KV head, or for all KV heads at once: heads_per_task) that leaves one partial (unnormalized
 * sum, max, sum of exps) per KV head; merge_chunks combines them by log-sum-exp. So both cores share one
 * long sequence, and since the cut depends on the context length alone and a head's arithmetic not on
 * its task's other heads, a row's bits do not depend on its batch or on the thread count.
 *
 * Blocking: within a block every query head of the group is scored against 4 K rows at once (8 on the
 * AVX-512 route, attention_zmm.h, for head dims that are a multiple of 32; each K element loaded once for
 * all heads), and V rows are weighed into every head's accumulators in registers. A bf16 cache is widened in registers on load (a 16-bit shift, no AVX-512 BF16 needed);
 * fp32 and bf16 thus run the same fp32 arithmetic in the same order, so a bf16 cache gives bit for bit
 * the fp32 result on its widened copy. 8-bit rows (and every row on the portable route) are widened
 * into per-thread scratch first. */
#ifndef ATTENTION_ROWS_H
#define ATTENTION_ROWS_H
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "attention_groups.h"
#include "kv_elem.h"
#if defined(CPU_VNNI) /* the AVX-512 route */
#include "attention_zmm.h"
#endif

#define KV_CHUNK 256 /* tokens per split-KV chunk, rounded up to whole blocks */

/* Tokens in one chunk for block size bs. */
static inline int64_t chunk_tokens(int64_t bs) { return (KV_CHUNK + bs - 1) / bs * bs; }

static inline int64_t num_chunks(int64_t len, int64_t bs) { return (len + chunk_tokens(bs) - 1) / chunk_tokens(bs); }

/* Floats of one (sequence, KV head, chunk) partial: per head, its d sums, then max and sum of exps. */
static inline int64_t partial_floats(int64_t g_n, int64_t d) { return g_n * (d + 2); }

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

/* A block's rows of one KV head: fp32 or (SIMD routes) bf16 elements, stride elements apart. */
typedef struct {
    const void *p;
    int64_t stride;
    int bf16;
} Rows;

#ifdef CPU_AVX2

static inline __m256 load8_f32(const float *p) { return _mm256_loadu_ps(p); }

static inline __m256 load8_bf16(const uint16_t *p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/* The four sums of s0..s3's lanes, in order. */
static inline __m128 hsum4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* out[g * os + r] = scale * q_g . k_r for G query heads (q [G][d]) and the 4 rows k_r (d % 8 == 0). A
 * row's sum runs in the same order wherever it sits among the four, so a tail repeats rows freely. */
#define SCORE4(SUF, T, G)                                                                                    \
    static inline void score4_##SUF##_##G(const float *q, int64_t d, const T *const *k, float scale, float *out, \
                                          int64_t os) {                                                      \
        __m256 a[G][4];                                                                                      \
        for (int g = 0; g < G; g++) a[g][0] = a[g][1] = a[g][2] = a[g][3] = _mm256_setzero_ps();             \
        for (int64_t i = 0; i < d; i += 8) {                                                                 \
            const __m256 k0 = load8_##SUF(k[0] + i), k1 = load8_##SUF(k[1] + i);                             \
            const __m256 k2 = load8_##SUF(k[2] + i), k3 = load8_##SUF(k[3] + i);                             \
            for (int g = 0; g < G; g++) {                                                                    \
                const __m256 qv = _mm256_loadu_ps(q + g * d + i);                                            \
                a[g][0] = _mm256_fmadd_ps(qv, k0, a[g][0]);                                                  \
                a[g][1] = _mm256_fmadd_ps(qv, k1, a[g][1]);                                                  \
                a[g][2] = _mm256_fmadd_ps(qv, k2, a[g][2]);                                                  \
                a[g][3] = _mm256_fmadd_ps(qv, k3, a[g][3]);                                                  \
            }                                                                                                \
        }                                                                                                    \
        for (int g = 0; g < G; g++)                                                                          \
            _mm_storeu_ps(out + g * os, _mm_mul_ps(hsum4(a[g][0], a[g][1], a[g][2], a[g][3]), _mm_set1_ps(scale))); \
    }

/* acc[g][0:d] += sum_j p[g * ps + j] * v_j for G heads over n rows v_j = v + j * stride, with every
 * head's accumulators for 32 (then 8) columns in registers. */
#define WEIGH(SUF, T, G)                                                                                     \
    static inline void weigh_##SUF##_##G(float *acc, int64_t d, const float *p, int64_t ps, const T *v,      \
                                         int64_t stride, int64_t n) {                                        \
        int64_t i0 = 0;                                                                                      \
        for (; i0 + 32 <= d; i0 += 32) {                                                                     \
            __m256 a[G][4];                                                                                  \
            for (int g = 0; g < G; g++)                                                                      \
                for (int c = 0; c < 4; c++) a[g][c] = _mm256_loadu_ps(acc + g * d + i0 + 8 * c);             \
            for (int64_t j = 0; j < n; j++) {                                                                \
                const T *vj = v + j * stride + i0;                                                           \
                for (int c = 0; c < 4; c++) {                                                                \
                    const __m256 vc = load8_##SUF(vj + 8 * c);                                               \
                    for (int g = 0; g < G; g++) a[g][c] = _mm256_fmadd_ps(_mm256_set1_ps(p[g * ps + j]), vc, a[g][c]); \
                }                                                                                            \
            }                                                                                                \
            for (int g = 0; g < G; g++)                                                                      \
                for (int c = 0; c < 4; c++) _mm256_storeu_ps(acc + g * d + i0 + 8 * c, a[g][c]);             \
        }                                                                                                    \
        for (; i0 < d; i0 += 8) {                                                                            \
            __m256 a[G];                                                                                     \
            for (int g = 0; g < G; g++) a[g] = _mm256_loadu_ps(acc + g * d + i0);                            \
            for (int64_t j = 0; j < n; j++) {                                                                \
                const __m256 vc = load8_##SUF(v + j * stride + i0);                                          \
                for (int g = 0; g < G; g++) a[g] = _mm256_fmadd_ps(_mm256_set1_ps(p[g * ps + j]), vc, a[g]);  \
            }                                                                                                \
            for (int g = 0; g < G; g++) _mm256_storeu_ps(acc + g * d + i0, a[g]);                            \
        }                                                                                                    \
    }

#define KERNELS(SUF, T) SCORE4(SUF, T, 1) SCORE4(SUF, T, 2) SCORE4(SUF, T, 3) WEIGH(SUF, T, 1) WEIGH(SUF, T, 2) WEIGH(SUF, T, 3)
KERNELS(f32, float)
KERNELS(bf16, uint16_t)

/* One block's scores (4 K rows at a time) and weighed V rows, per element type. */
#define SCORE_BLOCK(SUF, T) SCORE_GROUPS(score_block_##SUF, score4_##SUF, T, 4) WEIGH_GROUPS(weigh_block_##SUF, weigh_##SUF, T)
SCORE_BLOCK(f32, float)
SCORE_BLOCK(bf16, uint16_t)
#endif

/* A layer's K and V caches of one element type; k_scale / v_scale: an 8-bit cache's fp32 scale per KV
 * head (NULL for the float types); stage: the calling thread's scratch of block_size * head_dim floats,
 * into which a block's rows of one KV head are widened where they are not read in place. */
typedef struct {
    const void *k, *v;
    int kind; /* KV_F32, KV_BF16, KV_I8 or KV_E4M3 */
    float *stage;
    const float *k_scale, *v_scale;
} KVCache;

/* The stage a KVCache needs (floats; 0: none): every kind but fp32 may be widened there. */
static inline int64_t stage_floats(int kind, int64_t bs, int64_t d) { return kind == KV_F32 ? 0 : bs * d; }

/* KV head kvh's first n rows of block blk: in place for fp32 (and bf16 where the SIMD loads widen
 * it), else widened into kc->stage. */
static inline Rows block_rows(const KVCache *kc, const void *cache, const float *scales, int32_t blk, int64_t kvh,
                              int64_t n, int64_t hkv, int64_t d, int64_t bs) {
    const int64_t at = ((int64_t)blk * bs * hkv + kvh) * d;
    if (kc->kind == KV_F32) return (Rows){(const float *)cache + at, hkv * d, 0};
#ifdef CPU_AVX2
    if (kc->kind == KV_BF16 && d % 8 == 0) return (Rows){(const uint16_t *)cache + at, hkv * d, 1};
#endif
    const float scale = kv_quantized(kc->kind) ? scales[kvh] : 1.f;
    for (int64_t j = 0; j < n; j++) kv_row_f32(cache, kc->kind, at + j * hkv * d, d, scale, kc->stage + j * d);
    return (Rows){kc->stage, d, 0};
}

/* Whether rows of d values take attention_zmm.h's kernels, whose queries and V sums are permuted. */
static inline int zmm_rows(int64_t d) {
#ifdef ATTENTION_ZMM_H
    return d % 32 == 0;
#else
    (void)d;
    return 0;
#endif
}

static inline void score_block(const float *q, int64_t g_n, int64_t d, Rows k, int64_t n, float scale, float *scores,
                               int64_t ss) {
#ifdef ATTENTION_ZMM_H
    if (zmm_rows(d)) {
        if (k.bf16) zscore_block_bf16(q, g_n, d, k.p, k.stride, n, scale, scores, ss);
        else zscore_block_f32(q, g_n, d, k.p, k.stride, n, scale, scores, ss);
        return;
    }
#endif
#ifdef CPU_AVX2
    if (d % 8 == 0) {
        if (k.bf16) score_block_bf16(q, g_n, d, k.p, k.stride, n, scale, scores, ss);
        else score_block_f32(q, g_n, d, k.p, k.stride, n, scale, scores, ss);
        return;
    }
#endif
    for (int64_t g = 0; g < g_n; g++)
        for (int64_t j = 0; j < n; j++) scores[g * ss + j] = scale * dot(q + g * d, (const float *)k.p + j * k.stride, d);
}

static inline void weigh_block(float *acc, int64_t g_n, int64_t d, const float *p, int64_t ps, Rows v, int64_t n) {
#ifdef ATTENTION_ZMM_H
    if (zmm_rows(d)) {
        if (v.bf16) zweigh_block_bf16(acc, g_n, d, p, ps, v.p, v.stride, n);
        else zweigh_block_f32(acc, g_n, d, p, ps, v.p, v.stride, n);
        return;
    }
#endif
#ifdef CPU_AVX2
    if (d % 8 == 0) {
        if (v.bf16) weigh_block_bf16(acc, g_n, d, p, ps, v.p, v.stride, n);
        else weigh_block_f32(acc, g_n, d, p, ps, v.p, v.stride, n);
        return;
    }
#endif
    for (int64_t g = 0; g < g_n; g++)
        for (int64_t j = 0; j < n; j++) axpy(acc + g * d, p[g * ps + j], (const float *)v.p + j * v.stride, d);
}

/* Tokens of the block that starts at t0 in a span ending at t_end (<= 0: none). */
static inline int64_t rows_in(int64_t t0, int64_t t_end, int64_t bs) { return t_end - t0 < bs ? t_end - t0 : bs; }

/* Bytes of one cache element of type kind. */
static inline int64_t kv_elem_bytes(int kind) { return kind == KV_F32 ? 4 : kind == KV_BF16 ? 2 : 1; }

/* Asks for rows j0..j1 of KV head kvh in block blk ahead of use. */
static inline void prefetch_rows(const KVCache *kc, const void *cache, int32_t blk, int64_t kvh, int64_t j0,
                                 int64_t j1, int64_t hkv, int64_t d, int64_t bs) {
    const int64_t eb = kv_elem_bytes(kc->kind), row = d * eb, stride = hkv * d * eb;
    const char *p = (const char *)cache + ((int64_t)blk * bs * hkv + kvh) * d * eb;
    for (int64_t j = j0; j < j1; j++)
        for (int64_t b = 0; b < row; b += 64) __builtin_prefetch(p + j * stride + b, 0, 3);
}

/* Scores of one KV head's g_n query heads q [g_n][d] against its rows of the block at t0 (n rows), 4 rows
 * at a time, asking meanwhile for the rows read next: the next block's K rows, or after the last the
 * chunk's first V rows (a sequence's blocks lie anywhere in the pool, so the hardware prefetcher loses
 * the stream at every block edge). */
static inline void score_rows(const float *q, const KVCache *kc, const int32_t *table, int64_t t_begin, int64_t t0,
                              int64_t t_end, int64_t g_n, int64_t kvh, int64_t hkv, int64_t d, int64_t bs, float scale,
                              float *scores, int64_t ss) {
    const int64_t n = rows_in(t0, t_end, bs), next = rows_in(t0 + bs, t_end, bs);
    const Rows k = block_rows(kc, kc->k, kc->k_scale, table[t0 / bs], kvh, n, hkv, d, bs);
    const int64_t eb = k.bf16 ? 2 : 4, step = zmm_rows(d) ? 8 : 4; /* rows per score call */
    for (int64_t j = 0; j < n; j += step) {
        const int64_t nj = n - j < step ? n - j : step;
        if (next > 0) prefetch_rows(kc, kc->k, table[t0 / bs + 1], kvh, j, j + nj < next ? j + nj : next, hkv, d, bs);
        else prefetch_rows(kc, kc->v, table[t_begin / bs], kvh, j, j + nj, hkv, d, bs);
        score_block(q, g_n, d, (Rows){(const char *)k.p + j * k.stride * eb, k.stride, k.bf16}, nj, scale,
                    scores + t0 - t_begin + j, ss);
    }
}

/* The partials of KV heads kvh0..kvh0 + hg (each with its g_n query heads, q [hg * g_n][d]) over tokens
 * t_begin..t_end (block aligned at t_begin): part[h * part_stride + g] = (sum_t exp(s_t - max) v_t [d], max,
 * sum_t exp(s_t - max)). The heads are interleaved block by block, so with hg = hkv every token row is read
 * whole, in order; each head's arithmetic is the same whatever hg is. scores: hg * g_n * chunk_tokens(bs) floats. */
static inline void attend_chunk(const float *q, const KVCache *kc, const int32_t *table, int64_t t_begin,
                                int64_t t_end, int64_t g_n, int64_t kvh0, int64_t hg, int64_t hkv, int64_t d,
                                int64_t bs, float scale, float *scores, float *part, int64_t part_stride) {
    const int64_t ss = t_end - t_begin, pf = d + 2, hs = g_n * ss; /* hs: one KV head's scores */
    float permuted[zmm_rows(d) ? hg * g_n * d : 1];
#ifdef ATTENTION_ZMM_H
    if (zmm_rows(d)) { /* the queries in the zmm kernels' order (the V sums come out in it too) */
        zmm_permute(q, permuted, hg * g_n, d);
        q = permuted;
    }
#endif
    for (int64_t t0 = t_begin; t0 < t_end; t0 += bs)
        for (int64_t h = 0; h < hg; h++)
            score_rows(q + h * g_n * d, kc, table, t_begin, t0, t_end, g_n, kvh0 + h, hkv, d, bs, scale, scores + h * hs, ss);
    float acc[hg * g_n * d];
    for (int64_t h = 0; h < hg; h++)
        for (int64_t g = 0; g < g_n; g++) {
            float *s = scores + h * hs + g * ss, m = -FLT_MAX, sum = 0.f, *pg = part + h * part_stride + g * pf;
#pragma omp simd reduction(max : m)
            for (int64_t t = 0; t < ss; t++) m = s[t] > m ? s[t] : m;
#pragma omp simd reduction(+ : sum) /* vector expf from glibc's libmvec */
            for (int64_t t = 0; t < ss; t++) {
                s[t] = expf(s[t] - m);
                sum += s[t];
            }
            pg[d] = m;
            pg[d + 1] = sum;
        }
    memset(acc, 0, sizeof acc);
    for (int64_t t0 = t_begin; t0 < t_end; t0 += bs) {
        const int64_t n = rows_in(t0, t_end, bs), next = rows_in(t0 + bs, t_end, bs);
        for (int64_t h = 0; h < hg; h++) {
            if (next > 0) prefetch_rows(kc, kc->v, table[t0 / bs + 1], kvh0 + h, 0, next, hkv, d, bs);
            const Rows v = block_rows(kc, kc->v, kc->v_scale, table[t0 / bs], kvh0 + h, n, hkv, d, bs);
            weigh_block(acc + h * g_n * d, g_n, d, scores + h * hs + t0 - t_begin, ss, v, n);
        }
    }
    for (int64_t h = 0; h < hg; h++)
        for (int64_t g = 0; g < g_n; g++) {
#ifdef ATTENTION_ZMM_H
            if (zmm_rows(d)) {
                zmm_unpermute(acc + (h * g_n + g) * d, part + h * part_stride + g * pf, d);
                continue;
            }
#endif
            memcpy(part + h * part_stride + g * pf, acc + (h * g_n + g) * d, sizeof(float) * d);
        }
}

/* out[g][0:d] = softmax-weighted sum of the g_n heads over nch chunk partials part [nch][g_n][d + 2]:
 * each chunk's sums rescaled by exp(its max - the overall max). */
static inline void merge_chunks(const float *part, int64_t nch, int64_t g_n, int64_t d, float *out) {
    const int64_t pf = d + 2, stride = g_n * pf;
    for (int64_t g = 0; g < g_n; g++) {
        float m = -FLT_MAX, l = 0.f, *o = out + g * d;
        for (int64_t c = 0; c < nch; c++) m = fmaxf(m, part[c * stride + g * pf + d]);
        memset(o, 0, sizeof(float) * d);
        for (int64_t c = 0; c < nch; c++) {
            const float *pc = part + c * stride + g * pf, w = expf(pc[d] - m);
            l += w * pc[d + 1];
            axpy(o, w, pc, d);
        }
        const float inv = 1.f / l;
        for (int64_t i = 0; i < d; i++) o[i] *= inv;
    }
}

/* KV heads per split-KV task: all of them (each token row read whole, in order) when the rows' chunks
 * alone make tasks enough for `threads` threads, else one (so a short batch-1 context still spans both
 * cores). The partials, and so the result, are the same either way. */
static inline int64_t heads_per_task(int64_t rows, int64_t max_chunks, int64_t hkv, int64_t threads) {
    return rows * max_chunks >= 4 * threads ? hkv : 1;
}

/* Task `task` of a decode attention over rows of lengths lens, of (row, group of hg KV heads, chunk) tasks
 * (a chunk past its row's length does nothing): its partials into parts [rows][hkv][max_chunks][partial].
 * q: the rows' queries [rows][q_stride], heads of a group adjacent. scores: hg * g_n * chunk_tokens(bs). */
static inline void attend_task(int64_t task, int64_t hg, const float *q, int64_t q_stride, const KVCache *kc,
                               const int32_t *tables, int64_t max_blocks, const int32_t *lens, int64_t max_chunks,
                               int64_t g_n, int64_t hkv, int64_t d, int64_t bs, float scale, float *scores,
                               float *parts) {
    const int64_t groups = hkv / hg, c = task % max_chunks, kvh = task / max_chunks % groups * hg;
    const int64_t r = task / max_chunks / groups, t_begin = c * chunk_tokens(bs), len = lens[r];
    if (t_begin >= len) return;
    const int64_t t_end = t_begin + chunk_tokens(bs) < len ? t_begin + chunk_tokens(bs) : len, pf = partial_floats(g_n, d);
    attend_chunk(q + r * q_stride + kvh * g_n * d, kc, tables + r * max_blocks, t_begin, t_end, g_n, kvh, hg, hkv, d,
                 bs, scale, scores, parts + ((r * hkv + kvh) * max_chunks + c) * pf, max_chunks * pf);
}

/* out [rows][out_stride] of (row, KV head) pair `pair` from its chunks' partials, as attend_task left them. */
static inline void merge_pair(int64_t pair, const float *parts, const int32_t *lens, int64_t max_chunks, int64_t g_n,
                              int64_t hkv, int64_t d, int64_t bs, float *out, int64_t out_stride) {
    const int64_t r = pair / hkv, kvh = pair % hkv;
    merge_chunks(parts + pair * max_chunks * partial_floats(g_n, d), num_chunks(lens[r], bs), g_n, d,
                 out + r * out_stride + kvh * g_n * d);
}

#endif
