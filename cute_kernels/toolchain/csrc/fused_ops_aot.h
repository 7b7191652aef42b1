/* Public C ABI of the ahead-of-time exported fused elementwise kernels (hopper/fused_*.py, kv_write.py).
 *
 * Every variant of the family shares one kernel signature (hopper/fused/fused_common.py): five 2-D tensors
 * [rows, cols] with unit column stride and a runtime row stride (in elements), an int64 slot vector
 * and one fp32 scalar; an op ignores the operands it does not use (any valid pointer will do).
 * Python mirrors this struct in hopper/fused/fused_aot.py; the loader checks cute_aot_fused_ops_args_size().
 */
#pragma once
#include <stdint.h>

typedef struct {
    void *data;
    int32_t rows, cols;
    int64_t row_stride;
} cute_aot_matrix_t;

typedef struct {
    cute_aot_matrix_t m[5]; /* mA..mE */
    void *slots;            /* int64 [num_slots] */
    int32_t num_slots;
    float scalar;
} cute_aot_fused_ops_args_t;
