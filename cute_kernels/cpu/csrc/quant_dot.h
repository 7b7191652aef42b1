/* Block-format dot products shared by the quantized linear (cpu_quant_gemm.c) and the fused decode
 * step (cpu_decode_step.c): ggml Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weight rows against activations quantized to int8 per
 * 32 values. Static inline, so each including library compiles them for its own ISA flags. */
#ifndef QUANT_DOT_H
#define QUANT_DOT_H
#include <math.h>
#include <stddef.h>

#include "quant_simd.h"
#include "row_groups.h"

#define QK 32        /* values per block, weights and activations */
#define ROW_TILE 4   /* activation rows sharing one unpacked weight block */
#define GROUP_PREFETCH 4096 /* bytes dot_group8 prefetches ahead (2-8 KiB measured alike, none slower) */

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
    /* the 16 bytes in both halves (a broadcast load, no shuffle), the upper half shifted by a nibble */
    const __m256i raw = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    return _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
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

/* The 8 lanes' integer sums of v[0..7], as one vector (lane l: v[l]'s sum); exact. */
static inline __m256i hsum8_i32(const __m256i v[8]) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* out[r * 8 + l] = weight row l (at w + l * row_bytes) . activation row r, for 8 rows of W and r < nr.
 * Accumulation order (batch invariance): per block the exact integer dot, then acc = fma(isum, dw * dx,
 * acc) and acc = fma(off, s, acc), block after block, one lane per weight row: the order of
 * cpu_quant_tiles.c's lanes, so a row gets the same bits from this GEMV, the tiles GEMM and the fused
 * decode step, whatever the batch. Always inlined with constant type and nr (dot_tile8). */
static inline __attribute__((always_inline)) void dot_cols8(const uint8_t *w, int64_t row_bytes, int type, int64_t nb,
        const int8_t *q, const float *d, const float *s, int64_t k, int nr, float *out) {
    __m256 acc[ROW_TILE];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const int64_t bb = BLOCK_BYTES[type];
    const __m256i rows_at = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32((int)row_bytes));
    /* a gathered block head (d, then m or other bytes) per lane -> words [d of rows 0-3, m of 0-3 | 4-7] */
    const __m256i heads = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
                                           0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
    for (int64_t b = 0; b < nb; b++) {
        __m256i wv[8], wu[8];
        for (int l = 0; l < 8; l++) {
            const uint8_t *blk = w + l * row_bytes + b * bb;
            wv[l] = unpack_weights(blk, type);
            wu[l] = type == Q8_0 ? _mm256_sign_epi8(wv[l], wv[l]) : wv[l]; /* |w| as u8; the sign moves to x */
        }
        /* the 8 rows' fp16 d (and m) by one gather of each block's first 4 bytes: 8 scalar loads and
         * stores per block cost more than the dot products' shuffles */
        const __m256i dm = _mm256_permute4x64_epi64(
            _mm256_shuffle_epi8(_mm256_i32gather_epi32((const int *)(w + b * bb), rows_at, 1), heads), 0xd8);
        const __m256 dw = _mm256_cvtph_ps(_mm256_castsi256_si128(dm));
        const __m256 off = HAS_MIN(type) ? _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1))
                           : _mm256_mul_ps(_mm256_set1_ps(type == Q4_0 ? -8.f : -16.f), dw);
        for (int r = 0; r < nr; r++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)(q + r * k + b * QK));
            __m256i dots[8];
            for (int l = 0; l < 8; l++) dots[l] = dot_u8_s8(wu[l], type == Q8_0 ? _mm256_sign_epi8(x, wv[l]) : x);
            const __m256 isum = _mm256_cvtepi32_ps(hsum8_i32(dots));
            acc[r] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dw, _mm256_set1_ps(d[r * nb + b])), acc[r]);
            if (type != Q8_0) acc[r] = _mm256_fmadd_ps(off, _mm256_set1_ps(s[r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) _mm256_storeu_ps(out + r * 8, acc[r]);
}

static inline int32_t hsum_i32(__m256i v) { /* exact: the lanes' integer sum */
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 1)));
}

/* Adds the products of one step (4 values of 8 weight rows; wu as u8, w signed for Q8_0's sign move) with
 * 4 activation bytes into isum: int32 lanes (VNNI, and Q8_0 on AVX2), or int16 pairs for Q4 on AVX2
 * (eight steps of 4-bit values stay under 30,480; group_sum widens them). */
static inline __attribute__((always_inline)) __m256i group_step(__m256i isum, __m256i wu, __m256i w,
                                                                const int8_t *x4, int type) {
    int32_t v;
    memcpy(&v, x4, 4);
    const __m256i a = _mm256_set1_epi32(v), x = type == Q8_0 ? _mm256_sign_epi8(a, w) : a;
#ifdef CPU_VNNI
    return _mm256_dpbusd_epi32(isum, wu, x);
#else
    const __m256i p = _mm256_maddubs_epi16(wu, x);
    return type == Q8_0 ? _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16(1))) : _mm256_add_epi16(isum, p);
