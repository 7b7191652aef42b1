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
 */
#include <stdint.h>

#include "quant_panels.h"

/* y[m, n] = bf16(x) @ W^T (+ bias) for a grouped weight of type Q4_0_R8, Q4_1_R8 or Q8_0_R8 (ids base |
 * GROUPED_TYPE); xr: x's rows already bf16 instead (x NULL). Returns 0; 1 for another type or n not a whole
 * number of groups; 2 when a buffer cannot be allocated; 3 where this build or process has no AMX. */
int quant_linear_amx(const float *x, const uint16_t *xr, const uint8_t *w, int type, const float *bias, float *y,
                     int64_t m, int64_t n, int64_t k, int nthreads) {
    if (!quant_panels_read(type) || n % GROUP_ROWS || k % QK) return 1;
#if defined(CPU_AMX)
    const GroupedWeight gw = {w, n, k, BASE_TYPE(type)};
    return amx_gemm(x, xr, m, k, pack_quant_panel, &gw, bias, y, n, nthreads, AMX_PLAIN);
#else
    (void)x, (void)xr, (void)w, (void)bias, (void)y, (void)m, (void)nthreads;
    return 3;
#endif
}

/* y[m, inter] = silu(x W_gate^T) * (x W_up^T) for a fused gate/up weight of 2 * inter rows (gate first), the
 * same types, as quant_linear_amx computes both halves and silu_and_mul_f32 joins them (the same bits);
 * inter a multiple of 32; bf16_out: y is bf16 [m, inter], those values rounded as the down projection's AMX
 * linear would round them (so it can read them as they are). Returns as quant_linear_amx. */
int quant_glu_amx(const float *x, const uint8_t *w, int type, void *y, int64_t m, int64_t inter, int64_t k,
                  int nthreads, int bf16_out) {
    if (!quant_panels_read(type) || inter % 32 || k % QK) return 1;
#if defined(CPU_AMX)
    const GroupedWeight gw = {w, 2 * inter, k, BASE_TYPE(type)};
    return amx_gemm(x, NULL, m, k, pack_quant_panel, &gw, NULL, y, inter, nthreads, bf16_out ? AMX_GLU_BF16 : AMX_GLU);
#else
    (void)x, (void)w, (void)y, (void)m, (void)nthreads, (void)bf16_out;
    return 3;
#endif
}

int amx_available(void) { return amx_usable(); }

const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
