/* Block-format dot products shared by the quantized linear (cpu_quant_gemm.c) and the fused decode
 * step (cpu_decode_step.c): ggml Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weight rows against activations quantized to int8 per
 * 32 values. Static inline, so each including library compiles them for its own ISA flags. */
#ifndef QUANT_DOT_H
#define QUANT_DOT_H
#include <math.h>
#include <stddef.h>

#include "quant_simd.h"

#define QK 32        /* values per block, weights and activations */
#define ROW_TILE 4   /* activation rows sharing one unpacked weight block */

enum { Q4_0 = 0, Q4_1 = 1, Q8_0 = 2, Q5_0 = 3, Q5_1 = 4 };
static const int64_t BLOCK_BYTES[] = {18, 20, 34, 22, 24};
static const int64_t QS_AT[] = {2, 4, 2, 6, 8}; /* where the nibbles (Q8_0: the int8 values) start */
#define HAS_MIN(type) ((type) == Q4_1 || (type) == Q5_1) /* an f16 m after d */
#define FIVE_BITS(type) ((type) == Q5_0 || (type) == Q5_1) /* 4 bytes qh before the nibbles */

/* Per block, as ggml's quantize_row_q8_1: q = round(x * 127 / amax) (ties to even), d = amax / 127 and
 * s = d * sum(q), d kept at fp16 precision (block_q8_1 stores it as fp16). */
static inline void quantize_block_q8(const float *xb, int8_t *q, float *d, float *s) {
    float amax = 0.f;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(xb[j]));
    const float scale = amax / 127.f, inv = amax != 0.f ? 127.f / amax : 0.f;
    int sum = 0;
    for (int j = 0; j < QK; j++) {
        const int v = (int)nearbyintf(xb[j] * inv);
        q[j] = (int8_t)v;
        sum += v;
    }
    *d = f16_round(scale);
    *s = *d * (float)sum;
}

/* A weight block's scale and offset term: y += d_w * d_x * dot(q_w, q_x) + offset * s_x. */
static inline float block_offset(const uint8_t *blk, int type, float dw) {
    if (HAS_MIN(type)) return f16_to_f32(load_u16(blk + 2));
    return type == Q4_0 ? -8.f * dw : type == Q5_0 ? -16.f * dw : 0.f; /* stored as q + 8, q + 16 */
}

/* A block's fifth bits (bit j: value j), 0 for the 4-bit types. */
static inline uint32_t fifth_bits_u32(const uint8_t *blk, int type) {
    uint32_t qh = 0;
    if (FIVE_BITS(type)) memcpy(&qh, blk + QS_AT[type] - 4, 4);
    return qh;
}

/* Values j and j + 16 (j < 16) of a 4- or 5-bit block, unsigned, into *lo and *hi. */
static inline void unsigned_pair(const uint8_t *qs, uint32_t qh, int j, uint8_t *lo, uint8_t *hi) {
    *lo = (uint8_t)((qs[j] & 0x0f) | (((qh >> j) & 1) << 4));
    *hi = (uint8_t)((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
}

#ifdef CPU_AVX2
static inline __m256i unpack_q4(const uint8_t *qs) { /* byte j: value j low nibble, value j+16 high */
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(0x0f);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), m4), _mm_and_si128(raw, m4));
}

static inline __m256i fifth_bits(const uint8_t *qh) { /* byte j: 16 where bit j of qh is set, else 0 */
    uint32_t bits;
    memcpy(&bits, qh, 4);
    /* byte j takes qh byte j / 8 (shuffles stay within 128-bit lanes; both lanes hold all 4 bytes) */
    const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits),
        _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull); /* bit j % 8 */
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

static inline __m256i unpack_weights(const uint8_t *blk, int type) { /* Q8_0 as int8, the rest as u8 */
    const uint8_t *qs = blk + QS_AT[type];
    if (type == Q8_0) return _mm256_loadu_si256((const __m256i *)qs);
    const __m256i low = unpack_q4(qs);
    return FIVE_BITS(type) ? _mm256_or_si256(low, fifth_bits(qs - 4)) : low;
}

/* out[r] = row n of W . activation row r, for r < nr rows (nr <= ROW_TILE). Always inlined with
 * constant type and nr (see dot_tile), so each combination compiles to straight-line code. */
static inline __attribute__((always_inline)) void dot_rows(const uint8_t *wrow, int type, int64_t nb, const int8_t *q, const float *d, const float *s,
                     int64_t k, int nr, float *out) {
    __m256 acc[ROW_TILE];
    float off_acc[ROW_TILE] = {0.f, 0.f, 0.f, 0.f};
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const int64_t bb = BLOCK_BYTES[type];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + b * bb;
        const float dw = f16_to_f32(load_u16(blk)), off = block_offset(blk, type, dw);
        const __m256i w = unpack_weights(blk, type);
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
    const int64_t bb = BLOCK_BYTES[type];
    for (int r = 0; r < nr; r++) out[r] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + b * bb;
        const float dw = f16_to_f32(load_u16(blk)), off = block_offset(blk, type, dw);
        const uint8_t *qs = blk + QS_AT[type];
        const uint32_t qh = fifth_bits_u32(blk, type);
        uint8_t w[QK];
        if (type != Q8_0)
            for (int j = 0; j < QK / 2; j++) unsigned_pair(qs, qh, j, &w[j], &w[j + 16]);
        for (int r = 0; r < nr; r++) {
            const int8_t *x = q + r * k + b * QK;
            const int32_t isum = type == Q8_0 ? dot32_s8((const int8_t *)qs, x) : dot32_u8(w, x);
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

static inline void dot_tile(const uint8_t *wrow, int type, int64_t nb, const int8_t *q, const float *d, const float *s,
                     int64_t k, int nr, float *out) {
    if (type == Q4_0) { DOT_TYPE(Q4_0) }
    else if (type == Q4_1) { DOT_TYPE(Q4_1) }
    else if (type == Q5_0) { DOT_TYPE(Q5_0) }
    else if (type == Q5_1) { DOT_TYPE(Q5_1) }
    else { DOT_TYPE(Q8_0) }
}

#endif
