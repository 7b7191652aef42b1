/* Quantized linear layers over ggml's K-quant super-blocks (Q4_K, Q5_K, Q6_K: 256 values each, read
 * in place from the GGUF layout; see cute_kernels/cpu/kquant_blocks.py for the byte layouts):
 * y[M, N] = x[M, K] @ W[N, K]^T with x quantized by cpu_quant_gemm.c's quantize_rows_q8 to int8 in
 * blocks of 32 (scale d, s = d * sum(q)).
 *
 * A super-block is 8 sub-blocks of 32 values, so each activation block meets exactly one sub-block:
 *   Q4_K / Q5_K: w = (d sc_i) q - dmin m_i  ->  y += (d sc_i) d_x dot(q, q_x) - dmin m_i s_x
 *   Q6_K:        w = d sc_g (q - 32), one sc_g per 16 values  ->  y += d d_x sum_g sc_g dot_g(q - 32, q_x)
 * Integer dot products are exact; only the float sums of per-block results differ from the torch
 * reference (cute_kernels/cpu/quant_reference.py). Q6_K's two int8 scales per 32 values ride in the
 * maddubs + madd pair (madd by the scales instead of by ones), on VNNI machines too: vpdpbusd would
 * need a separate multiply for them.
 * Work splits over OpenMP threads by (row block, column tile), as in cpu_quant_gemm.c.
 */
#include <omp.h>
#include <stddef.h>

#include "quant_simd.h"

#define QK 32
#define QK_K 256
#define SUBS 8       /* 32-value sub-blocks per super-block */
#define ROW_TILE 4   /* activation rows sharing one unpacked super-block */

#include "column_tiles.h" /* after ROW_TILE, which it reads */

enum { Q4_K = 0, Q5_K = 1, Q6_K = 2 };
static const int64_t BLOCK_BYTES[] = {144, 176, 210};
static const int64_t QS_AT[] = {16, 48, 0}; /* where the low 4 bits start */

/* A super-block's scales: d, an integer scale per 16 values, and the offset per 32 (-dmin m). */
typedef struct {
    float d;
    int32_t sc[2 * SUBS];
    float off[SUBS];
} kscales;

static inline void decode_scales(const uint8_t *blk, int type, kscales *ks) {
    if (type == Q6_K) {
        ks->d = f16_to_f32(load_u16(blk + 208));
        for (int g = 0; g < 2 * SUBS; g++) ks->sc[g] = (int8_t)blk[192 + g];
        for (int i = 0; i < SUBS; i++) ks->off[i] = 0.f;
        return;
    }
    const uint8_t *p = blk + 4; /* 6-bit scales and mins, packed as ggml's get_scale_min_k4 reads them */
    const float dmin = f16_to_f32(load_u16(blk + 2));
    ks->d = f16_to_f32(load_u16(blk));
    for (int i = 0; i < SUBS; i++) {
        const int sc = i < 4 ? p[i] & 63 : (p[i + 4] & 0x0f) | ((p[i - 4] >> 6) << 4);
        const int m = i < 4 ? p[i + 4] & 63 : (p[i + 4] >> 4) | ((p[i] >> 6) << 4);
        ks->sc[2 * i] = ks->sc[2 * i + 1] = sc;
        ks->off[i] = -dmin * (float)m;
    }
}

/* Value j of sub-block i as an int8: 0..31 for Q4_K/Q5_K, q - 32 for Q6_K. */
static inline void unpack_quants(const uint8_t *blk, int type, int8_t *q) {
    const uint8_t *qs = blk + QS_AT[type];
    for (int i = 0; i < SUBS; i++) {
        for (int l = 0; l < QK; l++) {
            int v;
            if (type == Q6_K) { /* runs t of each 128: low/high nibble of byte l or l + 32, 2 bits of qh on top */
                const int h = i >> 2, t = i & 3;
                const uint8_t lo = qs[64 * h + 32 * (t & 1) + l], hi = blk[128 + 32 * h + l];
                v = (((t >> 1) ? lo >> 4 : lo & 0x0f) | (((hi >> (2 * t)) & 3) << 4)) - 32;
            } else {
                const uint8_t byte = qs[32 * (i >> 1) + l];
                v = (i & 1) ? byte >> 4 : byte & 0x0f;
                if (type == Q5_K) v |= ((blk[16 + l] >> i) & 1) << 4;
            }
            q[i * QK + l] = (int8_t)v;
        }
    }
}

