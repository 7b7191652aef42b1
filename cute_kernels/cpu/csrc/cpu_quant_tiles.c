/* Register-blocked int8 GEMM for many activation rows (prefill chunks, large batches):
 * y[M, N] = x[M, K] @ W[N, K]^T with W in a ggml block format (Q4_0, Q4_1, Q8_0) and x already
 * quantized to int8 blocks of 32 (q, scale d, s = d * sum(q)) by cpu_quant_gemm.c's quantize_rows_q8.
 *
 * Why a second kernel: the GEMV in cpu_quant_gemm.c unpacks each weight block per 4 rows and reduces
 * every 32-value dot product horizontally, which costs more per multiply-add than torch's fp32 GEMM.
 * Here each thread first packs a panel of PANEL_COLS weight rows (unpacked to one byte per value,
 * scales as fp32) so that one 32-byte load holds 4 consecutive values of 8 weight rows; a micro-kernel
 * of ROWS activation rows x 8 weight rows then broadcasts 4 activation bytes against it, so
 * one maddubs yields partial sums for 8 output columns in their own lanes: no horizontal reduction,
 * the block scale is applied once per block as a vector, and the panel (<= PANEL_BYTES; fewer weight
 * rows for long K) stays in L2 while the rows of the task stream past it.
 * Exactness: Q4 values are 0..15 and activations -127..127, so a maddubs lane is <= 3810 and eight of
 * them (one block) add in int16 without overflow; Q8 values are signed, so their sign moves onto the
 * activation (|w| x sign(a, w), as the GEMV does) and each step widens to int32 at once.
 * ISA: AVX2 (maddubs), AVX-512 VNNI's vpdpbusd on 256-bit lanes where compiled for it, plain C with
 * -DQUANT_PORTABLE or without AVX2 (same packed layout, scalar loops).
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_simd.h" /* CPU_AVX2, CPU_VNNI, f16_to_f32, load_u16 */
#if defined(CPU_VNNI)
#define TILES_VNNI 1 /* vpdpbusd: u8 x s8 products summed into int32 lanes in one instruction */
#endif

#define QK 32
#define LANES 8                              /* weight rows interleaved in one packed group */
#define STEPS (QK / 4)                       /* 4 values of each of the 8 rows per 32-byte step */
#define GROUP_BLOCK_BYTES (2 * LANES * 4 + LANES * QK) /* dw[8], off[8] as fp32, then 8 x 32 values */
#define ROWS 4                               /* activation rows per micro-kernel call */
#define PANEL_COLS 32                        /* weight rows packed per task, at most */
#define PANEL_BYTES (192 * 1024)             /* ... and packed bytes per task: the panel stays in L2 */
#define ROW_CHUNK 256                        /* activation rows per task (a multiple of ROWS) */

enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2 };
static const int64_t BLOCK_BYTES[] = {18, 20, 34};

/* One weight block as 32 byte values (u8 0..15 for Q4, the int8 bits for Q8), scale and offset. */
static void unpack_block(const uint8_t *blk, int type, uint8_t vals[QK], float *dw, float *off) {
    *dw = f16_to_f32(load_u16(blk));
    if (type == Q8_0) {
        memcpy(vals, blk + 2, QK);
        *off = 0.f;
        return;
    }
    const uint8_t *qs = blk + (type == Q4_1 ? 4 : 2);
#ifdef CPU_AVX2
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0f);
    _mm_storeu_si128((__m128i *)vals, _mm_and_si128(raw, m4));
    _mm_storeu_si128((__m128i *)(vals + 16), _mm_and_si128(_mm_srli_epi16(raw, 4), m4));
#else
    for (int j = 0; j < 16; j++) { vals[j] = qs[j] & 0x0f; vals[j + 16] = qs[j] >> 4; }
#endif
    if (type == Q4_1) *off = f16_to_f32(load_u16(blk + 2));
    else *off = -8.f * *dw; /* Q4_0 stores q + 8 */
}

