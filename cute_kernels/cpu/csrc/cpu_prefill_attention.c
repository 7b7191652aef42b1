/* Varlen prefill attention for the CPU backend: new query rows over [paged prefix ; new keys], fp32
 * (the paged prefix fp32, bf16, int8 or e4m3: a tile's rows of another type than fp32 are widened, and
 * an 8-bit one dequantized, into per-thread scratch, kv_elem.h),
 * FlashAttention-style (key tiles with an online softmax, nothing of size q_len x k_len in memory).
 *
 * Why it exists: torch's CPU SDPA reaches ~45-65 GFLOP/s on these short causal sequences (2 cores,
 * AVX2), and a chunk after a cached prefix first gathers and concatenates the prefix. Here the
 * prefix rows are read straight from the paged cache and the products run in register tiles.
 *
 * Layout trick: a task's query vectors (TQ rows x the G heads of one GQA group, "m") are kept
 * transposed, [d][m]. Then scores S^T[key][m] = sum_i K[key][i] * Qt[i][m] broadcast key elements
 * straight from the cache rows, the softmax runs down key rows with vertical vector ops (no
 * horizontal sums), and O^T[i][m] += V[key][i] * P^T[key][m] reuses the same register tile shape.
 *
 * Layouts (as cute_kernels/reference.py): q [Tq, H, d]; k, v [Tk, HKV, d]; caches
 * [num_blocks, BS, HKV, d]; block_tables [B, max_blocks] int32; cu_q, cu_k [B + 1] int32;
 * prefix_lens [B] int32. Query row r of sequence b sits at key position prefix + new_k - q_len + r.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_elem.h"
#include "prefill_problem.h"

#define TK 48      /* keys per tile (a multiple of the score tile's 6) */
#define MV 64      /* query vectors per task (rows x GQA group), at most */
#define MAX_D 256  /* head_dim bound of the per-thread scratch */
#define NEG (-1e30f) /* a masked score: exp(NEG - max) is 0; finite, as -ffast-math assumes */
#define EXP_MIN (-80.f) /* below this exp is taken as 0: libmvec's expf falls back to scalar code on
                           arguments that underflow, so they never reach it */

static inline float exp_or_zero(float x) {
    const float e = expf(fmaxf(x, EXP_MIN));
    return x > EXP_MIN ? e : 0.f;
}

#ifdef CPU_AVX2

/* st[j][m0:m0+16] = sum_i kp[j][i] * qt[i][m0:m0+16] for six keys j: twelve accumulators, enough
 * independent FMAs to cover their latency on two FMA pipes. */
static inline void score_tile_6x16(const float *const *kp, const float *qt, int64_t mp, int64_t d, float *st) {
    __m256 acc[6][2];
    for (int j = 0; j < 6; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d; i++) {
        const __m256 q0 = _mm256_loadu_ps(qt + i * mp), q1 = _mm256_loadu_ps(qt + i * mp + 8);
        for (int j = 0; j < 6; j++) {
            const __m256 kb = _mm256_broadcast_ss(kp[j] + i);
            acc[j][0] = _mm256_fmadd_ps(kb, q0, acc[j][0]);
            acc[j][1] = _mm256_fmadd_ps(kb, q1, acc[j][1]);
        }
    }
    for (int j = 0; j < 6; j++) _mm256_storeu_ps(st + j * mp, acc[j][0]), _mm256_storeu_ps(st + j * mp + 8, acc[j][1]);
}

/* o[r][i0:i0+16] += sum_j pt[j][r] * vp[j][i0:i0+16] for R query vectors r over n keys. */
#define WEIGH_ROWS(R)                                                                                    \
    static inline void weigh_rows_##R(float *o, int64_t d, const float *pt, int64_t mp, const float *const *vp, \
                                      int64_t i0, int64_t n) {                                           \
        __m256 acc[R][2];                                                                                \
        for (int r = 0; r < R; r++) acc[r][0] = _mm256_loadu_ps(o + r * d), acc[r][1] = _mm256_loadu_ps(o + r * d + 8); \
        for (int64_t j = 0; j < n; j++) {                                                                \
            const __m256 v0 = _mm256_loadu_ps(vp[j] + i0), v1 = _mm256_loadu_ps(vp[j] + i0 + 8);         \
            for (int r = 0; r < R; r++) {                                                                \
                const __m256 pb = _mm256_broadcast_ss(pt + j * mp + r);                                  \
                acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);                                          \
                acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);                                          \
            }                                                                                            \
        }                                                                                                \
        for (int r = 0; r < R; r++) _mm256_storeu_ps(o + r * d, acc[r][0]), _mm256_storeu_ps(o + r * d + 8, acc[r][1]); \
    }
