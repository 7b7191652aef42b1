/* The decode attention's score and weigh kernels on 512-bit registers, for head dims that are a multiple of 32
 * (attention_rows.h takes them on the AVX-512 route; its AVX2 kernels serve the other routes and dims).
 *
 * Why: on the 2-core AVX-512 machine the 256-bit kernels spent ~88 vector ops per (token, KV head) of the default
 * model (d 64, 3 query heads per KV head): every bf16 element widened in two ops, 8 FMAs per score, 8-lane
 * FMAs for the V rows. Here a row is read 32 values at a time as two vectors, its even elements and its odd ones:
 * a bf16 row's 32 values are one 64-byte load, whose dwords shifted up 16 bits are the even elements and whose
 * dwords' high halves are the odd ones (one op per 16 values); an fp32 row's are two permutes of two loads, so
 * both caches feed the same fp32 values to the same lanes, and a bf16 cache still gives bit for bit the fp32
 * result on its widened copy. The query heads are laid out the same way once per task (zmm_permute), and the V
 * sums stay in that order until the task writes its partial (zmm_unpermute): a sum is a sum in any lane order.
 * Scores: 8 K rows x up to 3 heads in 24 accumulators, then one reduction tree per head (zmm_sum8: ~3 ops a
 * score) instead of a horizontal sum per 4 scores.
 * Order: a score's lanes and tree are fixed by its row's place in its 8-row group (its position in the block),
 * the V sums by the rows' order, so a row's bits do not depend on its batch or on the thread count.
 */
#ifndef ATTENTION_ZMM_H
#define ATTENTION_ZMM_H
#include <immintrin.h>
#include <stdint.h>

#include "attention_groups.h"

#define ZSCORE_ROWS 8 /* K rows one score call takes */

static inline __m512i zmm_even_idx(void) { return _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30); }

static inline __m512i zmm_odd_idx(void) { return _mm512_add_epi32(zmm_even_idx(), _mm512_set1_epi32(1)); }

/* Values 0..31 of a row as (even, odd) vectors. */
static inline void zmm_pair_f32(const float *p, __m512 *even, __m512 *odd) {
    const __m512 a = _mm512_loadu_ps(p), b = _mm512_loadu_ps(p + 16);
    *even = _mm512_permutex2var_ps(a, zmm_even_idx(), b);
    *odd = _mm512_permutex2var_ps(a, zmm_odd_idx(), b);
}

static inline void zmm_pair_bf16(const uint16_t *p, __m512 *even, __m512 *odd) {
    const __m512i x = _mm512_loadu_si512(p);
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
    *odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
}

/* dst = src's rows of d values in the (even, odd) order of each 32, for `rows` rows. */
static inline void zmm_permute(const float *src, float *dst, int64_t rows, int64_t d) {
    for (int64_t i = 0; i < rows * d; i += 32) {
        __m512 even, odd;
        zmm_pair_f32(src + i, &even, &odd);
        _mm512_storeu_ps(dst + i, even);
        _mm512_storeu_ps(dst + i + 16, odd);
    }
}

/* The inverse of zmm_permute for one row. */
static inline void zmm_unpermute(const float *src, float *dst, int64_t d) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    for (int64_t i = 0; i < d; i += 32) {
        const __m512 even = _mm512_loadu_ps(src + i), odd = _mm512_loadu_ps(src + i + 16);
        _mm512_storeu_ps(dst + i, _mm512_permutex2var_ps(even, lo, odd));
        _mm512_storeu_ps(dst + i + 16, _mm512_permutex2var_ps(even, hi, odd));
    }
}

/* The 8 sums of a[0..7]'s lanes, in order: pairs fold 512 -> 256 -> 128 bits, then within 128. */
static inline __m256 zmm_sum8(const __m512 a[8]) {
    __m512 b[4], c[2];
    for (int i = 0; i < 4; i++) /* 128-bit lanes 0, 1 of b[i]: row 2i's halves summed; 2, 3: row 2i + 1's */
        b[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
    for (int i = 0; i < 2; i++) /* 128-bit lane r of c[i]: row 4i + r's quarters summed */
        c[i] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(b[2 * i], b[2 * i + 1], 0xdd));
    /* per 128-bit lane r: element 0 row r's total, element 1 row 4 + r's */
    const __m512 e = _mm512_add_ps(_mm512_unpacklo_ps(c[0], c[1]), _mm512_unpackhi_ps(c[0], c[1]));
    const __m512 f = _mm512_add_ps(e, _mm512_permute_ps(e, 0x4e));
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, f));
}

