/* y[m, n] = bf16(x)[m, k] @ W[n, k]^T (+ bias) for a linear whose weight is held in bf16, with fp32
 * accumulation (bf16_dot.h: vdpbf16ps on AVX-512 BF16, widen + FMA elsewhere). Python wrapper:
 * cute_kernels/cpu/bf16_gemm.py; torch reference: bf16_gemm.bf16_linear_ref.
 *
 * Why bf16 weights: batch-1 decode streams every weight once per token, and bf16 halves fp32's bytes;
 * an HF checkpoint ships bf16, so nothing is rounded that the checkpoint did not already round.
 * The activations are rounded to bf16 once per call (a fused q/k/v or gate/up weight shares them).
 * Work splits over panels of PANEL output columns, each panel's weight rows staying in cache while
 * every activation row passes over them: on AVX-512 BF16 from PACK_MIN_ROWS rows on, the panel is
 * first packed pair-interleaved (16 columns x 2 k per vector) so that one vdpbf16ps serves 16 columns
 * against a broadcast activation pair, 8 rows x 32 columns per register tile and no horizontal sums
 * (the dot-product tiles below reach ~70 GFLOP/s a core, this ~190, oneDNN's bf16 rate, at 512 rows);
 * elsewhere, and for fewer rows, tiles of 4 x 4 dot products. The two sum in different orders:
 * pack_min_rows = INT64_MAX keeps every row count on one (batch-invariant linears). */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "bf16_dot.h"

#define PANEL 16 /* output columns per work item: 16 weight rows of k <= 1536 fit in L1 + L2 */

static void panel(const uint16_t *xb, const uint16_t *w, const float *bias, float *y, int64_t m, int64_t n,
                  int64_t k, int64_t c0) {
    const int64_t c1 = c0 + PANEL < n ? c0 + PANEL : n;
    float out[BF16_TILE * BF16_TILE];
    for (int64_t r0 = 0; r0 < m; r0 += BF16_TILE) {
        const int nr = (int)(m - r0 < BF16_TILE ? m - r0 : BF16_TILE);
        for (int64_t c = c0; c < c1; c += BF16_TILE) {
            const int nc = (int)(c1 - c < BF16_TILE ? c1 - c : BF16_TILE);
            bf16_tile(xb + r0 * k, k, nr, w + c * k, k, nc, k, out, BF16_TILE);
            for (int r = 0; r < nr; r++)
                for (int l = 0; l < nc; l++)
                    y[(r0 + r) * n + c + l] = out[r * BF16_TILE + l] + (bias != NULL ? bias[c + l] : 0.f);
        }
    }
}

#if defined(CPU_BF16)
#define PACK_COLS 32 /* two vectors of 16 columns */
#define PACK_ROWS 8

/* panel[p][c] = the pair (w[c0 + c][2p], w[c0 + c][2p + 1]) as one 32-bit word, zero past n and k. */
static void pack_panel(const uint16_t *w, int64_t n, int64_t k, int64_t c0, uint32_t *packed) {
    const int64_t pairs = (k + 1) / 2;
    for (int64_t c = 0; c < PACK_COLS; c++) {
        const uint16_t *row = w + (c0 + c) * k;
        for (int64_t p = 0; p < pairs; p++) {
            const uint32_t lo = c0 + c < n ? row[2 * p] : 0, hi = c0 + c < n && 2 * p + 1 < k ? row[2 * p + 1] : 0;
            packed[p * PACK_COLS + c] = lo | hi << 16;
        }
    }
}

static inline __attribute__((always_inline)) void packed_tile(const uint16_t *xb, int64_t k, const uint32_t *packed,
                                                              float *out, const int R) {
    __m512 acc[PACK_ROWS][2];
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    const int64_t full = k / 2;
    for (int64_t p = 0; p < full; p++) {
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(packed + p * PACK_COLS);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(packed + p * PACK_COLS + 16);
        for (int r = 0; r < R; r++) {
            int32_t pair;
            memcpy(&pair, xb + r * k + 2 * p, 4);
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);
        }
    }
    if (k % 2) { /* the last pair holds one value and a zero */
        const __m512bh w0 = (__m512bh)_mm512_loadu_si512(packed + full * PACK_COLS);
        const __m512bh w1 = (__m512bh)_mm512_loadu_si512(packed + full * PACK_COLS + 16);
        for (int r = 0; r < R; r++) {
            const __m512bh xv = (__m512bh)_mm512_set1_epi32(xb[r * k + k - 1]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xv, w0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xv, w1);
        }
    }
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(out + r * PACK_COLS, acc[r][0]);
        _mm512_storeu_ps(out + r * PACK_COLS + 16, acc[r][1]);
    }
}

