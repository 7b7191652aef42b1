/* A STREAM-like read kernel for the benchmarks' bandwidth floor: sums a large fp32 buffer, each OpenMP
 * thread its own contiguous part, with eight independent vector accumulators so the loads, not the
 * adds, bound it. torch's sum reduces through a generic kernel that can under-read a 2-core machine.
 */
#include <omp.h>
#include <stdint.h>

#include "isa.h"

/* The sum of x[0:n] over `threads` threads (<= 0: OpenMP's default), returned so no read is elided. */
double read_sum_f32(const float *x, int64_t n, int threads) {
    double total = 0.0;
    if (threads <= 0) threads = omp_get_max_threads();
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
        const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
        const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
        int64_t i = lo;
#ifdef CPU_AVX2
        __m256 a[8];
        for (int j = 0; j < 8; j++) a[j] = _mm256_setzero_ps();
        for (; i + 64 <= hi; i += 64)
            for (int j = 0; j < 8; j++) a[j] = _mm256_add_ps(a[j], _mm256_loadu_ps(x + i + 8 * j));
        float lanes[8];
        for (int j = 1; j < 8; j++) a[0] = _mm256_add_ps(a[0], a[j]);
        _mm256_storeu_ps(lanes, a[0]);
        for (int j = 0; j < 8; j++) total += lanes[j];
#endif
        float rest = 0.f;
        for (; i < hi; i++) rest += x[i];
        total += rest;
    }
    return total;
}

/* The SIMD route this library was built for (isa.h), so tests and benchmarks can say which ran. */
const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
