/* A bf16 weight [n, k] (row-major, k even) as the AMX tiles read it: amx_tiles.h's packer callback for
 * cpu_bf16_amx.c (the per-op linear) and cpu_decode_step.c (the fused step past GEMV_ROWS rows).
 *
 * Packing: panel word (p, c) is W[c0 + c]'s values 2p and 2p + 1, one 32-bit word of the row, zero past n and past
 * k (k even): 16 rows' next 16 words are loaded as they lie and transposed in registers (a gather of 16 words from
 * 16 rows per pair p cost ~3.5x the tile products it fed in a 64-row decode step of a bf16 checkpoint). */
#ifndef BF16_PANELS_H
#define BF16_PANELS_H
#include <stdint.h>

#include "amx_tiles.h"

typedef struct {
    const uint16_t *w;
    int64_t n, k;
} Bf16Weight;

#if defined(CPU_AMX)
/* r[i] word j <-> r[j] word i: a 16 x 16 matrix of 32-bit words in registers, 64 shuffles. */
static inline void transpose16_epi32(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2)
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]), r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]), r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++)
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88), r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
}

static void pack_bf16_panel(const void *weight, int64_t c0, uint32_t *packed) {
    const Bf16Weight *bw = weight;
    const int64_t pairs = bw->k / 2, padded = (bw->k + AMX_K - 1) / AMX_K * AMX_K / 2; /* a multiple of 16 */
    const uint32_t *w = (const uint32_t *)bw->w; /* a row's pairs as words */
    for (int64_t h = 0; h < AMX_N; h += 16) {
        const int64_t first = c0 + h, live = bw->n - first < 16 ? bw->n - first : 16;
        for (int64_t p0 = 0; p0 < padded; p0 += 16) {
            const int64_t take = pairs - p0 < 16 ? pairs - p0 : 16;
            const __mmask16 words = take <= 0 ? 0 : (__mmask16)((1u << take) - 1);
            __m512i r[16];
            for (int j = 0; j < 16; j++)
                r[j] = j < live ? _mm512_maskz_loadu_epi32(words, w + (first + j) * pairs + p0) : _mm512_setzero_si512();
            transpose16_epi32(r);
            for (int i = 0; i < 16; i++) _mm512_storeu_si512(packed + (p0 + i) * AMX_N + h, r[i]);
        }
    }
}
#endif
#endif
