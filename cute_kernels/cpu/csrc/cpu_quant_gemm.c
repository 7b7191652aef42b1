/* Quantized linear layers for the CPU: y[M, N] = x[M, K] @ W[N, K]^T with W in a ggml block format
 * (Q4_0, Q4_1, Q8_0, read in place from the GGUF layout) and x quantized once per call to int8 in
 * blocks of 32 (scale d, and s = d * sum(q) for the formats with an offset).
 *
 * Why: batch-1 decode is bandwidth-bound, and these weights are 4.5-8.5 bits instead of 32. Per
 * block the integer dot product is exact; only the float accumulation of block results differs
 * from the torch reference (cute_kernels/cpu/quant_reference.py).
 * ISA: see quant_simd.h. K-quants (256-value super-blocks) have their own kernels: cpu_kquant_gemm.c.
 * Work is split over OpenMP threads by (row block, column tile): a column tile's weight blocks stay
 * in L1 while every row of the row block streams past them (GEMM), and with one or a few rows
 * (decode, GEMV) the split is over columns alone.
 */
#include <math.h>
#include <omp.h>
#include <stddef.h>

#include "quant_simd.h"

#define QK 32        /* values per block, weights and activations */
#define ROW_TILE 4   /* activation rows sharing one unpacked weight block */
#define COL_TILE 16  /* weight rows per task: 16 x K/32 blocks stay in L1 */
#define ROW_BLOCK 64 /* activation rows per task in the GEMM split */

enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2 };
static const int64_t BLOCK_BYTES[] = {18, 20, 34};

/* Per block: q = round(x / d) with d = amax / 127 (ties to even, as torch.round), s = d * sum(q). */
void quantize_rows_q8(const float *x, int64_t rows, int64_t k, int8_t *q, float *d, float *s, int nthreads) {
    const int64_t nb = k / QK, total = rows * nb;
#pragma omp parallel for schedule(static) num_threads(nthreads) if (total >= 512)
    for (int64_t i = 0; i < total; i++) {
        const float *xb = x + i * QK;
        float amax = 0.f;
        for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
        const float scale = amax / 127.f, inv = scale != 0.f ? 1.f / scale : 0.f;
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            const int v = (int)nearbyintf(xb[j] * inv);
            q[i * QK + j] = (int8_t)v;
            sum += v;
        }
        d[i] = scale;
        s[i] = scale * (float)sum;
    }
}

/* A weight block's scale and offset term: y += d_w * d_x * dot(q_w, q_x) + offset * s_x. */
static inline float block_offset(const uint8_t *blk, int type, float dw) {
    if (type == Q4_1) return f16_to_f32(load_u16(blk + 2));
    return type == Q4_0 ? -8.f * dw : 0.f; /* Q4_0 stores q + 8 */
}

#ifdef QUANT_SIMD
static inline __m256i unpack_q4(const uint8_t *qs) { /* byte j: value j low nibble, value j+16 high */
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}

/* out[r] = row n of W . activation row r, for r < nr rows (nr <= ROW_TILE). Always inlined with
 * constant type and nr (see dot_tile), so each combination compiles to straight-line code. */
static inline __attribute__((always_inline)) void dot_rows(const uint8_t *wrow, int type, int64_t nb, const int8_t *q, const float *d, const float *s,
                     int64_t k, int nr, float *out) {
    __m256 acc[ROW_TILE];
    float off_acc[ROW_TILE] = {0.f, 0.f, 0.f, 0.f};
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const int64_t bb = BLOCK_BYTES[type], qs_at = type == Q4_1 ? 4 : 2;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + b * bb;
        const float dw = f16_to_f32(load_u16(blk)), off = block_offset(blk, type, dw);
        const __m256i w = type == Q8_0 ? _mm256_loadu_si256((const __m256i *)(blk + qs_at)) : unpack_q4(blk + qs_at);
        const __m256i wu = type == Q8_0 ? _mm256_sign_epi8(w, w) : w; /* |w| as u8; the sign moves to x */
        for (int r = 0; r < nr; r++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(q + r * k + b * QK));
            if (type == Q8_0) x = _mm256_sign_epi8(x, w);
            const __m256 p = _mm256_cvtepi32_ps(dot_u8_s8(wu, x));
            acc[r] = _mm256_fmadd_ps(p, _mm256_set1_ps(dw * d[r * nb + b]), acc[r]);
            off_acc[r] += off * s[r * nb + b];
        }
    }
    for (int r = 0; r < nr; r++) out[r] = hsum(acc[r]) + off_acc[r];
}
#else
static inline __attribute__((always_inline)) void dot_rows(const uint8_t *wrow, int type, int64_t nb, const int8_t *q, const float *d, const float *s,
                     int64_t k, int nr, float *out) {
    const int64_t bb = BLOCK_BYTES[type], qs_at = type == Q4_1 ? 4 : 2;
    for (int r = 0; r < nr; r++) out[r] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + b * bb, *qs = blk + qs_at;
        const float dw = f16_to_f32(load_u16(blk)), off = block_offset(blk, type, dw);
        int8_t w[QK];
        for (int j = 0; j < QK; j++)
            w[j] = type == Q8_0 ? (int8_t)qs[j] : (int8_t)(j < 16 ? qs[j] & 0x0f : qs[j - 16] >> 4);
        for (int r = 0; r < nr; r++) {
            const int8_t *x = q + r * k + b * QK;
            int32_t isum = 0;
            for (int j = 0; j < QK; j++) isum += (int32_t)w[j] * (int32_t)x[j];
            out[r] += dw * d[r * nb + b] * (float)isum + off * s[r * nb + b];
        }
    }
}
#endif