#ifdef CPU_AVX2
static inline __m256i shift_right16(__m256i v, int n) {
    return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n));
}

/* Sub-block i's 32 values in one register, as unpack_quants gives them. */
static inline __m256i sub_block(const uint8_t *blk, int type, int i) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    if (type == Q6_K) {
        const int h = i >> 2, t = i & 3;
        const __m256i ql = _mm256_loadu_si256((const __m256i *)(blk + 64 * h + 32 * (t & 1)));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * h));
        const __m256i lo = _mm256_and_si256(shift_right16(ql, 4 * (t >> 1)), m4);
        const __m256i hi = _mm256_and_si256(shift_right16(qh, 2 * t), _mm256_set1_epi8(3));
        return _mm256_sub_epi8(_mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)), _mm256_set1_epi8(32));
    }
    const __m256i qs = _mm256_loadu_si256((const __m256i *)(blk + QS_AT[type] + 32 * (i >> 1)));
    __m256i q = _mm256_and_si256(shift_right16(qs, 4 * (i & 1)), m4);
    if (type == Q5_K) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        const __m256i bit = _mm256_and_si256(shift_right16(qh, i), _mm256_set1_epi8(1));
        q = _mm256_or_si256(q, _mm256_slli_epi16(bit, 4));
    }
    return q;
}

/* Q4_K/Q5_K's 8 scales (times d) and offsets (-dmin m) in registers: decode_scales' unpacking, done
 * on the 12 bytes as three 32-bit words (each byte's top 2 bits land at bits 4-5 by a shift of 2). */
static inline void q45k_scales(const uint8_t *blk, __m256 *dsub, __m256 *off) {
    uint32_t a, b, c;
    memcpy(&a, blk + 4, 4), memcpy(&b, blk + 8, 4), memcpy(&c, blk + 12, 4);
    const uint32_t sc_hi = (c & 0x0f0f0f0fu) | ((a >> 2) & 0x30303030u);
    const uint32_t m_hi = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 2) & 0x30303030u);
    const __m128i sc = _mm_set_epi32(0, 0, (int)sc_hi, (int)(a & 0x3f3f3f3fu));
    const __m128i m = _mm_set_epi32(0, 0, (int)m_hi, (int)(b & 0x3f3f3f3fu));
    *dsub = _mm256_mul_ps(_mm256_set1_ps(f16_to_f32(load_u16(blk))), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)));
    *off = _mm256_mul_ps(_mm256_set1_ps(-f16_to_f32(load_u16(blk + 2))), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(m)));
}

/* out[r] = row of W . activation row r, for r < nr rows. Always inlined with constant type and nr
 * (see dot_tile), so each combination compiles to straight-line code. */