#endif
}

static inline __m256i group_sum(__m256i a, __m256i b, int type) { /* the two chains' exact int32 sums */
#ifdef CPU_VNNI
    (void)type;
    return _mm256_add_epi32(a, b);
#else
    return type == Q8_0 ? _mm256_add_epi32(a, b) : _mm256_madd_epi16(_mm256_add_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

/* dot_cols8 over an 8-row group (row_groups.h) of base type `type` at g: the same integer block sums, in
 * lanes without a horizontal reduction, scaled in dot_cols8's order, so the same bits. */
static inline __attribute__((always_inline)) void dot_group8(const uint8_t *g, int64_t row_bytes, int type, int64_t nb,
        const int8_t *q, const float *d, const float *s, int64_t k, int nr, float *out) {
    (void)row_bytes;
    __m256 acc[ROW_TILE];
    for (int r = 0; r < nr; r++) acc[r] = _mm256_setzero_ps();
    const int64_t cb = GROUP_ROWS * BLOCK_BYTES[type], at = GROUP_ROWS * group_head_bytes(type);
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = g + b * cb;
        /* the groups follow each other, so the weight streams: ask for it ahead (the hardware prefetcher
         * alone left the LM head at half the read bandwidth after a step had evicted it) */
        for (int64_t p = 0; p < cb; p += 64) _mm_prefetch((const char *)(c + GROUP_PREFETCH + p), _MM_HINT_T0);
        __m256i wv[8], wu[8];
        for (int t = 0; t < (type == Q8_0 ? 8 : 4); t++) {
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(c + at + 32 * t));
            if (type == Q8_0) {
                wv[t] = raw;
                wu[t] = _mm256_sign_epi8(raw, raw); /* |w| as u8; the sign moves to x */
            } else { /* steps t and t + 4: values 4t.. and 16 + 4t.. of the 8 rows */
                wu[t] = wv[t] = _mm256_and_si256(raw, m4);
                wu[t + 4] = wv[t + 4] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)c));
        const __m256 off = HAS_MIN(type) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(c + 16)))
                           : _mm256_mul_ps(_mm256_set1_ps(-8.f), dw);
        for (int r = 0; r < nr; r++) {
            const int8_t *x = q + r * k + b * QK;
            __m256i even = _mm256_setzero_si256(), odd = even; /* two chains: vpdpbusd's latency */
            for (int t = 0; t < 8; t += 2) {
                even = group_step(even, wu[t], wv[t], x + 4 * t, type);
                odd = group_step(odd, wu[t + 1], wv[t + 1], x + 4 * t + 4, type);
            }
            const __m256 isum = _mm256_cvtepi32_ps(group_sum(even, odd, type));
            acc[r] = _mm256_fmadd_ps(isum, _mm256_mul_ps(dw, _mm256_set1_ps(d[r * nb + b])), acc[r]);
            if (type != Q8_0) acc[r] = _mm256_fmadd_ps(off, _mm256_set1_ps(s[r * nb + b]), acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) _mm256_storeu_ps(out + r * 8, acc[r]);
}

/* out[r] = row n of W . activation row r, for r < nr rows (nr <= ROW_TILE), in dot_cols8's order (for
 * the columns past a multiple of 8). Always inlined with constant type and nr (see dot_tile). */
static inline __attribute__((always_inline)) void dot_rows(const uint8_t *wrow, int type, int64_t nb, const int8_t *q, const float *d, const float *s,
                     int64_t k, int nr, float *out) {
    float acc[ROW_TILE] = {0.f, 0.f, 0.f, 0.f};
    const int64_t bb = BLOCK_BYTES[type];
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *blk = wrow + b * bb;
        const float dw = f16_to_f32(load_u16(blk)), off = block_offset(blk, type, dw);
        const __m256i w = unpack_weights(blk, type);
        const __m256i wu = type == Q8_0 ? _mm256_sign_epi8(w, w) : w;
        for (int r = 0; r < nr; r++) {
            __m256i x = _mm256_loadu_si256((const __m256i *)(q + r * k + b * QK));
            if (type == Q8_0) x = _mm256_sign_epi8(x, w);
            acc[r] = fmaf((float)hsum_i32(dot_u8_s8(wu, x)), dw * d[r * nb + b], acc[r]);
            if (type != Q8_0) acc[r] = fmaf(off, s[r * nb + b], acc[r]);
        }
    }
    for (int r = 0; r < nr; r++) out[r] = acc[r];
}
#else
/* acc[r] += block b (at blk, in the file's layout) . activation row r's block b, in the AVX2 route's order. */
static inline void block_rows_acc(const uint8_t *blk, int type, int64_t b, int64_t nb, const int8_t *q, const float *d,
                                  const float *s, int64_t k, int nr, float *acc) {
    const float dw = f16_to_f32(load_u16(blk)), off = block_offset(blk, type, dw);
    const uint8_t *qs = blk + QS_AT[type];
    const uint32_t qh = fifth_bits_u32(blk, type);
    uint8_t w[QK];
    if (type != Q8_0)
        for (int j = 0; j < QK / 2; j++) unsigned_pair(qs, qh, j, &w[j], &w[j + 16]);
    for (int r = 0; r < nr; r++) {
        const int8_t *x = q + r * k + b * QK;
        const int32_t isum = type == Q8_0 ? dot32_s8((const int8_t *)qs, x) : dot32_u8(w, x);
        acc[r] = fmaf((float)isum, dw * d[r * nb + b], acc[r]);
        if (type != Q8_0) acc[r] = fmaf(off, s[r * nb + b], acc[r]);
    }
}

