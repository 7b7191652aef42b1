/* Linears with bf16 weights (an HF checkpoint's, --dtype bfloat16) on AMX tiles, for many activation rows
 * (prefill): y = bf16(x) @ W^T (+ bias), W [n, k] bf16 row-major, fp32 sums; amx_tiles.h runs the product,
 * this file packs W's 32-column panels for it.
 *
 * Why: cpu_bf16_gemm.c's vdpbf16ps panels reach ~190 GFLOP/s a core, and a 2000-token prefill of the
 * default model's bf16 export took 2.76 s against vLLM's 0.62 s (its oneDNN GEMMs on AMX).
 * Accuracy: the same bf16 pairs as the other bf16 routes (to_bf16_row's rounding of x), exact products, fp32
 * sums in another order. Python wrapper: cute_kernels/cpu/bf16_gemm.py (its AMX route); the oracle in the tests
 * is bf16_gemm.bf16_linear_ref.
 *
 * Packing: panel word (p, c) is W[c0 + c]'s values 2p and 2p + 1, one 32-bit word of the row; 16 columns' words at
 * pair p are one gather of stride k / 2 words (k even), zero past n and past k. */
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

/* y[m, n] = bf16(x) @ W^T (+ bias) for a bf16 weight [n, k]. Returns 0; 1 for an odd k (pairs straddle rows);
 * 2 when a buffer cannot be allocated; 3 where this build or process has no AMX. */
int bf16_linear_amx(const float *x, const uint16_t *w, const float *bias, float *y, int64_t m, int64_t n, int64_t k,
                    int nthreads) {
    if (k % 2) return 1;
#if defined(CPU_AMX)
    const Bf16Weight bw = {w, n, k};
    return amx_gemm(x, m, k, pack_bf16_panel, &bw, bias, y, n, nthreads, 0);
#else
    (void)x, (void)w, (void)bias, (void)y, (void)m, (void)nthreads;
    return 3;
#endif
}

const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