#define DOT_TYPE(T)                                                  \
    switch (nr) {                                                    \
    case 4: dot_rows(wrow, T, nb, q, d, s, k, 4, out); break;        \
    case 3: dot_rows(wrow, T, nb, q, d, s, k, 3, out); break;        \
    case 2: dot_rows(wrow, T, nb, q, d, s, k, 2, out); break;        \
    default: dot_rows(wrow, T, nb, q, d, s, k, 1, out); break;       \
    }

static void dot_tile(const uint8_t *wrow, int type, int64_t nb, const int8_t *q, const float *d, const float *s,
                     int64_t k, int nr, float *out) {
    if (type == Q4_0) { DOT_TYPE(Q4_0) }
    else if (type == Q4_1) { DOT_TYPE(Q4_1) }
    else { DOT_TYPE(Q8_0) }
}

/* y[M, N] = x @ W^T (+ bias) from activations already quantized by quantize_rows_q8. */
void quant_gemm(const uint8_t *w, int type, const int8_t *q, const float *d, const float *s, const float *bias,
                float *y, int64_t m, int64_t n, int64_t k, int nthreads) {
    const int64_t nb = k / QK, row_bytes = nb * BLOCK_BYTES[type];
    const int64_t row_blocks = (m + ROW_BLOCK - 1) / ROW_BLOCK, col_tiles = (n + COL_TILE - 1) / COL_TILE;
#pragma omp parallel for collapse(2) schedule(static) num_threads(nthreads)
    for (int64_t rb = 0; rb < row_blocks; rb++) {
        for (int64_t ct = 0; ct < col_tiles; ct++) {
            const int64_t r_end = rb * ROW_BLOCK + ROW_BLOCK < m ? rb * ROW_BLOCK + ROW_BLOCK : m;
            const int64_t c_end = ct * COL_TILE + COL_TILE < n ? ct * COL_TILE + COL_TILE : n;
            for (int64_t r0 = rb * ROW_BLOCK; r0 < r_end; r0 += ROW_TILE) {
                const int nr = (int)(r_end - r0 < ROW_TILE ? r_end - r0 : ROW_TILE);
                for (int64_t c = ct * COL_TILE; c < c_end; c++) {
                    float out[ROW_TILE];
                    dot_tile(w + c * row_bytes, type, nb, q + r0 * k, d + r0 * nb, s + r0 * nb, k, nr, out);
                    const float bc = bias != NULL ? bias[c] : 0.f;
                    for (int r = 0; r < nr; r++) y[(r0 + r) * n + c] = out[r] + bc;
                }
            }
        }
    }
}

/* The ISA this library was built for, so tests and benchmarks can say which path they measured. */
const char *quant_gemm_isa(void) { return quant_isa_name(); }

/* out[N, K] = the float32 values of W, for row counts where a float GEMM beats the int8 dot products
 * (see quant_gemm.py): callers dequantize a slice of W at a time into a reused buffer. */
void dequantize_blocks(const uint8_t *w, int type, int64_t n, int64_t k, float *out, int nthreads) {
    const int64_t nb = k / QK, bb = BLOCK_BYTES[type], qs_at = type == Q4_1 ? 4 : 2;
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n * nb; i++) {
        const uint8_t *blk = w + i * bb, *qs = blk + qs_at;
        const float dw = f16_to_f32(load_u16(blk)), off = block_offset(blk, type, dw);
        float *o = out + i * QK;
        if (type == Q8_0) {
            for (int j = 0; j < QK; j++) o[j] = dw * (float)(int8_t)qs[j];
        } else {
            for (int j = 0; j < 16; j++) {
                o[j] = dw * (float)(qs[j] & 0x0f) + off;
                o[j + 16] = dw * (float)(qs[j] >> 4) + off;
            }
        }
    }
}
