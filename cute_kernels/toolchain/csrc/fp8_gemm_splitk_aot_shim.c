/* The split-K FP8 GEMM variants' shim: fp8_gemm_aot_shim.c with C as the fp32 workspace [splits, m, n]
 * (three runtime sizes, two strides). */
#define FP8_GEMM_SPLIT_K 1
#include "fp8_gemm_aot_shim.c"
