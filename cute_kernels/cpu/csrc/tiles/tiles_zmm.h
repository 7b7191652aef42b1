/* The tiles GEMM's micro-kernel on AVX-512 VNNI (cpu_quant_tiles.c includes it there): ZROWS activation
 * rows x 2 packed groups of 16 weight rows, in 512-bit registers.
 *
 * Why 512 bits and this shape: on the AVX-512 machines measured (profiling/benchmarks/bench_quant_gemm.py
 * --peak), vpdpbusd on zmm retires 64 multiply-adds at the rate ymm retires 32, and two issue per
 * cycle, so 2 x ZROWS independent int32 chains (12) cover its latency; 12 int32 sums + 12 float32
 * accumulators + 2 weight vectors stay in the 32 registers. The per-block epilogue (cvt, the dw x d
 * scale, one or two fma) costs 3 of every ~11 multiply-pipe operations; the conversion goes elsewhere.
 * Q8_0 has no vpsignb on zmm: its panel holds w + 128 as u8 and the sum loses 128 x sum(q) of the
 * block (corr, exact in int32), so every block's integer sum is the same as the GEMV's.
 * Accumulation order per lane: the GEMV's (quant_dot.h), acc = fma(isum, dw * d, acc), then
 * acc = fma(off, s, acc), block after block, so a row gets the same bits from either.
 */
#ifndef TILES_ZMM_H
#define TILES_ZMM_H
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define ZROWS 6       /* activation rows per micro-kernel call */
#define ZLANES 16     /* weight rows per packed group: one int32 lane each */
#define ZGROUP_BYTES (2 * ZLANES * 4 + ZLANES * 32) /* dw[16], off[16] as fp32, then 8 steps x 64 bytes */

static inline __m512i zmm_act4(const int8_t *p) { /* 4 activation bytes, broadcast to 16 lanes */
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* out[r * 32 + c] = packed weight row c (of the two groups at g0, g0 + gstride) . activation row r, for
 * r < nr <= ZROWS. Rows past nr repeat the last real row and are not stored. corr: Q8_0's 128 x block
 * sums of q ([rows, nb], NULL for Q4). Always inlined with constant type. */
static inline __attribute__((always_inline)) void zmm_tile(const uint8_t *g0, int64_t gstride, int type, int nr,
        const int8_t *q, const float *d, const float *s, const int32_t *corr, int64_t k, int64_t nb, float *out) {
    const int8_t *qr[ZROWS];
    int64_t at[ZROWS];
    __m512 acc[ZROWS][2];
    _Pragma("GCC unroll 8") for (int r = 0; r < ZROWS; r++) {
        const int64_t row = r < nr ? r : nr - 1;
        qr[r] = q + row * k;
        at[r] = row * nb;
        acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *b0 = g0 + b * ZGROUP_BYTES, *b1 = b0 + gstride;
        __m512i sum[ZROWS][2];
        _Pragma("GCC unroll 8") for (int r = 0; r < ZROWS; r++) sum[r][0] = sum[r][1] = _mm512_setzero_si512();
        _Pragma("GCC unroll 8") for (int t = 0; t < 8; t++) {
            const __m512i w0 = _mm512_loadu_si512(b0 + 2 * ZLANES * 4 + t * 64);
            const __m512i w1 = _mm512_loadu_si512(b1 + 2 * ZLANES * 4 + t * 64);
            _Pragma("GCC unroll 8") for (int r = 0; r < ZROWS; r++) {
                const __m512i a = zmm_act4(qr[r] + b * 32 + 4 * t);
                sum[r][0] = _mm512_dpbusd_epi32(sum[r][0], w0, a);
                sum[r][1] = _mm512_dpbusd_epi32(sum[r][1], w1, a);
            }
        }
        const __m512 dw0 = _mm512_loadu_ps(b0), dw1 = _mm512_loadu_ps(b1);
        const __m512 off0 = _mm512_loadu_ps(b0 + ZLANES * 4), off1 = _mm512_loadu_ps(b1 + ZLANES * 4);
        _Pragma("GCC unroll 8") for (int r = 0; r < ZROWS; r++) {
            const int64_t i = at[r] + b;
            __m512i s0 = sum[r][0], s1 = sum[r][1];
            if (type == 2) { /* Q8_0: undo the +128 of the packed values */
                const __m512i c = _mm512_set1_epi32(corr[i]);
                s0 = _mm512_sub_epi32(s0, c);
                s1 = _mm512_sub_epi32(s1, c);
            }
            const __m512 dx = _mm512_set1_ps(d[i]);
            acc[r][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), _mm512_mul_ps(dw0, dx), acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), _mm512_mul_ps(dw1, dx), acc[r][1]);
            if (type != 2) {
                const __m512 sx = _mm512_set1_ps(s[i]);
                acc[r][0] = _mm512_fmadd_ps(off0, sx, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(off1, sx, acc[r][1]);
            }
        }
    }
    _Pragma("GCC unroll 8") for (int r = 0; r < ZROWS; r++) {
        if (r < nr) {
            _mm512_storeu_ps(out + r * 32, acc[r][0]);
            _mm512_storeu_ps(out + r * 32 + 16, acc[r][1]);
        }
    }
}

#endif
