/* Register-blocked int8 GEMM for many activation rows (prefill chunks, large batches), run by
 * cpu_quant_tiles.c per op and by cpu_decode_step.c inside its step's parallel region: y[M, N] = x[M, K] @ W[N, K]^T with W in a ggml block format (Q4_0, Q4_1, Q8_0) and x already
 * quantized to int8 blocks of 32 (q, scale d, s = d * sum(q)) by cpu_quant_gemm.c's quantize_rows_q8.
 *
 * Why a second kernel: the GEMV in cpu_quant_gemm.c unpacks each weight block per 4 rows and reduces
 * every 32-value dot product horizontally, which costs more per multiply-add than torch's fp32 GEMM.
 * Here each task first packs a panel of PANEL_COLS weight rows (unpacked to one byte per value,
 * scales as fp32) so that one load holds 4 consecutive values of LANES weight rows (8 on AVX2, 16 in a
 * zmm on VNNI); the micro-kernel broadcasts 4 activation bytes of each of its rows against it, so one
 * maddubs / vpdpbusd yields partial sums for LANES output columns in their own lanes: no horizontal
 * reduction, the block scale is applied once per block as a vector, and the panel stays in L1/L2 while
 * the rows of the task stream past it.
 * Exactness: Q4 values are 0..15 and activations -127..127, so a maddubs lane is <= 3810 and eight of
 * them (one block) add in int16 without overflow; Q8 values are signed, so on AVX2 their sign moves onto
 * the activation (|w| x sign(a, w), as the GEMV does) and each step widens to int32 at once; on VNNI
 * they are packed as w + 128 (tiles_zmm.h).
 * ISA: AVX-512 VNNI (tiles_zmm.h: 6 rows x 32 columns in zmm), AVX2 (maddubs, 4 rows x 8 columns),
 * plain C with -DCPU_PORTABLE or without AVX2 (the AVX2 layout, scalar loops).
 */
#ifndef QUANT_TILES_H
#define QUANT_TILES_H
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "quant_dot.h" /* QK, the block types, BLOCK_BYTES, quant_simd.h, row_groups.h */
#if defined(CPU_VNNI)
#define TILES_VNNI 1 /* vpdpbusd on zmm: tiles_zmm.h's micro-kernel over groups of 16 weight rows */
#include "tiles_zmm.h"
#endif

#ifdef TILES_VNNI
#define LANES ZLANES                         /* weight rows interleaved in one packed group */
#else
#define LANES 8
#endif
#define STEPS (QK / 4)                       /* 4 values of each row per step: LANES x 4 bytes */
#define GROUP_BLOCK_BYTES (2 * LANES * 4 + LANES * QK) /* dw[LANES], off[LANES] as fp32, then the values */
#define AVX2_ROWS 4                               /* activation rows per AVX2 / portable micro-kernel call */
#define PANEL_COLS 32                        /* weight rows packed per task, at most */
#define PANEL_BYTES (192 * 1024)             /* ... and packed bytes per task: the panel stays in L2 */
#define TASKS_PER_THREAD 4                   /* tasks a thread should have to take, at least, for balance */


