/* Varlen prefill attention on AMX tiles, keys down the tiles' rows (paged_prefill_attention_amx's route;
 * the contract and the roundings are cpu_prefill_attention_amx.c's: Q, K, V and P in bf16, fp32 sums).
 *
 * Why this layout: with queries down the rows (S = Q K^T, the vdpbf16ps route's), every query row's
 * softmax ends in horizontal reductions and scalar steps per 64-key block, which took ~60% of the
 * kernel (2 cores, a 2000-token prompt of the default model's shape: 4.6 of 9.0 ms a layer). Here
 * S^T = K Q^T puts 32 query vectors across two zmm per key, so the max, the sum and the rescale are
 * vertical ops, and O^T = V^T P^T keeps it so: P^T is the B tile, two keys' rows interleaved.
 *
 * Layouts. Per (sequence, KV head), packed once per call, 64 keys a block: K as bf16 rows [64][d] (A
 * tiles: 16 keys x 32 dims, row stride d), then V^T as [2 chunks of 32 keys][d][32] (A tiles: 16 dims
 * x 32 keys). A task is 32 query vectors (rows x the heads of one GQA group) of one KV head: Q^T as B
 * tiles [vector tile][dim chunk][16 dim pairs][16 vectors], S^T [64 keys][32] fp32, P^T as B tiles
 * [key chunk][vector tile][16 key pairs][16 vectors], O^T [d][32] fp32 in memory between blocks. */
#ifndef ATTENTION_TILES_H
#define ATTENTION_TILES_H
#include <omp.h>

#include "amx_tiles.h"
#include "bf16_attention.h"

#if defined(CPU_AMX)
#define TV 32       /* query vectors per task: two vector tiles */
#define TKB 64      /* keys per block: two chunks of 32, each two key tiles of 16 */
#define T_MAX_D 256 /* head_dim bound of the per-thread scratch */

typedef struct {
    const Problem *p;
    const int64_t *pack_at; /* (sequence, KV head) -> its first packed block */
    uint16_t *packs;        /* blocks of 2 * TKB * d values: K rows, then V^T */
} TilePacks;

typedef struct {
    uint32_t *qt; /* Q^T B tiles, 256 pairs each */
    float *s;     /* S^T of this block and the next: [2][TKB][TV] */
    uint32_t *pt; /* P^T B tiles: [2 key chunks][2 vector tiles][256] */
    float *ot;    /* O^T [d][TV] */
    float mx[TV], l[TV];
    int32_t limit[TV]; /* vector m sees keys < limit (causal: its own position + 1) */
} TileScratch;

/* Block j of (sequence b, KV head kvh): K rows in order, V's rows down the columns of V^T. */
static void tiles_pack_block(const TilePacks *pk, int64_t b, int64_t kvh, int64_t j, float *stage) {
    const Problem *p = pk->p;
    const int64_t d = p->d;
    uint16_t *kp = pk->packs + (pk->pack_at[b * p->hkv + kvh] + j) * 2 * TKB * d, *vp = kp + TKB * d;
    for (int64_t key = 0; key < TKB; key++) {
        const float *kr, *vr;
        key_rows(p, b, kvh, j * TKB + key, stage, &kr, &vr);
        for (int64_t i = 0; i < d; i += 32) _mm512_storeu_si512(kp + key * d + i, bf16_pairs(kr + i));
        uint16_t *col = vp + key / 32 * d * 32 + key % 32;
        for (int64_t i = 0; i < d; i++) col[i * 32] = f32_to_bf16(vr[i]);
    }
}

/* S^T of one block (K rows at kb) against the task's Q^T: per key chunk, 2 key x 2 vector tiles. */
static inline void tiles_scores(const TileScratch *w, float *s, const uint16_t *kb, int64_t d) {
    const int64_t dch = d / 32;
    for (int kc = 0; kc < 2; kc++) {
        amx_load2x2(NULL, 0);
        for (int64_t c = 0; c < dch; c++)
            amx_step2x2(kb + kc * 32 * d + c * 32, kb + (kc * 32 + 16) * d + c * 32, d * 2, w->qt + c * 256,
                        w->qt + (dch + c) * 256, 64);
        amx_store2x2(s + kc * 32 * TV, TV);
    }
}

/* O^T += V^T P^T for one block (V^T at vt): per pair of dim tiles, 2 dim x 2 vector tiles. */
static inline void tiles_weigh(TileScratch *w, const uint16_t *vt, int64_t d) {
    for (int64_t dt = 0; dt < d / 16; dt += 2) {
        float *o = w->ot + dt * 16 * TV;
        amx_load2x2(o, TV);
        for (int kc = 0; kc < 2; kc++)
            amx_step2x2(vt + (kc * d + dt * 16) * 32, vt + (kc * d + dt * 16 + 16) * 32, 64, w->pt + kc * 2 * 256,
                        w->pt + (kc * 2 + 1) * 256, 64);
        amx_store2x2(o, TV);
    }
}