/* out step t = values 4t..4t+3 of each of the 8 rows: an 8 x 8 transpose of 4-byte units. */
static void interleave_steps(uint8_t vals[LANES][QK], uint8_t *out) {
#ifdef CPU_AVX2
    __m256 v[LANES], t[LANES], u[LANES];
    for (int l = 0; l < LANES; l++) v[l] = _mm256_loadu_ps((const float *)vals[l]);
    for (int i = 0; i < LANES; i += 2) {
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < LANES; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps((float *)(out + i * 32), _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps((float *)(out + (i + 4) * 32), _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
#else
    for (int l = 0; l < LANES; l++)
        for (int t = 0; t < STEPS; t++) memcpy(out + (t * LANES + l) * 4, vals[l] + 4 * t, 4);
#endif
}

/* Packs weight rows [c0, c0 + cols) into groups of LANES rows; rows past the weight are zero.
 * Per group and block: dw[8], off[8] as fp32, then step t holds values 4t..4t+3 of the 8 rows. */
static void pack_panel(const uint8_t *w, int type, int64_t c0, int64_t cols, int64_t n, int64_t nb, uint8_t *panel) {
    const int64_t row_bytes = nb * BLOCK_BYTES[type];
    for (int64_t g = 0; g < cols / LANES; g++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *out = panel + (g * nb + b) * GROUP_BLOCK_BYTES, vals[LANES][QK];
            float scales[2 * LANES];
            for (int l = 0; l < LANES; l++) {
                const int64_t c = c0 + g * LANES + l;
                if (c < n) unpack_block(w + c * row_bytes + b * BLOCK_BYTES[type], type, vals[l], &scales[l], &scales[LANES + l]);
                else { memset(vals[l], 0, QK); scales[l] = scales[LANES + l] = 0.f; }
            }
            memcpy(out, scales, sizeof scales);
            interleave_steps(vals, out + sizeof scales);
        }
    }
}

#ifdef CPU_AVX2
static inline __m256i load_act4(const int8_t *p) { /* 4 activation bytes, broadcast to 8 lanes */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* One step's 4 values of 8 weight rows (wu: as u8; w: signed, for Q8_0's sign move) against 4 values of
 * one activation row, added into that row's running block sum. */
static inline __attribute__((always_inline)) __m256i step_sum(__m256i isum, __m256i wu, __m256i w, const int8_t *qa,
                                                              int type) {
    const __m256i a = load_act4(qa), x = type == Q8_0 ? _mm256_sign_epi8(a, w) : a;
#ifdef TILES_VNNI
    return _mm256_dpbusd_epi32(isum, wu, x);
#else
    const __m256i p = _mm256_maddubs_epi16(wu, x);
    /* Q8 pairs reach 32385: widen every step; eight Q4 steps fit int16 and widen once per block */
    return type == Q8_0 ? _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
                        : _mm256_add_epi16(isum, p);
#endif
}

/* acc += the block's integer sums, scaled by dw x d (plus Q4's offset x s). */
static inline __attribute__((always_inline)) __m256 block_acc(__m256 acc, __m256i isum, __m256 dw, __m256 off,
                                                              float d, float s, int type) {
#ifdef TILES_VNNI
    const __m256i i32 = isum;
#else
    const __m256i i32 = type == Q8_0 ? isum : _mm256_madd_epi16(isum, _mm256_set1_epi16(1));
#endif
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_set1_ps(d)), acc);
    return type == Q8_0 ? acc : _mm256_fmadd_ps(off, _mm256_set1_ps(s), acc);
}

/* out[r][l] = packed weight row l of this group . activation row r, for nr <= ROWS rows. Always four
 * rows in named registers (arrays indexed in loops ended up on the stack, a store-forward on every
 * accumulation); rows past nr repeat the last real row and are not stored. Inlined with constant type. */
static inline __attribute__((always_inline)) void micro_tile(const uint8_t *group, int type, int nr, const int8_t *q,
        const float *d, const float *s, int64_t k, int64_t nb, float *out) {
    const int64_t r1 = nr > 1 ? 1 : 0, r2 = nr > 2 ? 2 : nr - 1, r3 = nr > 3 ? 3 : nr - 1;
    const int8_t *q0 = q, *q1 = q + r1 * k, *q2 = q + r2 * k, *q3 = q + r3 * k;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = group + b * GROUP_BLOCK_BYTES;
        __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
        const int64_t at = b * QK;
        _Pragma("GCC unroll 4") for (int t = 0; t < STEPS; t++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(blk + 2 * LANES * 4 + t * 32));
            const __m256i wu = type == Q8_0 ? _mm256_sign_epi8(w, w) : w; /* |w| as u8; its sign moves to x */
            s0 = step_sum(s0, wu, w, q0 + at + 4 * t, type);
            s1 = step_sum(s1, wu, w, q1 + at + 4 * t, type);
            s2 = step_sum(s2, wu, w, q2 + at + 4 * t, type);
            s3 = step_sum(s3, wu, w, q3 + at + 4 * t, type);
        }
        const __m256 dw = _mm256_loadu_ps((const float *)blk), off = _mm256_loadu_ps((const float *)blk + LANES);
        acc0 = block_acc(acc0, s0, dw, off, d[b], s[b], type);
        acc1 = block_acc(acc1, s1, dw, off, d[r1 * nb + b], s[r1 * nb + b], type);
        acc2 = block_acc(acc2, s2, dw, off, d[r2 * nb + b], s[r2 * nb + b], type);
        acc3 = block_acc(acc3, s3, dw, off, d[r3 * nb + b], s[r3 * nb + b], type);
    }
    _mm256_storeu_ps(out, acc0);
    if (nr > 1) _mm256_storeu_ps(out + LANES, acc1);
    if (nr > 2) _mm256_storeu_ps(out + 2 * LANES, acc2);
    if (nr > 3) _mm256_storeu_ps(out + 3 * LANES, acc3);
}
#else
static inline void micro_tile(const uint8_t *group, int type, int nr, const int8_t *q, const float *d,
        const float *s, int64_t k, int64_t nb, float *out) {
    for (int r = 0; r < nr; r++)
        for (int l = 0; l < LANES; l++) {
            float acc = 0.f;
            for (int64_t b = 0; b < nb; b++) {
                const uint8_t *blk = group + b * GROUP_BLOCK_BYTES, *vals = blk + 2 * LANES * 4;
                float scales[2 * LANES];
                memcpy(scales, blk, sizeof scales);
                uint8_t v[QK]; /* weight column l's block, gathered from the interleaved panel */
                for (int j = 0; j < QK; j++) v[j] = vals[((j / 4) * LANES + l) * 4 + j % 4];
                const int8_t *x = q + r * k + b * QK;
                const int32_t isum = type == Q8_0 ? dot32_s8((const int8_t *)v, x) : dot32_u8(v, x);
                acc = fmaf((float)isum, scales[l] * d[r * nb + b], acc); /* the GEMV's order (quant_dot.h) */
                if (type != Q8_0) acc = fmaf(scales[LANES + l], s[r * nb + b], acc);
            }
            out[r * LANES + l] = acc;
        }
}
#endif