static inline __attribute__((always_inline)) void dot_rows(const uint8_t *wrow, int type, int64_t nsb, const int8_t *q,
                                                           const float *d, const float *s, int64_t k, int nr, float *out) {
    __m256 acc[ROW_TILE], off_acc[ROW_TILE];
    for (int r = 0; r < nr; r++) acc[r] = off_acc[r] = _mm256_setzero_ps();
    const int64_t nb = nsb * SUBS;
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = wrow + sb * BLOCK_BYTES[type];
        __m256 dsub, off = _mm256_setzero_ps();
        if (type == Q6_K) dsub = _mm256_set1_ps(f16_to_f32(load_u16(blk + 208)));
        else q45k_scales(blk, &dsub, &off);
        float scale[ROW_TILE][SUBS]; /* weight x activation scale of each sub-block: 8 at once per row */
        for (int r = 0; r < nr; r++) {
            _mm256_storeu_ps(scale[r], _mm256_mul_ps(dsub, _mm256_loadu_ps(d + r * nb + sb * SUBS)));
            if (type != Q6_K) off_acc[r] = _mm256_fmadd_ps(off, _mm256_loadu_ps(s + r * nb + sb * SUBS), off_acc[r]);
        }
#pragma GCC unroll 8 /* constant i: sub_block's shifts and offsets become immediates */
        for (int i = 0; i < SUBS; i++) {
            const int64_t b = sb * SUBS + i;
            const __m256i w = sub_block(blk, type, i);
            const __m256i wu = type == Q6_K ? _mm256_abs_epi8(w) : w; /* |w| as u8; the sign moves to x */
            __m256i sc16 = _mm256_setzero_si256(); /* Q6_K's two scales: int32 lanes 0-3 are values 0-15 */
            if (type == Q6_K) {
                const int8_t *sc6 = (const int8_t *)blk + 192 + 2 * i;
                sc16 = _mm256_set_m128i(_mm_set1_epi16(sc6[1]), _mm_set1_epi16(sc6[0]));
            }
            for (int r = 0; r < nr; r++) {
                const __m256i x = _mm256_loadu_si256((const __m256i *)(q + r * k + b * QK));
                const __m256i dot = type == Q6_K
                    ? _mm256_madd_epi16(_mm256_maddubs_epi16(wu, _mm256_sign_epi8(x, w)), sc16)
                    : dot_u8_s8(wu, x);
                acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_broadcast_ss(&scale[r][i]), acc[r]);
            }
        }
    }
    for (int r = 0; r < nr; r++) out[r] = hsum(_mm256_add_ps(acc[r], off_acc[r]));
}
#else
static inline __attribute__((always_inline)) void dot_rows(const uint8_t *wrow, int type, int64_t nsb, const int8_t *q,
                                                           const float *d, const float *s, int64_t k, int nr, float *out) {
    const int64_t nb = nsb * SUBS;
    for (int r = 0; r < nr; r++) out[r] = 0.f;
    for (int64_t sb = 0; sb < nsb; sb++) {
        const uint8_t *blk = wrow + sb * BLOCK_BYTES[type];
        kscales ks;
        int8_t w[QK_K];
        decode_scales(blk, type, &ks);
        unpack_quants(blk, type, w);
        for (int i = 0; i < SUBS; i++) {
            const int64_t b = sb * SUBS + i;
            for (int r = 0; r < nr; r++) {
                const int8_t *x = q + r * k + b * QK;
                int32_t isum = 0;
                for (int g = 0; g < 2; g++) {
                    int32_t part = 0;
                    for (int j = 16 * g; j < 16 * g + 16; j++) part += (int32_t)w[i * QK + j] * (int32_t)x[j];
                    isum += ks.sc[2 * i + g] * part;
                }
                out[r] += ks.d * d[r * nb + b] * (float)isum + ks.off[i] * s[r * nb + b];
            }
        }
    }
}
#endif

#define DOT_TYPE(T)                                                  \
    switch (nr) {                                                    \
    case 4: dot_rows(wrow, T, nsb, q, d, s, k, 4, out); break;       \
    case 3: dot_rows(wrow, T, nsb, q, d, s, k, 3, out); break;       \
    case 2: dot_rows(wrow, T, nsb, q, d, s, k, 2, out); break;       \
    default: dot_rows(wrow, T, nsb, q, d, s, k, 1, out); break;      \
    }

static void dot_tile(const uint8_t *wrow, int type, int64_t nsb, const int8_t *q, const float *d, const float *s,
                     int64_t k, int nr, float *out) {
    if (type == Q4_K) { DOT_TYPE(Q4_K) }
    else if (type == Q5_K) { DOT_TYPE(Q5_K) }
    else { DOT_TYPE(Q6_K) }
}

/* y[M, N] = x @ W^T (+ bias) from activations already quantized by quantize_rows_q8 (K % 256 == 0). */
void kquant_gemm(const uint8_t *w, int type, const int8_t *q, const float *d, const float *s, const float *bias,
                 float *y, int64_t m, int64_t n, int64_t k, int nthreads) {
    const int64_t nsb = k / QK_K, row_bytes = nsb * BLOCK_BYTES[type];
    column_tiled_gemm(dot_tile, NULL, w, type, nsb, row_bytes, q, d, s, bias, y, m, n, k, nthreads);
}


/* out[N, K] = the float32 values of W (the prefill path dequantizes a slice at a time, see
 * quant_gemm.py). (d sc) q is exact in float32, so the one rounding is the minimum's, as in ggml. */
void kquant_dequantize(const uint8_t *w, int type, int64_t n, int64_t k, float *out, int nthreads) {
    const int64_t bb = BLOCK_BYTES[type];
#pragma omp parallel for schedule(static) num_threads(nthreads)
    for (int64_t i = 0; i < n * (k / QK_K); i++) {
        kscales ks;
        int8_t q[QK_K];
        decode_scales(w + i * bb, type, &ks);
        unpack_quants(w + i * bb, type, q);
        float *o = out + i * QK_K;
        for (int j = 0; j < QK_K; j++) o[j] = ks.d * (float)ks.sc[j / 16] * (float)q[j] + ks.off[j / QK];
    }
}

/* The SIMD route this library was built for (isa.h), so tests and benchmarks can say which ran. */
const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
