/* bf16 x bf16 dot products with fp32 accumulation, for linears whose weights are held in bf16.
 *
 * Activations are rounded to bf16 once per layer input (to_bf16_rows, round to nearest even, as
 * torch's .bfloat16()), so every route multiplies the same bf16 pairs: each product is exact in fp32
 * and the routes differ only in the order of the fp32 sums.
 *   AVX-512 BF16 (vdpbf16ps, 32 pairs per instruction) where the compiler targets it;
 *   AVX2: 8 bf16 widened to fp32 (a 16-bit shift) and FMA'd;
 *   portable C: the same in scalar code.
 * bf16_tile: out[r * ldo + c] = x row r . w row c for r < nr <= 4, c < nc <= 4. Used by
 * cpu_bf16_gemm.c (the per-layer linear) and cpu_decode_step.c (the fused step's GEMVs). */
#ifndef BF16_DOT_H
#define BF16_DOT_H

#include <stdint.h>
#include <string.h>

#include "isa.h"
#include "kv_elem.h" /* f32_to_bf16 (nearest even, as torch) and bf16_to_f32, shared with the KV cache */

#if defined(CPU_VNNI) && defined(__AVX512BF16__)
#define CPU_BF16 1
#endif

#define BF16_TILE 4 /* rows and columns of one register tile */

/* y = x rounded as f32_to_bf16 does, 16 at a time on AVX-512 (the same integer steps: denormals round, NaNs
 * stay quiet NaNs; vcvtneps2bf16 would flush denormals): the AMX linears round every activation row. */
static inline void to_bf16_row(const float *x, uint16_t *y, int64_t k) {
    int64_t i = 0;
#if defined(CPU_VNNI)
    const __m512i magnitude = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff), quiet = _mm512_set1_epi32(0x40);
    for (; i + 16 <= k; i += 16) {
        const __m512i u = _mm512_loadu_si512(x + i), high = _mm512_srli_epi32(u, 16);
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, magnitude), inf);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, half), _mm512_and_si512(high, one)), 16);
        r = _mm512_mask_or_epi32(r, nan, high, quiet);
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(r));
    }
#endif
    for (; i < k; i++) y[i] = f32_to_bf16(x[i]);
}

/* Which instruction this build multiplies with, for tests and logs. */
static inline const char *bf16_dot_path(void) {
#if defined(CPU_BF16)
    return "vdpbf16ps";
#elif defined(CPU_AVX2)
    return "avx2-fma";
#else
    return "portable-c";
#endif
}

#if defined(CPU_BF16)
static inline float hsum512(__m512 v) { return _mm512_reduce_add_ps(v); }

/* R x C tile (compile-time R, C once inlined): 32 pairs per step, the tail by a masked load. */
static inline __attribute__((always_inline)) void bf16_tile_rc(const uint16_t *x, int64_t ldx, const uint16_t *w,
                                                                int64_t ldw, int64_t k, float *out, int64_t ldo,
                                                                const int R, const int C) {
    __m512 acc[BF16_TILE][BF16_TILE];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < k; i += 32) {
        const __mmask32 mask = k - i >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (k - i)) - 1u);
        __m512bh xv[BF16_TILE], wv[BF16_TILE];
        for (int r = 0; r < R; r++) xv[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + r * ldx + i);
        for (int c = 0; c < C; c++) wv[c] = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + c * ldw + i);
        for (int r = 0; r < R; r++)
            for (int c = 0; c < C; c++) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv[r], wv[c]);
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) out[r * ldo + c] = hsum512(acc[r][c]);
}
#elif defined(CPU_AVX2)
static inline __m256 bf16x8(const uint16_t *p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

static inline __attribute__((always_inline)) void bf16_tile_rc(const uint16_t *x, int64_t ldx, const uint16_t *w,
                                                                int64_t ldw, int64_t k, float *out, int64_t ldo,
                                                                const int R, const int C) {
    __m256 acc[BF16_TILE][BF16_TILE];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) {
        __m256 xv[BF16_TILE];
        for (int r = 0; r < R; r++) xv[r] = bf16x8(x + r * ldx + i);
        for (int c = 0; c < C; c++) {
            const __m256 wv = bf16x8(w + c * ldw + i);
            for (int r = 0; r < R; r++) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = hsum256(acc[r][c]);
            for (int64_t j = i; j < k; j++) s += bf16_to_f32(x[r * ldx + j]) * bf16_to_f32(w[c * ldw + j]);
            out[r * ldo + c] = s;
        }
}
#else
static inline void bf16_tile_rc(const uint16_t *x, int64_t ldx, const uint16_t *w, int64_t ldw, int64_t k,
                                float *out, int64_t ldo, const int R, const int C) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            float s = 0.f;
            for (int64_t j = 0; j < k; j++) s += bf16_to_f32(x[r * ldx + j]) * bf16_to_f32(w[c * ldw + j]);
            out[r * ldo + c] = s;
        }
}
#endif

/* Each (nr, nc) a tile of its own, so the SIMD routes keep their accumulators in registers. */
static inline void bf16_tile(const uint16_t *x, int64_t ldx, int nr, const uint16_t *w, int64_t ldw, int nc,
                             int64_t k, float *out, int64_t ldo) {
#define BF16_ROWS(C)                                                      \
    switch (nr) {                                                         \
    case 4: bf16_tile_rc(x, ldx, w, ldw, k, out, ldo, 4, C); break;       \
    case 3: bf16_tile_rc(x, ldx, w, ldw, k, out, ldo, 3, C); break;       \
    case 2: bf16_tile_rc(x, ldx, w, ldw, k, out, ldo, 2, C); break;       \
    default: bf16_tile_rc(x, ldx, w, ldw, k, out, ldo, 1, C); break;      \
    }
    if (nc == BF16_TILE) {
        BF16_ROWS(4)
    } else {
        for (int c = 0; c < nc; c++, w += ldw, out++) BF16_ROWS(1)
    }
#undef BF16_ROWS
}

#endif
