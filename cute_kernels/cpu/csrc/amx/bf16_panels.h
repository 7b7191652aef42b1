/* A bf16 weight [n, k] (row-major, k even) as the AMX tiles read it: amx_tiles.h's packer callback for
 * cpu_bf16_amx.c (the per-op linear) and cpu_decode_step.c (the fused step past GEMV_ROWS rows).
 *
 * Packing: panel word (p, c) is W[c0 + c]'s values 2p and 2p + 1, one 32-bit word of the row; 16 columns' words at
 * pair p are one gather of stride k / 2 words (k even), zero past n and past k. */
#ifndef BF16_PANELS_H
#define BF16_PANELS_H
#include <stdint.h>

#include "amx_tiles.h"

typedef struct {
    const uint16_t *w;
    int64_t n, k;
} Bf16Weight;

#if defined(CPU_AMX)
static void pack_bf16_panel(const void *weight, int64_t c0, uint32_t *packed) {
    const Bf16Weight *bw = weight;
    const int64_t pairs = bw->k / 2, padded = (bw->k + AMX_K - 1) / AMX_K * AMX_K / 2;
    const uint32_t *w = (const uint32_t *)bw->w; /* a row's pairs as words */
    const __m512i lanes = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32((int)pairs));
    for (int64_t h = 0; h < AMX_N; h += 16) {
        const int64_t first = c0 + h, live = bw->n - first < 16 ? bw->n - first : 16;
        const __mmask16 rows = live <= 0 ? 0 : (__mmask16)((1u << live) - 1);
        const uint32_t *base = w + (live > 0 ? first : 0) * pairs;
        for (int64_t p = 0; p < padded; p++) {
            const __m512i v = p < pairs ? _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows, lanes, base + p, 4)
                                        : _mm512_setzero_si512();
            _mm512_storeu_si512(packed + p * AMX_N + h, v);
        }
    }
}
#endif
#endif
