/* The task split both quantized GEMMs share (cpu_quant_gemm.c over 32-value blocks, cpu_kquant_gemm.c
 * over 256-value super-blocks): OpenMP tasks of (row block, column tile), so a column tile's weight
 * blocks stay in L1 while every activation row of the row block streams past them; with one or a few
 * rows (decode, GEMV) the split is over columns alone. The includer defines ROW_TILE (rows one
 * dot_tile call serves) and passes its dot_tile. */
#ifndef COLUMN_TILES_H
#define COLUMN_TILES_H
#include <stddef.h>
#include <stdint.h>

#define COL_TILE 16  /* weight rows per task: 16 rows of blocks stay in L1 */
#define ROW_BLOCK 64 /* activation rows per task */

/* out[r] = weight row wrow . activation row r for r < nr; nblocks: the type's blocks per row. */
typedef void (*dot_tile_fn)(const uint8_t *wrow, int type, int64_t nblocks, const int8_t *q, const float *d,
                            const float *s, int64_t k, int nr, float *out);

/* out[r * 8 + l] = weight row l (w + l * row_bytes) . activation row r for 8 weight rows, r < nr. */
typedef void (*dot_tile8_fn)(const uint8_t *w, int64_t row_bytes, int type, int64_t nblocks, const int8_t *q,
                             const float *d, const float *s, int64_t k, int nr, float *out);

/* y[M, N] = x @ W^T (+ bias), x quantized by quantize_rows_q8 (d, s: one per 32 values); dot_tile8 (or
 * NULL) takes 8 columns at a time, the rest of a tile goes to dot_tile. */
static inline void column_tiled_gemm(dot_tile_fn dot_tile, dot_tile8_fn dot_tile8, const uint8_t *w, int type, int64_t nblocks,
                                     int64_t row_bytes, const int8_t *q, const float *d, const float *s,
                                     const float *bias, float *y, int64_t m, int64_t n, int64_t k, int nthreads) {
    const int64_t per_row = k / 32; /* activation blocks per row */
    const int64_t row_blocks = (m + ROW_BLOCK - 1) / ROW_BLOCK, col_tiles = (n + COL_TILE - 1) / COL_TILE;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads)
    for (int64_t rb = 0; rb < row_blocks; rb++) {
        for (int64_t ct = 0; ct < col_tiles; ct++) {
            const int64_t r_end = rb * ROW_BLOCK + ROW_BLOCK < m ? rb * ROW_BLOCK + ROW_BLOCK : m;
            const int64_t c_end = ct * COL_TILE + COL_TILE < n ? ct * COL_TILE + COL_TILE : n;
            for (int64_t r0 = rb * ROW_BLOCK; r0 < r_end; r0 += ROW_TILE) {
                const int nr = (int)(r_end - r0 < ROW_TILE ? r_end - r0 : ROW_TILE);
                int64_t c = ct * COL_TILE;
                for (; dot_tile8 != NULL && c + 8 <= c_end; c += 8) {
                    float out[ROW_TILE * 8];
                    dot_tile8(w + c * row_bytes, row_bytes, type, nblocks, q + r0 * k, d + r0 * per_row,
                              s + r0 * per_row, k, nr, out);
                    for (int r = 0; r < nr; r++)
                        for (int l = 0; l < 8; l++) y[(r0 + r) * n + c + l] = out[r * 8 + l] + (bias != NULL ? bias[c + l] : 0.f);
                }
                for (; c < c_end; c++) {
                    float out[ROW_TILE];
                    dot_tile(w + c * row_bytes, type, nblocks, q + r0 * k, d + r0 * per_row, s + r0 * per_row, k, nr,
                             out);
                    const float bc = bias != NULL ? bias[c] : 0.f;
                    for (int r = 0; r < nr; r++) y[(r0 + r) * n + c] = out[r] + bc;
                }
            }
        }
    }
}
#endif