/* Keys t0 + t of the block as visible to each vector of a zmm (limits lim): all where unmasked. */
static inline __mmask16 tiles_visible(__m512i lim, int64_t key, int masked) {
    return masked ? _mm512_cmpgt_epi32_mask(lim, _mm512_set1_epi32((int)key)) : (__mmask16)0xffff;
}

/* The online softmax over one block's S^T (keys t0..t0+63): P^T as bf16 B tiles, l and O^T rescaled.
 * masked: some vector's limit falls inside the block (its diagonal, or keys past the sequence). */
static void tiles_softmax(TileScratch *w, const float *s, int64_t t0, int64_t d, int masked) {
    const __m512i lim[2] = {_mm512_loadu_si512(w->limit), _mm512_loadu_si512(w->limit + 16)};
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                           21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 old[2], mx[2], alpha[2], sum[2];
    for (int h = 0; h < 2; h++) { /* the max over four chains (one chain waits out each max's latency): exact */
        old[h] = _mm512_loadu_ps(w->mx + 16 * h), sum[h] = _mm512_setzero_ps();
        __m512 m4[4] = {old[h], old[h], old[h], old[h]};
        for (int64_t t = 0; t < TKB; t += 4)
            for (int u = 0; u < 4; u++)
                m4[u] = _mm512_mask_max_ps(m4[u], tiles_visible(lim[h], t0 + t + u, masked), m4[u],
                                           _mm512_loadu_ps(s + (t + u) * TV + 16 * h));
        mx[h] = _mm512_max_ps(_mm512_max_ps(m4[0], m4[1]), _mm512_max_ps(m4[2], m4[3]));
        alpha[h] = exp2_ps(_mm512_sub_ps(old[h], mx[h]));
    }
    for (int64_t t = 0; t < TKB; t += 2)
        for (int h = 0; h < 2; h++) {
            const __m512 a = _mm512_maskz_mov_ps(tiles_visible(lim[h], t0 + t, masked),
                                                 exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + t * TV + 16 * h), mx[h])));
            const __m512 b = _mm512_maskz_mov_ps(tiles_visible(lim[h], t0 + t + 1, masked),
                                                 exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(s + (t + 1) * TV + 16 * h), mx[h])));
            sum[h] = _mm512_add_ps(sum[h], _mm512_add_ps(a, b));
            const __m512i ab = _mm512_permutexvar_epi16(pairs, (__m512i)_mm512_cvtne2ps_pbh(b, a));
            _mm512_storeu_si512(w->pt + ((t / 32) * 2 + h) * 256 + (t % 32) / 2 * 16, ab);
        }
    const __mmask16 moved0 = _mm512_cmpneq_ps_mask(alpha[0], _mm512_set1_ps(1.f));
    const __mmask16 moved1 = _mm512_cmpneq_ps_mask(alpha[1], _mm512_set1_ps(1.f));
    for (int h = 0; h < 2; h++) {
        _mm512_storeu_ps(w->mx + 16 * h, mx[h]);
        _mm512_storeu_ps(w->l + 16 * h, _mm512_fmadd_ps(_mm512_loadu_ps(w->l + 16 * h), alpha[h], sum[h]));
    }
    if (!(moved0 | moved1)) return; /* the running max held: most blocks past the first few */
    for (int64_t i = 0; i < d; i++)
        for (int h = 0; h < 2; h++)
            _mm512_storeu_ps(w->ot + i * TV + 16 * h, _mm512_mul_ps(alpha[h], _mm512_loadu_ps(w->ot + i * TV + 16 * h)));
}

/* Q^T of the task's vectors (scaled by scale * log2 e, bf16), their limits, the state cleared. */
static void tiles_start(const Problem *p, const Task *task, TileScratch *w) {
    const int64_t b = task->b, kvh = task->kvh, r0 = task->r0, g = p->g, d = p->d, dch = d / 32;
    const int64_t q_len = p->cu_q[b + 1] - p->cu_q[b], k_len = keys_of(p, b), nvec = (task->r1 - r0) * g;
    const int64_t pos0 = k_len - q_len + r0;
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(16));
    for (int64_t m = 0; m < TV; m++) {
        const int64_t row = m < nvec ? m / g : 0; /* padding vectors repeat row 0's limit; never written */
        w->limit[m] = (int32_t)(p->causal ? pos0 + row + 1 : k_len);
        w->mx[m] = NEG, w->l[m] = 0.f;
        const float *qm = m < nvec ? p->q + ((p->cu_q[b] + r0 + m / g) * p->heads + kvh * g + m % g) * d : NULL;
        const __m512 f = _mm512_set1_ps(p->scale * LOG2E); /* in registers: no stores for the scatter to wait on */
        for (int64_t c = 0; c < dch; c++) {
            const __m512i pairs = qm == NULL ? _mm512_setzero_si512()
                : (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(f, _mm512_loadu_ps(qm + 32 * c + 16)),
                                               _mm512_mul_ps(f, _mm512_loadu_ps(qm + 32 * c)));
            _mm512_i32scatter_epi32(w->qt + (m / 16 * dch + c) * 256 + m % 16, rows, pairs, 4);
        }
    }
    memset(w->ot, 0, sizeof(float) * TV * d);
}