static inline __attribute__((always_inline)) void dot_rows(const uint8_t *wrow, int type, int64_t nb, const int8_t *q, const float *d, const float *s,
                     int64_t k, int nr, float *out) {
    for (int r = 0; r < nr; r++) out[r] = 0.f;
    for (int64_t b = 0; b < nb; b++) block_rows_acc(wrow + b * BLOCK_BYTES[type], type, b, nb, q, d, s, k, nr, out);
}

/* dot_cols8 over an 8-row group (row_groups.h): each lane's block re-assembled, then dot_rows' order. */
static inline __attribute__((always_inline)) void dot_group8(const uint8_t *g, int64_t row_bytes, int type, int64_t nb,
        const int8_t *q, const float *d, const float *s, int64_t k, int nr, float *out) {
    const int64_t bb = BLOCK_BYTES[type];
    for (int l = 0; l < GROUP_ROWS; l++) {
        float col[ROW_TILE] = {0.f, 0.f, 0.f, 0.f};
        for (int64_t b = 0; b < nb; b++) {
            uint8_t blk[34];
            group_block(group_chunk(g, row_bytes, bb, 0, b), type, l, blk);
            block_rows_acc(blk, type, b, nb, q, d, s, k, nr, col);
        }
        for (int r = 0; r < nr; r++) out[r * 8 + l] = col[r];
    }
}
#endif

#ifndef CPU_AVX2
/* out[r * 8 + l] as the AVX2 route's dot_cols8: column by column, in dot_rows' (same) order. */
static inline __attribute__((always_inline)) void dot_cols8(const uint8_t *w, int64_t row_bytes, int type, int64_t nb,
        const int8_t *q, const float *d, const float *s, int64_t k, int nr, float *out) {
    for (int l = 0; l < 8; l++) {
        float col[ROW_TILE];
        dot_rows(w + l * row_bytes, type, nb, q, d, s, k, nr, col);
        for (int r = 0; r < nr; r++) out[r * 8 + l] = col[r];
    }
}
#endif

#define DOT8_TYPE(F, T)                                                          \
    switch (nr) {                                                                \
    case 4: F(w, row_bytes, T, nb, q, d, s, k, 4, out); break;                   \
    case 3: F(w, row_bytes, T, nb, q, d, s, k, 3, out); break;                   \
    case 2: F(w, row_bytes, T, nb, q, d, s, k, 2, out); break;                   \
    default: F(w, row_bytes, T, nb, q, d, s, k, 1, out); break;                  \
    }

/* 8 weight rows from w, row_bytes apart (or the 8-row group at w, for a grouped type), against nr
 * activation rows: out[r * 8 + l]. */
static inline void dot_tile8(const uint8_t *w, int64_t row_bytes, int type, int64_t nb, const int8_t *q,
                             const float *d, const float *s, int64_t k, int nr, float *out) {
    if (type == (Q4_0 | GROUPED_TYPE)) { DOT8_TYPE(dot_group8, Q4_0) }
    else if (type == (Q4_1 | GROUPED_TYPE)) { DOT8_TYPE(dot_group8, Q4_1) }
    else if (type == (Q8_0 | GROUPED_TYPE)) { DOT8_TYPE(dot_group8, Q8_0) }
    else if (type == Q4_0) { DOT8_TYPE(dot_cols8, Q4_0) }
    else if (type == Q4_1) { DOT8_TYPE(dot_cols8, Q4_1) }
    else if (type == Q5_0) { DOT8_TYPE(dot_cols8, Q5_0) }
    else if (type == Q5_1) { DOT8_TYPE(dot_cols8, Q5_1) }
    else { DOT8_TYPE(dot_cols8, Q8_0) }
}

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
