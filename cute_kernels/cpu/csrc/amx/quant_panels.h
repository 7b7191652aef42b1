/* A grouped Q4_0, Q4_1 or Q8_0 weight (row_groups.h) as the AMX tiles read it: amx_tiles.h's packer callback,
 * each 32-column panel dequantized to bf16 pairs, for cpu_quant_amx.c (the per-op linear) and cpu_decode_step.c
 * (the fused step past its GEMV rows). Each weight value as quant_blocks.dequantize computes it in fp32,
 * rounded once to bf16.
 *
 * Panel packing from a group's chunk: one 32-byte step holds 4 consecutive values of 8 rows (lane l =
 * row l); widened to fp32, scaled per lane, rounded to 32 bf16 and permuted, the even dwords are one
 * pair row of the panel's 8 columns and the odd dwords the next. */
#ifndef QUANT_PANELS_H
#define QUANT_PANELS_H
#include <stdint.h>

#include "amx_tiles.h"
#include "quant_dot.h"

typedef struct {
    const uint8_t *w;
    int64_t n, k, base; /* rows, values per row, base block type (Q4_0, Q4_1, Q8_0) */
} GroupedWeight;

/* Whether the packer reads weights of this type id: the 8-row groups of Q4_0, Q4_1 or Q8_0. */
static inline int quant_panels_read(int type) { return IS_GROUPED(type) && BASE_TYPE(type) <= Q8_0; }

#if defined(CPU_AMX)
/* 32 values of one step (rows 0-3 in a, rows 4-7 in b, 4 values each) scaled, rounded and stored as pair
 * rows p and p + 1 of the panel's 8 columns at packed + col. */
static inline void store_step(__m512 a, __m512 b, uint32_t *packed, int64_t p, int64_t col) {
    const __m512i pairs = (__m512i)_mm512_cvtne2ps_pbh(b, a); /* dword i: row i / 2, pair i % 2 */
    const __m512i order = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    const __m512i rows = _mm512_permutexvar_epi32(order, pairs);
    _mm256_storeu_si256((__m256i *)(packed + p * AMX_N + col), _mm512_castsi512_si256(rows));
    _mm256_storeu_si256((__m256i *)(packed + (p + 1) * AMX_N + col), _mm512_extracti64x4_epi64(rows, 1));
}

/* 16 unsigned 4-bit (or signed 8-bit, Q8_0) values of 4 rows as fp32 weights: d * (q - 8) for Q4_0, d * q + m
 * for Q4_1 (two roundings, as quant_blocks.dequantize: fp-contract is off for this file's packers), d * q. */
static inline __m512 weights16(__m128i q, __m512 d, __m512 m, int64_t base) {
    if (base == Q8_0) return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)));
    __m512i wide = _mm512_cvtepu8_epi32(q);
    if (base == Q4_0) wide = _mm512_sub_epi32(wide, _mm512_set1_epi32(8));
    const __m512 v = _mm512_mul_ps(d, _mm512_cvtepi32_ps(wide));
    return base == Q4_1 ? _mm512_add_ps(v, m) : v;
}

/* Columns col..col+7 of the panel from group rows c..c+7 (a whole group: n % 8 == 0). */
__attribute__((optimize("fp-contract=off"))) static void pack_group(const GroupedWeight *gw, int64_t c,
                                                                     uint32_t *packed, int64_t col) {
    const int64_t bb = BLOCK_BYTES[gw->base], nb = gw->k / QK, head = group_head_bytes((int)gw->base);
    const __m512i lane_lo = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i lane_hi = _mm512_add_epi32(lane_lo, _mm512_set1_epi32(4));
    const __m128i nibble = _mm_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *chunk = group_chunk(gw->w, nb * bb, bb, c, b), *steps = chunk + head * GROUP_ROWS;
        const __m512 d = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)chunk)));
        __m512 m = _mm512_setzero_ps();
        if (gw->base == Q4_1) m = _mm512_castps256_ps512(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(chunk + 16))));
        const __m512 d_lo = _mm512_permutexvar_ps(lane_lo, d), d_hi = _mm512_permutexvar_ps(lane_hi, d);
        const __m512 m_lo = _mm512_permutexvar_ps(lane_lo, m), m_hi = _mm512_permutexvar_ps(lane_hi, m);
        for (int t = 0; t < (gw->base == Q8_0 ? 8 : 4); t++) { /* Q8_0: values 4t..4t+3; Q4: and 16 + 4t.. */
            const __m128i r0 = _mm_loadu_si128((const __m128i *)(steps + 32 * t));
            const __m128i r1 = _mm_loadu_si128((const __m128i *)(steps + 32 * t + 16));
            if (gw->base == Q8_0) {
                store_step(weights16(r0, d_lo, m_lo, Q8_0), weights16(r1, d_hi, m_hi, Q8_0), packed, b * 16 + 2 * t, col);
                continue;
            }
            store_step(weights16(_mm_and_si128(r0, nibble), d_lo, m_lo, gw->base),
                       weights16(_mm_and_si128(r1, nibble), d_hi, m_hi, gw->base), packed, b * 16 + 2 * t, col);
            store_step(weights16(_mm_and_si128(_mm_srli_epi16(r0, 4), nibble), d_lo, m_lo, gw->base),
                       weights16(_mm_and_si128(_mm_srli_epi16(r1, 4), nibble), d_hi, m_hi, gw->base), packed,
                       b * 16 + 8 + 2 * t, col);
        }
    }
}

static void pack_quant_panel(const void *weight, int64_t c0, uint32_t *packed) {
    const GroupedWeight *gw = weight;
    for (int64_t g = 0; g < AMX_N / GROUP_ROWS; g++) {
        const int64_t c = c0 + g * GROUP_ROWS;
        if (c < gw->n) {
            pack_group(gw, c, packed, g * GROUP_ROWS);
            continue;
        }
        for (int64_t p = 0; p < gw->k / 2; p++) memset(packed + p * AMX_N + g * GROUP_ROWS, 0, 4 * GROUP_ROWS);
    }
}
#endif
#endif
