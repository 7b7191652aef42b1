/* Linears with bf16 weights (an HF checkpoint's, --dtype bfloat16) on AMX tiles, for many activation rows
 * (prefill): y = bf16(x) @ W^T (+ bias), W [n, k] bf16 row-major, fp32 sums; amx_tiles.h runs the product,
 * this file packs W's 32-column panels for it.
 *
 * Why: cpu_bf16_gemm.c's vdpbf16ps panels reach ~190 GFLOP/s a core, and a 2000-token prefill of the
 * default model's bf16 export took 2.76 s against vLLM's 0.62 s (its oneDNN GEMMs on AMX).
 * Accuracy: the same bf16 pairs as the other bf16 routes (to_bf16_row's rounding of x), exact products, fp32
 * sums in another order. Python wrapper: cute_kernels/cpu/bf16_gemm.py (its AMX route); the oracle in the tests
 * is bf16_gemm.bf16_linear_ref.
 */
#include <stdint.h>

#include "bf16_panels.h"

/* y[m, n] = bf16(x) @ W^T (+ bias) for a bf16 weight [n, k]. Returns 0; 1 for an odd k (pairs straddle rows);
 * 2 when a buffer cannot be allocated; 3 where this build or process has no AMX. */
int bf16_linear_amx(const float *x, const uint16_t *w, const float *bias, float *y, int64_t m, int64_t n, int64_t k,
                    int nthreads) {
    if (k % 2) return 1;
#if defined(CPU_AMX)
    const Bf16Weight bw = {w, n, k};
    return amx_gemm(x, NULL, m, k, pack_bf16_panel, &bw, bias, y, n, nthreads, AMX_PLAIN);
#else
    (void)x, (void)w, (void)bias, (void)y, (void)m, (void)nthreads;
    return 3;
#endif
}

const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
