/* The KV cache's element types (float32, bfloat16, int8, float8 e4m3) and the row loads/stores every
 * CPU attention kernel shares: a bf16 or 8-bit cache row is widened into fp32 scratch before the
 * kernels' fp32 inner loops, so one code path serves every type. bf16 -> f32 is exact (a 16-bit
 * shift); an 8-bit row is dequantized on the way, x = stored * scale with the fp32 scale of its
 * (layer, KV head), one rounding: the same float torch's `stored.float() * scale` gives. Stores
 * quantize as stored = round(x / scale) (nearest even), saturated to the type's range. */
#ifndef KV_ELEM_H
#define KV_ELEM_H
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "isa.h"

enum { KV_F32 = 0, KV_BF16 = 1, KV_I8 = 2, KV_E4M3 = 3 };

static inline int kv_kind_known(int kind) { return kind >= KV_F32 && kind <= KV_E4M3; }
static inline int kv_quantized(int kind) { return kind == KV_I8 || kind == KV_E4M3; }

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Round to nearest even, as torch's float -> bfloat16 (NaN stays a quiet NaN). */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* e4m3 (float8_e4m3fn: bias 7, no infinities, 0x7f NaN) -> fp32, exact. */
static inline float e4m3_to_f32(uint8_t b) {
    const uint32_t mag = b & 0x7fu, sign = (uint32_t)(b & 0x80u) << 24;
    uint32_t u;
    if (mag == 0x7fu) u = sign | 0x7fc00000u;
    else if (mag >= 8u) u = sign | ((mag + (120u << 3)) << 20); /* exponent + 120 rebiases 7 -> 127 */
    else { /* subnormal: mag * 2^-9 */
        const float f = (float)mag * (1.f / 512.f);
        memcpy(&u, &f, sizeof u);
        u |= sign;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Nearest even, saturated to +-448 (infinities too), NaN -> 0x7f: torch's
 * x.clamp(-448, 448).to(float8_e4m3fn). Bit tests, not float compares: -ffast-math assumes no NaN. */
static inline uint8_t f32_to_e4m3(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u) return sign | 0x7fu;
    if (u >= 0x43e00000u) return sign | 0x7eu; /* >= 448 */
    if (u < 0x3c800000u) {                     /* below 2^-6: subnormal steps of 2^-9; 8 is 2^-6 itself */
        float a;
        memcpy(&a, &u, sizeof a);
        return sign | (uint8_t)rintf(a * 512.f);
    }
    u += 0x7ffffu + ((u >> 20) & 1u); /* round the mantissa to 3 bits, nearest even */
    return sign | (uint8_t)((((u >> 23) - 120u) << 3) | ((u >> 20) & 7u));
}

static inline int8_t f32_to_i8(float q) {
    q = rintf(q);
    return (int8_t)(q > 127.f ? 127.f : q < -128.f ? -128.f : q);
}

/* dst[0:n] = the n bf16 values at src, as fp32. */
static inline void bf16_row_to_f32(float *restrict dst, const uint16_t *restrict src, int64_t n) {
    int64_t i = 0;
#ifdef CPU_AVX2
    for (; i + 8 <= n; i += 8) {
        const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16)));
    }
#endif
    for (; i < n; i++) dst[i] = bf16_to_f32(src[i]);
}

/* dst[0:n] = the n int8 values at src times scale. */
static inline void i8_row_to_f32(float *restrict dst, const int8_t *restrict src, int64_t n, float scale) {
    int64_t i = 0;
#ifdef CPU_AVX2
    const __m256 s = _mm256_set1_ps(scale);
    for (; i + 8 <= n; i += 8) {
        const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(wide), s));
    }
#endif
    for (; i < n; i++) dst[i] = (float)src[i] * scale;
}

/* dst[0:n] = the n e4m3 values at src times scale. */
static inline void e4m3_row_to_f32(float *restrict dst, const uint8_t *restrict src, int64_t n, float scale) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) dst[i] = e4m3_to_f32(src[i]) * scale;
}

/* The row of n elements at element offset off of a cache of type kind, as fp32: a pointer into the
 * cache itself for fp32, else into scratch (which receives the widened row; an 8-bit row times scale,
 * its KV head's). */
static inline const float *kv_row_f32(const void *cache, int kind, int64_t off, int64_t n, float scale,
                                      float *scratch) {
    switch (kind) {
    case KV_F32: return (const float *)cache + off;
    case KV_BF16: bf16_row_to_f32(scratch, (const uint16_t *)cache + off, n); break;
    case KV_I8: i8_row_to_f32(scratch, (const int8_t *)cache + off, n, scale); break;
    default: e4m3_row_to_f32(scratch, (const uint8_t *)cache + off, n, scale); break;
    }
    return scratch;
}

/* Element offset off of a cache of type kind receives one token's heads x d fp32 values at src; an
 * 8-bit cache quantizes head h with scales[h] (NULL for the float types). A true division, as the
 * contract's round(x / scale): -ffast-math's reciprocal would move a rare tie by one step. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-unsafe-math-optimizations")))
#endif
static inline void kv_store_heads(void *cache, int kind, int64_t off, const float *src, int64_t heads, int64_t d,
                                  const float *scales) {
    const int64_t n = heads * d;
    if (kind == KV_F32) {
        memcpy((float *)cache + off, src, sizeof(float) * n);
    } else if (kind == KV_BF16) {
        uint16_t *dst = (uint16_t *)cache + off;
        for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
    } else {
        for (int64_t h = 0; h < heads; h++) {
            const float s = scales[h];
            for (int64_t i = h * d; i < (h + 1) * d; i++) {
                if (kind == KV_I8) ((int8_t *)cache)[off + i] = f32_to_i8(src[i] / s);
                else ((uint8_t *)cache)[off + i] = f32_to_e4m3(src[i] / s);
            }
        }
    }
}

#endif
