/* The SIMD route a CPU kernel library takes, fixed when build.py compiles it (its routes):
 * AVX-512 VNNI where the compiler targets it (vpdpbusd on 256-bit lanes), else AVX2 + FMA + F16C,
 * else plain C: every non-x86 machine, and any build with -DCPU_PORTABLE (which the tests run on
 * x86 too, so the path ARM machines take is tested everywhere). */
#ifndef ISA_H
#define ISA_H

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(CPU_PORTABLE)
#include <immintrin.h>
#define CPU_AVX2 1
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define CPU_VNNI 1
#endif
#endif

/* The route's name, as build.py's ROUTES spell it. */
static inline const char *cpu_isa_name(void) {
#if defined(CPU_VNNI)
    return "avx512-vnni";
#elif defined(CPU_AVX2)
    return "avx2";
#else
    return "portable-c";
#endif
}

#endif
