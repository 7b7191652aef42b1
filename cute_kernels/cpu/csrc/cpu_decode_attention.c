/* Paged decode attention for the CPU backend: one query token per sequence, fp32.
 *
 * Why it exists: the torch reference gathers every sequence's K/V rows into a padded batch before
 * its matmuls, so each step moves the whole context three times (read, write, read again). Here
 * each (sequence, KV head) task reads its K and V rows once, straight from the paged cache, and
 * scores all query heads of its GQA group against each K row while it is in registers.
 *
 * Layouts (as cute_kernels/reference.py): q/out [B, H, D]; k/v cache [num_blocks, BS, HKV, D];
 * block_tables [B, max_blocks] int32; context_lens [B] int32 (tokens to attend, >= 1).
 * Threads: OpenMP over B * HKV tasks; it shares the one libgomp torch has loaded.
 */
#include <float.h>
#include <omp.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>


static inline float dot(const float *restrict a, const float *restrict b, int64_t d) {
    float s = 0.f;
#pragma omp simd reduction(+ : s)
    for (int64_t i = 0; i < d; i++) s += a[i] * b[i];
    return s;
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int64_t d) {
#pragma omp simd
    for (int64_t i = 0; i < d; i++) y[i] += a * x[i];
}

#ifdef __AVX2__
#include <immintrin.h>

/* The four sums of s0..s3's lanes, in order. */
static inline __m128 hsum4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(s0, s1), _mm256_hadd_ps(s2, s3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* out[j] = scale * q . k_j for n rows k_j = k + j * stride (d % 8 == 0): four rows share each
 * horizontal reduction, and q's chunks are loaded once per four rows. */
static void dot_rows_avx2(const float *q, const float *k, int64_t stride, int64_t n, int64_t d, float scale,
                          float *out) {
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const float *k0 = k + j * stride;
        __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
        for (int64_t i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(q + i);
            s0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + i), s0);
            s1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + stride + i), s1);
            s2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 2 * stride + i), s2);
            s3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + 3 * stride + i), s3);
        }
        _mm_storeu_ps(out + j, _mm_mul_ps(hsum4(s0, s1, s2, s3), _mm_set1_ps(scale)));
    }
    for (; j < n; j++) out[j] = scale * dot(q, k + j * stride, d);
}

/* acc[0:W*8] += sum_j p[j] * v_j[0:W*8] with the W accumulators in registers. */
#define WEIGH_CHUNK(W)                                                                               \
    static void weigh_chunk_##W(float *acc, const float *p, const float *v, int64_t stride, int64_t n) { \
        __m256 a[W];                                                                                 \
        for (int r = 0; r < W; r++) a[r] = _mm256_loadu_ps(acc + 8 * r);                             \
        for (int64_t j = 0; j < n; j++, v += stride) {                                               \
            const __m256 pj = _mm256_set1_ps(p[j]);                                                  \
            for (int r = 0; r < W; r++) a[r] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(v + 8 * r), a[r]); \
        }                                                                                            \
        for (int r = 0; r < W; r++) _mm256_storeu_ps(acc + 8 * r, a[r]);                             \
    }
WEIGH_CHUNK(8)
WEIGH_CHUNK(1)

static void weigh_rows_avx2(float *acc, const float *p, const float *v, int64_t stride, int64_t n, int64_t d) {
    int64_t i = 0;
    for (; i + 64 <= d; i += 64) weigh_chunk_8(acc + i, p, v + i, stride, n);
    for (; i < d; i += 8) weigh_chunk_1(acc + i, p, v + i, stride, n);
}
#endif

/* scores[h * len + t] = scale * q_h . k_t for the task's query heads h (those of KV heads kv0..kv1)
 * over its whole context. Blocks are the outer loop, so each block's K rows are streamed from
 * memory once, contiguously, and reused from cache by every head of the task. */
static void score_rows(const float *q, const float *k_cache, const int32_t *table, int64_t len, int64_t g_n,
                       int64_t kv0, int64_t kv1, int64_t hkv, int64_t d, int64_t bs, float scale, float *scores) {
    const int64_t row = hkv * d;
    for (int64_t t0 = 0, blk = 0; t0 < len; t0 += bs, blk++) {
        const float *base = k_cache + (int64_t)table[blk] * bs * row;
        const int64_t n = len - t0 < bs ? len - t0 : bs;
        for (int64_t kvh = kv0; kvh < kv1; kvh++)
            for (int64_t g = 0; g < g_n; g++) {
                const int64_t h = (kvh - kv0) * g_n + g;
                const float *k = base + kvh * d;
#ifdef __AVX2__
                if (d % 8 == 0) {
                    dot_rows_avx2(q + h * d, k, row, n, d, scale, scores + h * len + t0);
                    continue;
                }
#endif
                for (int64_t j = 0; j < n; j++) scores[h * len + t0 + j] = scale * dot(q + h * d, k + j * row, d);
            }
    }
}