#else
static inline void score_tile_6x16(const float *const *kp, const float *qt, int64_t mp, int64_t d, float *st) {
    for (int j = 0; j < 6; j++)
        for (int m = 0; m < 16; m++) {
            float s = 0.f;
            for (int64_t i = 0; i < d; i++) s += kp[j][i] * qt[i * mp + m];
            st[j * mp + m] = s;
        }
}

#define WEIGH_ROWS(R)                                                                                    \
    static inline void weigh_rows_##R(float *o, int64_t d, const float *pt, int64_t mp, const float *const *vp, \
                                      int64_t i0, int64_t n) {                                           \
        for (int64_t j = 0; j < n; j++)                                                                  \
            for (int r = 0; r < R; r++)                                                                  \
                for (int64_t i = 0; i < 16; i++) o[r * d + i] += pt[j * mp + r] * vp[j][i0 + i];       \
    }
#endif
WEIGH_ROWS(6)
WEIGH_ROWS(4)
WEIGH_ROWS(2)

/* Running max mx, sum l and accumulator ot are rescaled to the tile's max; st becomes exp(s - max). */
static void online_softmax(float *st, int64_t n, int64_t mp, int64_t d, float *mx, float *l, float *ot,
                           float *alpha) {
    float tile_max[MV], row_sum[MV];
    for (int64_t m = 0; m < mp; m++) tile_max[m] = NEG, row_sum[m] = 0.f;
    for (int64_t j = 0; j < n; j++) {
        const float *s = st + j * mp;
#pragma omp simd
        for (int64_t m = 0; m < mp; m++) tile_max[m] = fmaxf(tile_max[m], s[m]);
    }
#pragma omp simd
    for (int64_t m = 0; m < mp; m++) {
        const float new_max = fmaxf(mx[m], tile_max[m]);
        alpha[m] = exp_or_zero(mx[m] - new_max);
        mx[m] = new_max;
    }
    for (int64_t j = 0; j < n; j++) {
        float *s = st + j * mp;
#pragma omp simd  /* vector expf from glibc's libmvec */
        for (int64_t m = 0; m < mp; m++) {
            s[m] = exp_or_zero(s[m] - mx[m]);
            row_sum[m] += s[m];
        }
    }
#pragma omp simd
    for (int64_t m = 0; m < mp; m++) l[m] = l[m] * alpha[m] + row_sum[m];
    for (int64_t m = 0; m < mp; m++) {
        float *o = ot + m * d;
#pragma omp simd
        for (int64_t i = 0; i < d; i++) o[i] *= alpha[m];
    }
}