static void tile(const uint8_t *group, int type, int nr, const int8_t *q, const float *d, const float *s,
                 int64_t k, int64_t nb, float *out) {
    if (type == Q4_0) micro_tile(group, Q4_0, nr, q, d, s, k, nb, out);
    else if (type == Q4_1) micro_tile(group, Q4_1, nr, q, d, s, k, nb, out);
    else micro_tile(group, Q8_0, nr, q, d, s, k, nb, out);
}

/* Rows [r0, r1) of y against a packed panel of weight rows [c0, c0 + cols). */
static void panel_rows(const uint8_t *panel, int type, int64_t c0, int64_t cols, int64_t r0, int64_t r1,
                       const int8_t *q, const float *d, const float *s, const float *bias, float *y,
                       int64_t n, int64_t k) {
    const int64_t nb = k / QK;
    for (int64_t r = r0; r < r1; r += ROWS) {
        const int nr = (int)(r1 - r < ROWS ? r1 - r : ROWS);
        for (int64_t g = 0; g < cols / LANES; g++) {
            float out[ROWS * LANES];
            tile(panel + g * nb * GROUP_BLOCK_BYTES, type, nr, q + r * k, d + r * nb, s + r * nb, k, nb, out);
            const int64_t c = c0 + g * LANES, lanes = n - c < LANES ? n - c : LANES;
            for (int i = 0; i < nr; i++)
                for (int j = 0; j < lanes; j++) y[(r + i) * n + c + j] = out[i * LANES + j] + (bias ? bias[c + j] : 0.f);
        }
    }
}

/* y[M, N] = x @ W^T (+ bias) from activations quantized by quantize_rows_q8. Tasks are (panel, row
 * chunk) pairs in panel-major order, split statically, so a thread's consecutive tasks mostly share
 * a panel and pack it once. Returns 0, or -1 when a thread's panel buffer could not be allocated. */
int quant_gemm_tiles(const uint8_t *w, int type, const int8_t *q, const float *d, const float *s, const float *bias,
                     float *y, int64_t m, int64_t n, int64_t k, int nthreads) {
    if (type != Q4_0 && type != Q4_1 && type != Q8_0) return 2; /* the other block types have no panel layout */
    const int64_t nb = k / QK, fit = PANEL_BYTES / (nb * GROUP_BLOCK_BYTES) * LANES;
    const int64_t pcols = fit < LANES ? LANES : fit > PANEL_COLS ? PANEL_COLS : fit;
    const int64_t panels = (n + pcols - 1) / pcols, chunks = (m + ROW_CHUNK - 1) / ROW_CHUNK;
    int failed = 0;
#pragma omp parallel num_threads(nthreads) reduction(| : failed)
    {
        uint8_t *panel = malloc((size_t)(pcols / LANES * nb * GROUP_BLOCK_BYTES));
        int64_t packed = -1;
        failed = panel == NULL;
#pragma omp for schedule(static)
        for (int64_t task = 0; task < panels * chunks; task++) {
            const int64_t p = task / chunks, c0 = p * pcols, r0 = (task % chunks) * ROW_CHUNK;
            const int64_t cols = n - c0 < pcols ? (n - c0 + LANES - 1) / LANES * LANES : pcols;
            if (panel == NULL) continue;
            if (packed != p) pack_panel(w, type, c0, cols, n, nb, panel);
            packed = p;
            panel_rows(panel, type, c0, cols, r0, r0 + ROW_CHUNK < m ? r0 + ROW_CHUNK : m, q, d, s, bias, y, n, k);
        }
        free(panel);
    }
    return failed ? -1 : 0;
}

/* The SIMD route this library was built for (isa.h), so tests and benchmarks can say which ran. */
const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
