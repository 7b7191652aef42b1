/* Quantized linears on AMX tiles, for many activation rows (prefill): y = bf16(x) @ W^T (+ bias) where W
 * is a grouped Q4_0, Q4_1 or Q8_0 weight (row_groups.h), each 32-column panel dequantized to bf16 pairs
 * just before the tiles multiply it against every activation row (amx_tiles.h).
 *
 * Why dequantize: AMX's int8 product (TDPBUSD) would need every 32-value block's integer sum scaled on
 * its own, a tile store per block, which costs more than the product; a bf16 panel is scaled once and
 * then serves all rows. The panel costs ~1/3 cycle a weight value, what ~20 rows of int8 VNNI cost,
 * so quant_gemm.py sends this kernel row counts from its measured crossover on.
 * Accuracy: each weight value as quant_blocks.dequantize computes it in fp32, rounded once to bf16
 * (relative error <= 2^-9), the activations rounded to bf16 (as bf16_gemm.py's linears), fp32
 * sums; the int8 paths instead round the activations to 8 bits per block of 32. Python wrapper:
 * cute_kernels/cpu/quant_amx.py; the oracle in the tests is the fp32 dequantized product.
 *
 * Panel packing from a group's chunk: one 32-byte step holds 4 consecutive values of 8 rows (lane l =
 * row l); widened to fp32, scaled per lane, rounded to 32 bf16 and permuted, the even dwords are one
 * pair row of the panel's 8 columns and the odd dwords the next. */
#include <stdint.h>

#include "amx_tiles.h"
#include "quant_dot.h"

typedef struct {
    const uint8_t *w;
    int64_t n, k, base; /* rows, values per row, base block type (Q4_0, Q4_1, Q8_0) */
} GroupedWeight;

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

static void pack_panel(const void *weight, int64_t c0, uint32_t *packed) {
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

/* y[m, n] = bf16(x) @ W^T (+ bias) for a grouped weight of type Q4_0_R8, Q4_1_R8 or Q8_0_R8 (ids base |
 * GROUPED_TYPE). Returns 0; 1 for another type or n not a whole number of groups; 2 when a buffer
 * cannot be allocated; 3 where this build or process has no AMX. */
int quant_linear_amx(const float *x, const uint8_t *w, int type, const float *bias, float *y, int64_t m, int64_t n,
                     int64_t k, int nthreads) {
    if (!IS_GROUPED(type) || BASE_TYPE(type) > Q8_0 || n % GROUP_ROWS || k % QK) return 1;
#if defined(CPU_AMX)
    const GroupedWeight gw = {w, n, k, BASE_TYPE(type)};
    return amx_gemm(x, m, k, pack_panel, &gw, bias, y, n, nthreads, 0);
#else
    (void)x, (void)w, (void)bias, (void)y, (void)m, (void)nthreads;
    return 3;
#endif
}

/* y[m, inter] = silu(x W_gate^T) * (x W_up^T) for a fused gate/up weight of 2 * inter rows (gate first), the
 * same types, as quant_linear_amx computes both halves and silu_and_mul_f32 joins them (the same bits);
 * inter a multiple of 32. Returns as quant_linear_amx. */
int quant_glu_amx(const float *x, const uint8_t *w, int type, float *y, int64_t m, int64_t inter, int64_t k,
                  int nthreads) {
    if (!IS_GROUPED(type) || BASE_TYPE(type) > Q8_0 || inter % 32 || k % QK) return 1;
#if defined(CPU_AMX)
    const GroupedWeight gw = {w, 2 * inter, k, BASE_TYPE(type)};
    return amx_gemm(x, m, k, pack_panel, &gw, NULL, y, inter, nthreads, 1);
#else
    (void)x, (void)w, (void)y, (void)m, (void)nthreads;
    return 3;
#endif
}

int amx_available(void) { return amx_usable(); }

const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