/* out[g * os + r] = scale * q_g . k_r for G query heads (q [G][d], permuted) and the 8 rows k_r. */
#define ZSCORE8(SUF, T, G)                                                                                   \
    static inline void zscore8_##SUF##_##G(const float *q, int64_t d, const T *const *k, float scale, float *out, \
                                           int64_t os) {                                                     \
        __m512 a[G][8];                                                                                      \
        _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) for (int g = 0; g < G; g++) a[g][j] = _mm512_setzero_ps(); \
        for (int64_t i = 0; i < d; i += 32) {                                                                \
            _Pragma("GCC unroll 8") for (int j = 0; j < 8; j++) {                                            \
                __m512 even, odd;                                                                            \
                zmm_pair_##SUF(k[j] + i, &even, &odd);                                                       \
                for (int g = 0; g < G; g++) {                                                                \
                    a[g][j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * d + i), even, a[g][j]);               \
                    a[g][j] = _mm512_fmadd_ps(_mm512_loadu_ps(q + g * d + i + 16), odd, a[g][j]);           \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
        for (int g = 0; g < G; g++) _mm256_storeu_ps(out + g * os, _mm256_mul_ps(zmm_sum8(a[g]), _mm256_set1_ps(scale))); \
    }

/* acc[g][0:d] (permuted) += sum_j p[g * ps + j] * v_j for G heads over n rows v_j = v + j * stride, 32 values of
 * every head's sums in registers at a time. */
#define ZWEIGH(SUF, T, G)                                                                                    \
    static inline void zweigh_##SUF##_##G(float *acc, int64_t d, const float *p, int64_t ps, const T *v,     \
                                          int64_t stride, int64_t n) {                                       \
        for (int64_t i = 0; i < d; i += 32) {                                                                \
            __m512 a[G][2];                                                                                  \
            for (int g = 0; g < G; g++) {                                                                    \
                a[g][0] = _mm512_loadu_ps(acc + g * d + i);                                                  \
                a[g][1] = _mm512_loadu_ps(acc + g * d + i + 16);                                             \
            }                                                                                                \
            for (int64_t j = 0; j < n; j++) {                                                                \
                __m512 even, odd;                                                                            \
                zmm_pair_##SUF(v + j * stride + i, &even, &odd);                                             \
                for (int g = 0; g < G; g++) {                                                                \
                    const __m512 pj = _mm512_set1_ps(p[g * ps + j]);                                         \
                    a[g][0] = _mm512_fmadd_ps(pj, even, a[g][0]);                                            \
                    a[g][1] = _mm512_fmadd_ps(pj, odd, a[g][1]);                                             \
                }                                                                                            \
            }                                                                                                \
            for (int g = 0; g < G; g++) {                                                                    \
                _mm512_storeu_ps(acc + g * d + i, a[g][0]);                                                  \
                _mm512_storeu_ps(acc + g * d + i + 16, a[g][1]);                                             \
            }                                                                                                \
        }                                                                                                    \
    }

/* As attention_rows.h's score_block / weigh_block, 8 K rows at a time and into permuted V sums. */
#define ZBLOCK(SUF, T)                                                                                       \
    ZSCORE8(SUF, T, 1) ZSCORE8(SUF, T, 2) ZSCORE8(SUF, T, 3) ZWEIGH(SUF, T, 1) ZWEIGH(SUF, T, 2) ZWEIGH(SUF, T, 3) \
    SCORE_GROUPS(zscore_block_##SUF, zscore8_##SUF, T, ZSCORE_ROWS) WEIGH_GROUPS(zweigh_block_##SUF, zweigh_##SUF, T)
ZBLOCK(f32, float)
ZBLOCK(bf16, uint16_t)

#endif