static void packed_panel(const uint16_t *xb, const uint32_t *packed, const float *bias, float *y, int64_t m,
                         int64_t n, int64_t k, int64_t c0) {
    const int64_t cols = n - c0 < PACK_COLS ? n - c0 : PACK_COLS;
    float out[PACK_ROWS * PACK_COLS];
    for (int64_t r0 = 0; r0 < m; r0 += PACK_ROWS) {
        const int nr = (int)(m - r0 < PACK_ROWS ? m - r0 : PACK_ROWS);
        switch (nr) {
        case 8: packed_tile(xb + r0 * k, k, packed, out, 8); break;
        case 7: packed_tile(xb + r0 * k, k, packed, out, 7); break;
        case 6: packed_tile(xb + r0 * k, k, packed, out, 6); break;
        case 5: packed_tile(xb + r0 * k, k, packed, out, 5); break;
        case 4: packed_tile(xb + r0 * k, k, packed, out, 4); break;
        case 3: packed_tile(xb + r0 * k, k, packed, out, 3); break;
        case 2: packed_tile(xb + r0 * k, k, packed, out, 2); break;
        default: packed_tile(xb + r0 * k, k, packed, out, 1); break;
        }
        for (int r = 0; r < nr; r++)
            for (int64_t l = 0; l < cols; l++)
                y[(r0 + r) * n + c0 + l] = out[r * PACK_COLS + l] + (bias != NULL ? bias[c0 + l] : 0.f);
    }
}

/* The packed route; 0, or 2 when a thread's panel buffer cannot be allocated. */
static int packed_gemm(const uint16_t *xb, const uint16_t *w, const float *bias, float *y, int64_t m, int64_t n,
                       int64_t k, int nthreads) {
    const int64_t panels = (n + PACK_COLS - 1) / PACK_COLS;
    int failed = 0;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    {
        uint32_t *packed = malloc(sizeof(uint32_t) * (size_t)(((k + 1) / 2) * PACK_COLS));
        if (packed == NULL) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; p++) {
                pack_panel(w, n, k, p * PACK_COLS, packed);
                packed_panel(xb, packed, bias, y, m, n, k, p * PACK_COLS);
            }
        }
        free(packed);
    }
    return failed ? 2 : 0;
}
#endif

/* Returns 0, or 2 when the bf16 copy of x cannot be allocated. nthreads 1 runs on the caller's thread. */
int bf16_linear(const float *x, const uint16_t *w, const float *bias, float *y, int64_t m, int64_t n, int64_t k,
                int64_t pack_min_rows, int nthreads) {
    uint16_t *xb = malloc(sizeof(uint16_t) * (size_t)(m * k > 0 ? m * k : 1));
    if (xb == NULL) return 2;
    const int64_t panels = (n + PANEL - 1) / PANEL;
    int status = 0;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int64_t r = 0; r < m; r++) to_bf16_row(x + r * k, xb + r * k, k);
#if defined(CPU_BF16)
    if (m >= pack_min_rows) {
        status = packed_gemm(xb, w, bias, y, m, n, k, nthreads);
        free(xb);
        return status;
    }
#endif
    (void)pack_min_rows;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (nthreads > 1)
    for (int64_t p = 0; p < panels; p++) panel(xb, w, bias, y, m, n, k, p * PANEL);
    free(xb);
    return status;
}

/* x [m, k] rounded to bf16, as the kernel rounds it (the tests compare it with torch's .bfloat16()). */
void bf16_round_rows(const float *x, uint16_t *y, int64_t count) { to_bf16_row(x, y, count); }

const char *bf16_path(void) { return bf16_dot_path(); }

const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