/* One task: rows r0..r1 of sequence b, the G query heads of KV head kvh. */
static void run_task(const Problem *p, const Task *task, float *qt, float *st, float *ot, float *stage) {
    const int64_t b = task->b, kvh = task->kvh, r0 = task->r0, g = p->g, d = p->d;
    const int64_t q_len = p->cu_q[b + 1] - p->cu_q[b], prefix = p->prefix[b];
    const int64_t k_len = prefix + p->cu_k[b + 1] - p->cu_k[b];
    const int64_t nvec = (task->r1 - r0) * g, mp = (nvec + 15) / 16 * 16;
    const int64_t pos0 = k_len - q_len + r0; /* key position of the task's first row */
    const int64_t key_end = p->causal ? pos0 + (task->r1 - r0) : k_len;
    float mx[MV], l[MV], alpha[MV];
    const float *kp[TK], *vp[TK];

    int32_t row_of[MV]; /* m -> its query row, relative to r0; padding rows see every key */
    for (int64_t m = 0; m < mp; m++) {
        row_of[m] = m < nvec ? (int32_t)(m / g) : INT32_MAX;
        const float *qm = p->q + ((p->cu_q[b] + r0 + m / g) * p->heads + kvh * g + m % g) * d;
        for (int64_t i = 0; i < d; i++) qt[i * mp + m] = m < nvec ? p->scale * qm[i] : 0.f;
    }
    for (int64_t m = 0; m < mp; m++) mx[m] = NEG, l[m] = 0.f;
    memset(ot, 0, sizeof(float) * d * mp);

    for (int64_t t0 = 0; t0 < key_end; t0 += TK) {
        const int64_t n = key_end - t0 < TK ? key_end - t0 : TK, n6 = (n + 5) / 6 * 6;
        for (int64_t j = 0; j < n6; j++) {
            int in_cache;
            const int64_t off = key_offset(p, b, t0 + (j < n ? j : 0), prefix, kvh, &in_cache);
            float *k_stage = stage + 2 * j * d, *v_stage = k_stage + d; /* a bf16 row's fp32 copy */
            const float ks = p->k_scale != NULL ? p->k_scale[kvh] : 1.f, vs = p->v_scale != NULL ? p->v_scale[kvh] : 1.f;
            kp[j] = in_cache ? kv_row_f32(p->k_cache, p->kv_kind, off, d, ks, k_stage) : p->k + off;
            vp[j] = in_cache ? kv_row_f32(p->v_cache, p->kv_kind, off, d, vs, v_stage) : p->v + off;
        }
        /* m-blocks outermost: a 16-column block of qt (or st) stays in L1 while the tile's rows stream */
        for (int64_t m0 = 0; m0 < mp; m0 += 16)
            for (int64_t j = 0; j < n6; j += 6) score_tile_6x16(kp + j, qt + m0, mp, d, st + j * mp + m0);
        if (p->causal && t0 + n - 1 > pos0) /* the diagonal: key t0 + j is hidden from rows before it */
            for (int64_t j = 0; j < n; j++) {
                float *s = st + j * mp;
                const int32_t hidden_from = (int32_t)(t0 + j - pos0); /* rows r < this (relative to r0) */
#pragma omp simd
                for (int64_t m = 0; m < mp; m++) s[m] = row_of[m] < hidden_from ? NEG : s[m];
            }
        online_softmax(st, n, mp, d, mx, l, ot, alpha);
        for (int64_t m0 = 0; m0 < mp;) { /* mp is a multiple of 16: blocks of 6, then one of 4 or 2 */
            const int64_t rows = mp - m0 >= 6 ? 6 : mp - m0;
            for (int64_t i0 = 0; i0 < d; i0 += 16) {
                float *o = ot + m0 * d + i0;
                if (rows == 6) weigh_rows_6(o, d, st + m0, mp, vp, i0, n);
                else if (rows == 4) weigh_rows_4(o, d, st + m0, mp, vp, i0, n);
                else weigh_rows_2(o, d, st + m0, mp, vp, i0, n);
            }
            m0 += rows;
        }
    }
    for (int64_t m = 0; m < nvec; m++) {
        float *o = p->out + ((p->cu_q[b] + r0 + m / g) * p->heads + kvh * g + m % g) * d;
        const float inv = 1.f / l[m];
        for (int64_t i = 0; i < d; i++) o[i] = ot[m * d + i] * inv;
    }
}

/* Returns 0 on success, 1 on bad sizes, 2 when work buffers could not be allocated. The caller
 * has checked lengths, offsets and block ids against the tensors (this code reads raw memory). */
int paged_prefill_attention_f32(const float *q, const float *k, const float *v, const void *k_cache,
                                const void *v_cache, const int32_t *block_tables, const int32_t *cu_q,
                                const int32_t *cu_k, const int32_t *prefix_lens, float *out, int64_t batch,
                                int64_t heads, int64_t hkv, int64_t d, int64_t bs, int64_t max_blocks, float scale,
                                int causal, int kv_kind, const float *k_scale, const float *v_scale) {
    if (hkv <= 0 || heads % hkv || d <= 0 || d % 16 || d > MAX_D || bs <= 0 || heads / hkv > MV) return 1;
    if (!kv_kind_known(kv_kind) || (kv_quantized(kv_kind) && (k_scale == NULL || v_scale == NULL))) return 1;
    if (!kv_quantized(kv_kind)) k_scale = v_scale = NULL;
    const Problem p = {q, k, v, k_cache, v_cache, k_scale, v_scale, block_tables, cu_q, cu_k, prefix_lens, out,
                       heads, hkv, d, bs, max_blocks, heads / hkv, scale, causal, kv_kind};
    int64_t num_tasks = 0;
    Task *tasks = plan_tasks(&p, batch, MV / p.g, &num_tasks);
    if (tasks == NULL) return 2;
    int status = 0;
#pragma omp parallel
    {
        float *qt = malloc(sizeof(float) * MAX_D * MV), *st = malloc(sizeof(float) * TK * MV);
        float *ot = malloc(sizeof(float) * MAX_D * MV), *stage = malloc(sizeof(float) * 2 * TK * d);
        if (qt == NULL || st == NULL || ot == NULL || stage == NULL) {
#pragma omp atomic write
            status = 2;
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t i = 0; i < num_tasks; i++)
            if (qt != NULL && st != NULL && ot != NULL && stage != NULL) run_task(&p, &tasks[i], qt, st, ot, stage);
        free(qt);
        free(st);
        free(ot);
        free(stage);
    }
    free(tasks);
    return status;
}

/* The SIMD route this library was built for (isa.h), so tests and benchmarks can say which ran. */
const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
