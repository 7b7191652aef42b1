/* The register-blocked int8 GEMM for many activation rows (prefill chunks, large batches), y[M, N] =
 * x[M, K] @ W[N, K]^T for ggml Q4_0, Q4_1 and Q8_0 blocks: quant_tiles.h says how it works; this file is
 * the per-op entry (cute_kernels/cpu/quant_tiles.py) and the int8 peak the benchmark rates it against.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "quant_tiles.h"

/* y[M, N] = x @ W^T (+ bias) from activations quantized by quantize_rows_q8: tiles_team on nthreads threads.
 * Returns 0, 2 for a type the panels do not read, or -1 when a buffer could not be allocated. */
int quant_gemm_tiles(const uint8_t *w, int type, const int8_t *q, const float *d, const float *s, const float *bias,
                     float *y, int64_t m, int64_t n, int64_t k, int nthreads) {
    if (!tiles_read(type)) return 2; /* the other block types have no panel layout */
    int32_t *corr = NULL;
#ifdef TILES_VNNI
    if (BASE_TYPE(type) == Q8_0 && (corr = malloc((size_t)(m * (k / QK)) * sizeof *corr)) == NULL) return -1;
#endif
    int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(| : failed)
    {
        uint8_t *panel = malloc(tiles_panel_bytes(k));
        failed = panel == NULL;
        tiles_team(w, type, q, d, s, corr, bias, y, m, n, k, panel);
        free(panel);
    }
    free(corr);
    return failed ? -1 : 0;
}

/* The int8 multiply-add peak of this route's inner instruction, for bench_quant_gemm.py's fraction of it:
 * each of nthreads threads runs iters rounds of 12 independent vpdpbusd on zmm (VNNI) or vpmaddubsw on
 * ymm (AVX2), in asm so that the compiler can neither merge nor drop the chains. Returns the
 * multiply-adds done, or -1 on the portable route (no such instruction). */
int64_t int8_peak(int64_t iters, int nthreads) {
#if defined(TILES_VNNI) || defined(CPU_AVX2)
#ifdef TILES_VNNI
#define PEAK_OP(i) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #i "\n\t"
    const int64_t per_op = 64;
#else
#define PEAK_OP(i) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #i "\n\t"
    const int64_t per_op = 32;
#endif
#pragma omp parallel num_threads(nthreads)
    for (int64_t it = 0; it < iters; it++)
        __asm__ volatile(PEAK_OP(0) PEAK_OP(1) PEAK_OP(2) PEAK_OP(3) PEAK_OP(4) PEAK_OP(5) PEAK_OP(6) PEAK_OP(7)
                         PEAK_OP(8) PEAK_OP(9) PEAK_OP(10) PEAK_OP(11)
                         ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
                         "xmm11");
    return iters * 12 * per_op * nthreads;
#else
    (void)iters;
    (void)nthreads;
    return -1;
#endif
}

/* The SIMD route this library was built for (isa.h), so tests and benchmarks can say which ran. */
const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
