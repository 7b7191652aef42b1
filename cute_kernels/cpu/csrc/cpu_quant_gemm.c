/* Quantized linear layers for the CPU: y[M, N] = x[M, K] @ W[N, K]^T with W in a ggml block format
 * (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, read in place from the GGUF layout) and x quantized once per call
 * to int8 in blocks of 32 (scale d, and s = d * sum(q) for the formats with an offset).
 *
 * Why: batch-1 decode is bandwidth-bound, and these weights are 4.5-8.5 bits instead of 32. Per
 * block the integer dot product is exact; only the float accumulation of block results differs
 * from the torch reference (cute_kernels/cpu/quant_reference.py). Q5_0/Q5_1 unpack to unsigned
 * 5-bit values (nibble | fifth bit << 4) and take Q4_0/Q4_1's path: the offset, -16 d (Q5_0) or m
 * (Q5_1), meets the activation block sums.
 * ISA: see quant_simd.h. K-quants (256-value super-blocks) have their own kernels: cpu_kquant_gemm.c.
 * Work is split over OpenMP threads by (row block, column tile): a column tile's weight blocks stay
 * in L1 while every row of the row block streams past them (GEMM), and with one or a few rows
 * (decode, GEMV) the split is over columns alone.
 */
#include <math.h>
#include <omp.h>
#include <stddef.h>

#include "quant_dot.h"
#include "column_tiles.h"

/* Every row's 32-value blocks by quantize_block_q8 (quant_dot.h). */
void quantize_rows_q8(const float *x, int64_t rows, int64_t k, int8_t *q, float *d, float *s, int nthreads) {
    const int64_t nb = k / QK, total = rows * nb;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (total >= 512)
    for (int64_t i = 0; i < total; i++) quantize_block_q8(x + i * QK, q + i * QK, d + i, s + i);
}

/* y[M, N] = x @ W^T (+ bias) from activations already quantized by quantize_rows_q8. A grouped type
 * (row_groups.h) needs n % 8 == 0: every column tile then takes whole groups (quant_gemm.py checks). */
void quant_gemm(const uint8_t *w, int type, const int8_t *q, const float *d, const float *s, const float *bias,
                float *y, int64_t m, int64_t n, int64_t k, int nthreads) {
    const int64_t nb = k / QK, row_bytes = nb * BLOCK_BYTES[BASE_TYPE(type)];
    column_tiled_gemm(dot_tile, dot_tile8, w, type, nb, row_bytes, q, d, s, bias, y, m, n, k, nthreads);
}


/* out[N, K] = the float32 values of W, for row counts where a float GEMM beats the int8 dot products
 * (see quant_gemm.py): callers dequantize a slice of W at a time into a reused buffer. */
void dequantize_blocks(const uint8_t *w, int type, int64_t n, int64_t k, float *out, int nthreads) {
    const int grouped = IS_GROUPED(type);
    type = BASE_TYPE(type);
    const int64_t nb = k / QK, bb = BLOCK_BYTES[type];
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n * nb; i++) {
        uint8_t lane[34]; /* a grouped row's block, in the file's layout */
        if (grouped) group_block(group_chunk(w, nb * bb, bb, i / nb, i % nb), type, (int)(i / nb % GROUP_ROWS), lane);
        const uint8_t *blk = grouped ? lane : w + i * bb;
        const float dw = f16_to_f32(load_u16(blk)), off = block_offset(blk, type, dw);
        const uint8_t *qs = blk + QS_AT[type];
        const uint32_t qh = fifth_bits_u32(blk, type);
        float *o = out + i * QK;
        if (type == Q8_0) {
            for (int j = 0; j < QK; j++) o[j] = dw * (float)(int8_t)qs[j];
        } else {
            for (int j = 0; j < 16; j++) {
                uint8_t lo, hi;
                unsigned_pair(qs, qh, j, &lo, &hi);
                o[j] = dw * (float)lo + off;
                o[j + 16] = dw * (float)hi + off;
            }
        }
    }
}

/* The SIMD route this library was built for (isa.h), so tests and benchmarks can say which ran. */
const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
