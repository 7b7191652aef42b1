/* Public C ABI of the ahead-of-time exported FP8 kernels: the GEMM (cute_aot_fp8_gemm[_splitk]_<tiles>_launch)
 * and the per-token activation quantizer (cute_aot_fp8_quant_<...>_launch).
 *
 * Raw device pointers, runtime sizes, and row strides in elements (the column stride is 1, compiled
 * in). Python mirrors these structs in hopper/fp8_gemm/fp8_gemm_aot.py; keep them in sync (the loader checks
 * cute_aot_fp8_gemm_args_size() and cute_aot_fp8_quant_args_size() against its own sizes).
 */
#pragma once
#include <stdint.h>
#include "aot_common.h"

typedef struct {
    void *a, *b;                  /* e4m3 [m, k], [n, k] */
    void *c;                      /* bf16 [m, n]; split-K variants: the fp32 workspace [splits, m, n] */
    void *scale_a, *scale_b;      /* fp32 [m, scale_cols], [scale_b_rows, scale_cols] */
    int32_t m, n, k, scale_cols, scale_b_rows, splits;
    int64_t a_stride, b_stride, c_stride, scale_a_stride, scale_b_stride, c_split_stride;
} cute_aot_fp8_gemm_args_t;

typedef struct {
    void *x;                      /* bf16 [m, k] */
    void *q;                      /* e4m3 [m, k] */
    void *scale;                  /* fp32 [m, 1] */
    int32_t m, k;
    int64_t x_stride, q_stride;
} cute_aot_fp8_quant_args_t;