/* One weight block as 32 byte values (u8 0..15 for Q4, the int8 bits for Q8), scale and offset. */
static void unpack_block(const uint8_t *blk, int type, uint8_t vals[QK], float *dw, float *off) {
    *dw = f16_to_f32(load_u16(blk));
    if (type == Q8_0) {
        memcpy(vals, blk + 2, QK);
#ifdef TILES_VNNI
        for (int j = 0; j < QK; j++) vals[j] ^= 0x80; /* w + 128 as u8: vpdpbusd's unsigned side (tiles_zmm.h) */
#endif
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

/* out step t (stride LANES * 4) = values 4t..4t+3 of 8 rows: an 8 x 8 transpose of 4-byte units. */
static void interleave8(uint8_t vals[8][QK], uint8_t *out) {
#ifdef CPU_AVX2
    __m256 v[8], t[8], u[8];
    for (int l = 0; l < 8; l++) v[l] = _mm256_loadu_ps((const float *)vals[l]);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; i++) {
        _mm256_storeu_ps((float *)(out + i * LANES * 4), _mm256_permute2f128_ps(u[i], u[i + 4], 0x20));
        _mm256_storeu_ps((float *)(out + (i + 4) * LANES * 4), _mm256_permute2f128_ps(u[i], u[i + 4], 0x31));
    }
#else
    for (int l = 0; l < 8; l++)
        for (int t = 0; t < STEPS; t++) memcpy(out + (t * LANES + l) * 4, vals[l] + 4 * t, 4);
#endif
}

/* Row c's block b of w, in the file's layout or (grouped) of the 8-row groups of row_groups.h. */
static const uint8_t *row_block(const uint8_t *w, int type, int grouped, int64_t row_bytes, int64_t c, int64_t b,
                                uint8_t lane[34]) {
    if (!grouped) return w + c * row_bytes + b * BLOCK_BYTES[type];
    group_block(group_chunk(w, row_bytes, BLOCK_BYTES[type], c, b), type, (int)(c % GROUP_ROWS), lane);
    return lane;
}

#ifdef CPU_AVX2
/* Block b of an 8-row group (its chunk) into lanes h..h+7 of a panel's group block, as unpack_block and
 * interleave8 would put them: the chunk's values are already in the panel's 4-byte steps, so only Q4's
 * nibbles split (and Q8 moves to w + 128 on VNNI), and the f16 scales widen as one vector. */
static void pack_group_block(const uint8_t *chunk, int type, int h, uint8_t *out) {
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)chunk));
    const __m256 off = type == Q4_1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(chunk + 16)))
                       : type == Q4_0 ? _mm256_mul_ps(_mm256_set1_ps(-8.f), dw) : _mm256_setzero_ps();
    _mm256_storeu_ps((float *)out + h, dw);
    _mm256_storeu_ps((float *)out + LANES + h, off);
    const uint8_t *src = chunk + GROUP_ROWS * group_head_bytes(type);
    uint8_t *vals = out + 2 * LANES * 4 + h * 4;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int t = 0; t < (type == Q8_0 ? STEPS : STEPS / 2); t++) {
        const __m256i raw = _mm256_loadu_si256((const __m256i *)(src + 32 * t));
        if (type == Q8_0) {
#ifdef TILES_VNNI
            _mm256_storeu_si256((__m256i *)(vals + t * LANES * 4), _mm256_xor_si256(raw, _mm256_set1_epi8((char)0x80)));
#else
            _mm256_storeu_si256((__m256i *)(vals + t * LANES * 4), raw);
#endif
        } else {
            _mm256_storeu_si256((__m256i *)(vals + t * LANES * 4), _mm256_and_si256(raw, m4));
            _mm256_storeu_si256((__m256i *)(vals + (t + 4) * LANES * 4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
        }
    }
}

/* A panel group block from 8-row groups; an 8-row half past the weight (n is a multiple of 8) is zero. */
static void pack_grouped(const uint8_t *w, int type, int64_t row_bytes, int64_t c, int64_t n, int64_t b, uint8_t *out) {
    for (int h = 0; h < LANES; h += GROUP_ROWS, c += GROUP_ROWS) {
        if (c < n) {
            pack_group_block(group_chunk(w, row_bytes, BLOCK_BYTES[type], c, b), type, h, out);
            continue;
        }
        memset((float *)out + h, 0, GROUP_ROWS * sizeof(float));
        memset((float *)out + LANES + h, 0, GROUP_ROWS * sizeof(float));
        for (int t = 0; t < STEPS; t++) memset(out + 2 * LANES * 4 + t * LANES * 4 + h * 4, 0, GROUP_ROWS * 4);
    }
}
#endif

/* Packs weight rows [c0, c0 + cols) into groups of LANES rows; rows past the weight are zero.
 * Per group and block: dw[8], off[8] as fp32, then step t holds values 4t..4t+3 of the 8 rows. */
static void pack_panel(const uint8_t *w, int type, int grouped, int64_t c0, int64_t cols, int64_t n, int64_t nb,
                       uint8_t *panel) {
    const int64_t row_bytes = nb * BLOCK_BYTES[type];
    for (int64_t g = 0; g < cols / LANES; g++) {
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *out = panel + (g * nb + b) * GROUP_BLOCK_BYTES, vals[LANES][QK], lane[34];
#ifdef CPU_AVX2
            if (grouped) {
                pack_grouped(w, type, row_bytes, c0 + g * LANES, n, b, out);
                continue;
            }
#endif
            float scales[2 * LANES];
            for (int l = 0; l < LANES; l++) {
                const int64_t c = c0 + g * LANES + l;
                if (c < n) unpack_block(row_block(w, type, grouped, row_bytes, c, b, lane), type, vals[l], &scales[l],
                                        &scales[LANES + l]);
                else { memset(vals[l], 0, QK); scales[l] = scales[LANES + l] = 0.f; }
            }
            memcpy(out, scales, sizeof scales);
            for (int h = 0; h < LANES; h += 8) interleave8(vals + h, out + sizeof scales + h * 4);
        }
    }
}

