/* The KV cache's element types (float32 or bfloat16) and the row loads/stores every CPU attention
 * kernel shares: a bf16 cache row is widened into fp32 scratch before the kernels' fp32 inner loops,
 * so one code path serves both types (bf16 -> f32 is exact: a 16-bit shift). */
#ifndef KV_ELEM_H
#define KV_ELEM_H
#include <stdint.h>
#include <string.h>

#include "isa.h"

enum { KV_F32 = 0, KV_BF16 = 1 };

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

/* The row of n elements at element offset off of a cache of type kind, as fp32: a pointer into the
 * cache itself for fp32, else into scratch (which receives the widened row). */
static inline const float *kv_row_f32(const void *cache, int kind, int64_t off, int64_t n, float *scratch) {
    if (kind == KV_F32) return (const float *)cache + off;
    bf16_row_to_f32(scratch, (const uint16_t *)cache + off, n);
    return scratch;
}

/* Element offset off of a cache of type kind receives the n fp32 values at src. */
static inline void kv_store_row(void *cache, int kind, int64_t off, const float *src, int64_t n) {
    if (kind == KV_F32) {
        memcpy((float *)cache + off, src, sizeof(float) * n);
        return;
    }
    uint16_t *dst = (uint16_t *)cache + off;
    for (int64_t i = 0; i < n; i++) dst[i] = f32_to_bf16(src[i]);
}

#endif