static void tiles_task(const TilePacks *pk, const Task *task, TileScratch *w) {
    const Problem *p = pk->p;
    const int64_t b = task->b, kvh = task->kvh, r0 = task->r0, g = p->g, d = p->d;
    const int64_t q_len = p->cu_q[b + 1] - p->cu_q[b], k_len = keys_of(p, b), nvec = (task->r1 - r0) * g;
    const int64_t key_end = p->causal ? k_len - q_len + task->r1 : k_len, blocks = (key_end + TKB - 1) / TKB;
    tiles_start(p, task, w);
    const uint16_t *base = pk->packs + pk->pack_at[b * p->hkv + kvh] * 2 * TKB * d;
    /* the next block's scores go to the tiles before this block's softmax, so the two overlap */
    tiles_scores(w, w->s, base, d);
    for (int64_t j = 0; j < blocks; j++) {
        if (j + 1 < blocks) tiles_scores(w, w->s + (j + 1) % 2 * TKB * TV, base + (j + 1) * 2 * TKB * d, d);
        tiles_softmax(w, w->s + j % 2 * TKB * TV, j * TKB, d, (j + 1) * TKB > w->limit[0]);
        tiles_weigh(w, base + j * 2 * TKB * d + TKB * d, d);
    }
    for (int64_t m = 0; m < nvec; m++) {
        float *o = p->out + ((p->cu_q[b] + r0 + m / g) * p->heads + kvh * g + m % g) * d;
        const float inv = 1.f / w->l[m];
        for (int64_t i = 0; i < d; i++) o[i] = w->ot[i * TV + m] * inv;
    }
}

/* The whole call: returns 0, 2 when out of memory, 3 when this process may not use the tiles. */
static int run_tiles(const Problem *p, int64_t batch) {
    if (!amx_usable()) return 3;
    const int64_t d = p->d, nseq = batch * p->hkv;
    int64_t *pack_at = malloc(sizeof(int64_t) * (size_t)(nseq + 1));
    int64_t num_tasks = 0, total = 0;
    Task *tasks = plan_tasks(p, batch, TV / p->g, &num_tasks);
    if (pack_at != NULL)
        for (int64_t i = 0; i < nseq; i++) pack_at[i] = total, total += (keys_of(p, i / p->hkv) + TKB - 1) / TKB;
    static _Thread_local AmxBuffer packs;
    const TilePacks pk = {p, pack_at, amx_buffer(&packs, sizeof(uint16_t) * (size_t)(total * 2 * TKB * d + 1))};
    int status = pack_at == NULL || tasks == NULL || pk.packs == NULL ? 2 : 0;
    if (status == 0) {
#pragma omp parallel
        {
            TileScratch w;
            float *stage = malloc(sizeof(float) * 2 * T_MAX_D);
            w.qt = aligned_alloc(64, 4 * 2 * T_MAX_D / 32 * 256), w.s = aligned_alloc(64, 4 * 2 * TKB * TV);
            w.pt = aligned_alloc(64, 4 * 4 * 256), w.ot = aligned_alloc(64, 4 * TV * T_MAX_D);
            const int ok = stage != NULL && w.qt != NULL && w.s != NULL && w.pt != NULL && w.ot != NULL;
            if (!ok) {
#pragma omp atomic write
                status = 2;
            }
#pragma omp for schedule(dynamic, 4)
            for (int64_t i = 0; i < total; i++) {
                const int64_t at = owner_of(pack_at, nseq, i); /* its (sequence, KV head) */
                if (ok) tiles_pack_block(&pk, at / p->hkv, at % p->hkv, i - pack_at[at], stage);
            }
            if (ok) amx_configure();
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < num_tasks; i++)
                if (ok) tiles_task(&pk, &tasks[i], &w);
            if (ok) _tile_release();
            free(stage), free(w.qt), free(w.s), free(w.pt), free(w.ot);
        }
    }
    free(pack_at), free(tasks);
    return status;
}
#endif
#endif