/* In place: each of the n rows of scores becomes exp(s - max); inv_sum gets the rows' 1 / sum. */
static void softmax_rows(float *scores, int64_t len, int64_t n, float *inv_sum) {
    for (int64_t g = 0; g < n; g++) {
        float *s = scores + g * len, m = -FLT_MAX, sum = 0.f;
#pragma omp simd reduction(max : m)
        for (int64_t t = 0; t < len; t++) m = s[t] > m ? s[t] : m;
#pragma omp simd reduction(+ : sum)  /* vector expf from glibc's libmvec */
        for (int64_t t = 0; t < len; t++) {
            s[t] = expf(s[t] - m);
            sum += s[t];
        }
        inv_sum[g] = 1.f / sum;
    }
}

/* acc[h] = sum_t probs[h, t] * v_t for the task's heads, blocks outermost as in score_rows. */
static void weigh_values(const float *v_cache, const int32_t *table, const float *probs, int64_t len,
                         int64_t g_n, int64_t kv0, int64_t kv1, int64_t hkv, int64_t d, int64_t bs, float *acc) {
    const int64_t row = hkv * d;
    memset(acc, 0, sizeof(float) * (kv1 - kv0) * g_n * d);
    for (int64_t t0 = 0, blk = 0; t0 < len; t0 += bs, blk++) {
        const float *base = v_cache + (int64_t)table[blk] * bs * row;
        const int64_t n = len - t0 < bs ? len - t0 : bs;
        for (int64_t kvh = kv0; kvh < kv1; kvh++)
            for (int64_t g = 0; g < g_n; g++) {
                const int64_t h = (kvh - kv0) * g_n + g;
                const float *v = base + kvh * d;
#ifdef __AVX2__
                if (d % 8 == 0) {
                    weigh_rows_avx2(acc + h * d, probs + h * len + t0, v, row, n, d);
                    continue;
                }
#endif
                for (int64_t j = 0; j < n; j++) axpy(acc + h * d, probs[h * len + t0 + j], v + j * row, d);
            }
    }
}

/* Returns 0 on success, 1 on bad sizes, 2 when a work buffer could not be allocated.
 * A task is one sequence (all its KV heads: whole blocks stream contiguously), or, for batches too
 * small to keep every thread busy, one (sequence, KV head) pair. */
int paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache,
                               const int32_t *block_tables, const int32_t *context_lens, float *out,
                               int64_t batch, int64_t heads, int64_t hkv, int64_t d, int64_t bs,
                               int64_t max_blocks, float scale) {
    if (hkv <= 0 || heads % hkv || d <= 0 || bs <= 0) return 1;
    const int64_t g_n = heads / hkv;
    const int64_t kv_per_task = batch >= 4 * omp_get_max_threads() ? hkv : 1;
    const int64_t tasks_per_seq = hkv / kv_per_task, task_heads = kv_per_task * g_n;
    int status = 0;
#pragma omp parallel
    {
        float *scores = NULL, *acc = malloc(sizeof(float) * task_heads * d);
        float *inv_sum = malloc(sizeof(float) * task_heads);
        int64_t capacity = 0;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < batch * tasks_per_seq; task++) {
            const int64_t b = task / tasks_per_seq, kv0 = task % tasks_per_seq * kv_per_task;
            const int64_t kv1 = kv0 + kv_per_task, len = context_lens[b];
            if (len > capacity) {
                free(scores);
                capacity = len + 1024;
                scores = malloc(sizeof(float) * task_heads * capacity);
            }
            if (scores == NULL || acc == NULL || inv_sum == NULL) {
                capacity = 0;
#pragma omp atomic write
                status = 2;
                continue;
            }
            const int32_t *table = block_tables + b * max_blocks;
            const float *qb = q + (b * heads + kv0 * g_n) * d;
            score_rows(qb, k_cache, table, len, g_n, kv0, kv1, hkv, d, bs, scale, scores);
            softmax_rows(scores, len, task_heads, inv_sum);
            weigh_values(v_cache, table, scores, len, g_n, kv0, kv1, hkv, d, bs, acc);
            float *ob = out + (b * heads + kv0 * g_n) * d;
            for (int64_t h = 0; h < task_heads; h++)
                for (int64_t i = 0; i < d; i++) ob[h * d + i] = acc[h * d + i] * inv_sum[h];
        }
        free(scores);
        free(acc);
        free(inv_sum);
    }
    return status;
}