#if defined(CPU_AVX2) && !defined(TILES_VNNI)
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
    const __m256i p = _mm256_maddubs_epi16(wu, x);
    /* Q8 pairs reach 32385: widen every step; eight Q4 steps fit int16 and widen once per block */
    return type == Q8_0 ? _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
                        : _mm256_add_epi16(isum, p);
}

/* acc += the block's integer sums, scaled by dw x d (plus Q4's offset x s). */
static inline __attribute__((always_inline)) __m256 block_acc(__m256 acc, __m256i isum, __m256 dw, __m256 off,
                                                              float d, float s, int type) {
    const __m256i i32 = type == Q8_0 ? isum : _mm256_madd_epi16(isum, _mm256_set1_epi16(1));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i32), _mm256_mul_ps(dw, _mm256_set1_ps(d)), acc);
    return type == Q8_0 ? acc : _mm256_fmadd_ps(off, _mm256_set1_ps(s), acc);
}

/* out[r][l] = packed weight row l of this group . activation row r, for nr <= AVX2_ROWS rows. Always four
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
#elif !defined(TILES_VNNI)
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

/* y[r][c0 + j] = out[i * width + j] (+ bias) for rows r = r0 + i < r0 + nr and the panel's columns that exist. */
static void store_rows(const float *out, int width, int nr, int64_t r0, int64_t c0, const float *bias, float *y,
                       int64_t n) {
    const int64_t lanes = n - c0 < width ? n - c0 : width;
    for (int i = 0; i < nr; i++)
        for (int64_t j = 0; j < lanes; j++) y[(r0 + i) * n + c0 + j] = out[i * width + j] + (bias ? bias[c0 + j] : 0.f);
}

#ifdef TILES_VNNI
#define TILE_ROWS ZROWS
#define TYPED_TILE(T) zmm_tile(panel, nb * GROUP_BLOCK_BYTES, T, nr, q + r * k, d + r * nb, s + r * nb, \
                               corr ? corr + r * nb : NULL, k, nb, out)
/* Rows [r0, r1) of y against a packed panel of PANEL_COLS weight rows from c0 (two groups of 16). */
static void panel_rows(const uint8_t *panel, int type, int64_t c0, int64_t cols, int64_t r0, int64_t r1,
                       const int8_t *q, const float *d, const float *s, const int32_t *corr, const float *bias,
                       float *y, int64_t n, int64_t k) {
    const int64_t nb = k / QK;
    (void)cols;
    for (int64_t r = r0; r < r1; r += ZROWS) {
        const int nr = (int)(r1 - r < ZROWS ? r1 - r : ZROWS);
        float out[ZROWS * PANEL_COLS];
        if (type == Q4_0) TYPED_TILE(Q4_0);
        else if (type == Q4_1) TYPED_TILE(Q4_1);
        else TYPED_TILE(Q8_0);
        store_rows(out, PANEL_COLS, nr, r, c0, bias, y, n);
    }
}

/* Q8_0's correction per activation block: 128 x sum(q), what the panel's w + 128 adds (tiles_zmm.h). */
static void block_sums(const int8_t *q, int64_t rows, int64_t nb, int32_t *corr) {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < rows * nb; i++) {
        int32_t sum = 0;
        for (int j = 0; j < QK; j++) sum += q[i * QK + j];
        corr[i] = 128 * sum;
    }
}
#else
#define TILE_ROWS AVX2_ROWS
static void tile(const uint8_t *group, int type, int nr, const int8_t *q, const float *d, const float *s,
                 int64_t k, int64_t nb, float *out) {
    if (type == Q4_0) micro_tile(group, Q4_0, nr, q, d, s, k, nb, out);
    else if (type == Q4_1) micro_tile(group, Q4_1, nr, q, d, s, k, nb, out);
    else micro_tile(group, Q8_0, nr, q, d, s, k, nb, out);
}

