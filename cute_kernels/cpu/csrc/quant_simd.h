/* What the quantized-linear kernels (cpu_quant_gemm.c, cpu_kquant_gemm.c, cpu_quant_tiles.c) share:
 * fp16 scales and the unsigned x signed int8 dot product on 256-bit lanes (VNNI's vpdpbusd, or AVX2's
 * maddubs + madd; plain C on the portable route, isa.h).
 */
#ifndef QUANT_SIMD_H
#define QUANT_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#include "isa.h"

static inline float f16_to_f32(uint16_t h) {
#ifdef CPU_AVX2
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    uint32_t bits;
    if (exp == 0x1f) bits = sign | 0x7f800000u | (mant << 13);
    else if (exp != 0) bits = sign | ((exp + 112) << 23) | (mant << 13);
    else if (mant == 0) bits = sign;
    else { /* subnormal half: normalize */
        int e = -1;
        uint32_t m = mant;
        do { e++; m <<= 1; } while (!(m & 0x400));
        bits = sign | ((uint32_t)(112 - e) << 23) | ((m & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

/* x rounded to the nearest fp16 value (ties to even), as a float: activation scales are held at
 * ggml's precision (block_q8_1 stores d and s as fp16), so the products match llama.cpp's. */
static inline float f16_round(float x) {
#ifdef CPU_AVX2
    return _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
#else
    const float ax = fabsf(x);
    if (ax != ax) return x;
    if (ax >= 65520.f) return x > 0 ? INFINITY : -INFINITY; /* past fp16's largest value's halfway point */
    if (ax < 0x1p-14f) return nearbyintf(x * 0x1p24f) * 0x1p-24f; /* subnormal: one 2^-24 step */
    int e;
    frexpf(ax, &e); /* ax in [2^(e-1), 2^e): 11 significant bits leave a step of 2^(e-11) */
    const float step = ldexpf(1.f, e - 11);
    return nearbyintf(x / step) * step;
#endif
}

static inline uint16_t load_u16(const uint8_t *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* Exact dots of 32 int8 activations with 32 signed (Q8_0) or unsigned (4/5-bit) weight values, for the
 * plain C paths. Signed weights are loaded through a signed pointer, never converted from uint8_t:
 * GCC 12 vectorizes `(int32_t)(int8_t)u * (int32_t)x` over uint8_t u into vpdpbusd (unsigned x signed)
 * on VNNI targets as if the cast were not there, which gave the portable build wrong sums on AVX-512. */
static inline int32_t dot32_s8(const int8_t *w, const int8_t *x) {
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) sum += (int32_t)w[j] * (int32_t)x[j];
    return sum;
}

static inline int32_t dot32_u8(const uint8_t *w, const int8_t *x) {
    int32_t sum = 0;
    for (int j = 0; j < 32; j++) sum += (int32_t)w[j] * (int32_t)x[j];
    return sum;
}

#ifdef CPU_AVX2
static inline __m256i dot_u8_s8(__m256i u, __m256i v) { /* 8 int32 lanes, each a sum of 4 products */
#ifdef CPU_VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, v);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), _mm256_set1_epi16(1));
#endif
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#endif

#endif