/* Rows [r0, r1) of y against a packed panel of weight rows [c0, c0 + cols). */
static void panel_rows(const uint8_t *panel, int type, int64_t c0, int64_t cols, int64_t r0, int64_t r1,
                       const int8_t *q, const float *d, const float *s, const int32_t *corr, const float *bias,
                       float *y, int64_t n, int64_t k) {
    const int64_t nb = k / QK;
    (void)corr;
    for (int64_t r = r0; r < r1; r += AVX2_ROWS) {
        const int nr = (int)(r1 - r < AVX2_ROWS ? r1 - r : AVX2_ROWS);
        for (int64_t g = 0; g < cols / LANES; g++) {
            float out[AVX2_ROWS * LANES];
            tile(panel + g * nb * GROUP_BLOCK_BYTES, type, nr, q + r * k, d + r * nb, s + r * nb, k, nb, out);
            store_rows(out, LANES, nr, r, c0 + g * LANES, bias, y, n);
        }
    }
}
#endif

/* Columns per panel: PANEL_COLS (on VNNI always: its micro-kernel reads two groups), fewer for long K
 * elsewhere so that a panel stays within PANEL_BYTES. */
static int64_t panel_cols(int64_t nb) {
#ifdef TILES_VNNI
    (void)nb;
    return PANEL_COLS;
#else
    const int64_t fit = PANEL_BYTES / (nb * GROUP_BLOCK_BYTES) * LANES;
    return fit < LANES ? LANES : fit > PANEL_COLS ? PANEL_COLS : fit;
#endif
}

/* Bytes of one thread's packed panel for rows of k values. */
static inline size_t tiles_panel_bytes(int64_t k) {
    return (size_t)(panel_cols(k / QK) / LANES * (k / QK) * GROUP_BLOCK_BYTES);
}

/* Whether the panels read this weight type (id, grouped or not). */
static inline int tiles_read(int type) { return BASE_TYPE(type) <= Q8_0; }

/* y[M, N] = x @ W^T (+ bias) from activations quantized by quantize_rows_q8, as a work-shared loop of the
 * calling team (every thread of the parallel region calls it; it ends at the loop's barrier). Tasks are
 * (panel, row chunk) pairs in panel-major order, taken by whichever thread is free (a core another process
 * holds does not leave its share for the end); rows are split into chunks only as far as the threads need
 * tasks, since each task packs its panel unless its thread holds it already. Every output is computed by
 * one task in one order, so the split never changes a bit. panel: this thread's tiles_panel_bytes(k) (NULL:
 * it takes no task); corr: m * k / QK int32 of scratch the team shares (read for Q8_0 on VNNI only). */
static void tiles_team(const uint8_t *w, int type, const int8_t *q, const float *d, const float *s, int32_t *corr,
                       const float *bias, float *y, int64_t m, int64_t n, int64_t k, uint8_t *panel) {
    const int grouped = IS_GROUPED(type), nthreads = omp_get_num_threads();
    type = BASE_TYPE(type);
    const int64_t nb = k / QK, pcols = panel_cols(nb), panels = (n + pcols - 1) / pcols;
    const int64_t want = (TASKS_PER_THREAD * nthreads + panels - 1) / panels, most = (m + TILE_ROWS - 1) / TILE_ROWS;
    const int64_t chunks = want < 1 ? 1 : want > most ? most : want;
    const int64_t chunk_rows = ((m + chunks - 1) / chunks + TILE_ROWS - 1) / TILE_ROWS * TILE_ROWS;
    int64_t packed = -1;
#ifdef TILES_VNNI
    if (type == Q8_0) block_sums(q, m, nb, corr);
#endif
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < panels * chunks; task++) {
        const int64_t p = task / chunks, c0 = p * pcols, r0 = (task % chunks) * chunk_rows;
        const int64_t cols = n - c0 < pcols ? (n - c0 + LANES - 1) / LANES * LANES : pcols;
        if (panel == NULL || r0 >= m) continue;
        if (packed != p) pack_panel(w, type, grouped, c0, pcols, n, nb, panel);
        packed = p;
        panel_rows(panel, type, c0, cols, r0, r0 + chunk_rows < m ? r0 + chunk_rows : m, q, d, s, corr, bias, y, n, k);
    }
}

#endif
