/* Varlen prefill attention in bf16 (CPUs with AMX-BF16 or AVX-512 BF16): the contract of
 * cpu_prefill_attention.c (new query rows over [paged prefix ; new keys], bottom-right causal; caches
 * fp32, bf16, int8 or e4m3), with Q, K, V and the softmax weights P rounded to bf16 and every sum in fp32.
 *
 * Why: attention was ~60% of a 2000-token prefill of the default model on the fp32 FMA kernel (1.2 s of
 * 1.85 s on 2 cores). prefill_attention.py sends work here only where the KV cache is already held at
 * bf16 precision or below (the default), so the keys and values lose nothing the cache did not; Q and P
 * gain a bf16 rounding (relative 2^-9).
 *
 * Two routes, one rounding: paged_prefill_attention_amx runs on the AMX tiles with keys down the tiles'
 * rows (attention_tiles.h); paged_prefill_attention_bf16, here, on vdpbf16ps for CPUs without AMX
 * (one vdpbf16ps does 32 products, an AVX2 FMA 8). Its steps: (1) every (sequence, KV head)'s keys and
 * values are packed once per call, 64 keys a block (K: for 16 keys and 32 dims, 16 rows of (dim pair) x
 * 16 keys; V: for 32 keys and 16 dims, 16 rows of (key pair) x 16 dims), each packed row of 16 pairs one
 * zmm; the prefix is read from the paged cache. (2) A task is 32 query vectors (rows x the heads of one
 * GQA group) of one KV head, run FlashAttention-style over key blocks: S = Q K^T (a Q pair a broadcast
 * word), an online softmax in base 2 (log2 e is folded into Q's scale; exp2 by a degree-5 polynomial and
 * vscalefps, relative error 3e-6), P rounded to bf16, then O (fp32, in memory, rescaled per block) += P V. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_tiles.h" /* the AMX route */
#include "bf16_attention.h"

#define AM 32     /* query vectors per task: two row tiles */
#define AKB 64    /* keys per block: four key tiles of 16, two chunks of 32 */
#define MAX_D 256 /* head_dim bound of the per-thread scratch */

#if defined(CPU_BF16)
typedef struct {
    const Problem *p;
    const int64_t *pack_at; /* (sequence, KV head) -> its first packed block */
    uint32_t *packs;        /* blocks of AKB * d words: K (AKB/2 * d) then V (AKB/2 * d) */
} Packed;

static inline int64_t blocks_of(int64_t keys) { return (keys + AKB - 1) / AKB; }

/* 16 floats of two rows interleaved as bf16 pairs, word i = (a[i], b[i]). */
static inline __m512i bf16_interleave(const float *a, const float *b) {
    const __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(a)));
    const __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(b)));
    return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

/* Packs block j of (sequence b, KV head kvh), a key pair at a time: K's dim pairs go down a tile's column
 * (a scatter at the 16-word row stride), V's key pairs fill a tile row. stage: 4 * d floats. */
static void pack_block(const Packed *pk, int64_t b, int64_t kvh, int64_t j, float *stage) {
    const Problem *p = pk->p;
    const int64_t d = p->d, dch = d / 32, dt = d / 16;
    uint32_t *kp = pk->packs + (pk->pack_at[b * p->hkv + kvh] + j) * AKB * d, *vp = kp + AKB * d / 2;
    const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(16));
    for (int64_t key = 0; key < AKB; key += 2) {
        const float *kr[2], *vr[2];
        key_rows(p, b, kvh, j * AKB + key, stage, &kr[0], &vr[0]);
        key_rows(p, b, kvh, j * AKB + key + 1, stage + 2 * d, &kr[1], &vr[1]);
        for (int h = 0; h < 2; h++) {
            const int64_t kt = (key + h) / 16, col = (key + h) % 16;
            for (int64_t c = 0; c < dch; c++)
                _mm512_i32scatter_epi32(kp + (kt * dch + c) * 256 + col, rows, bf16_pairs(kr[h] + 32 * c), 4);
        }
        const int64_t kc = key / 32, row = key % 32 / 2;
        for (int64_t t = 0; t < dt; t++)
            _mm512_storeu_si512(vp + (kc * dt + t) * 256 + row * 16, bf16_interleave(vr[0] + 16 * t, vr[1] + 16 * t));
    }
}

typedef struct {
    uint16_t *qa;  /* Q as 16-row blocks: [row tile][dim chunk][16][32] */
    float *s;      /* scores [2][AM][AKB]: this block's and the next's */
    uint16_t *pa;  /* P as 16-row blocks: [row tile][key chunk][16][32] */
    float *o;      /* [AM][d] */
    float mx[AM], l[AM];
    int32_t limit[AM]; /* vector m sees keys < limit (causal: its own position + 1) */
} Scratch;

#define VR 4 /* query vectors per register block of the vector route: VR x 4 accumulators of 16 lanes */

/* S for row tile mt against key block kb: K's packed row (dim pair, 16 keys) against a broadcast Q pair. */
static inline void scores_vec(const Scratch *w, float *s, const uint16_t *kb, int64_t dch, int mt) {
    for (int m0 = 0; m0 < 16; m0 += VR) {
        __m512 acc[VR][4];
        for (int r = 0; r < VR; r++)
            for (int t = 0; t < 4; t++) acc[r][t] = _mm512_setzero_ps();
        for (int64_t c = 0; c < dch; c++) {
            const uint32_t *qa = (const uint32_t *)(w->qa + (mt * dch + c) * 512) + m0 * 16;
            for (int pr = 0; pr < 16; pr++) {
                __m512bh k[4];
                for (int t = 0; t < 4; t++) k[t] = (__m512bh)_mm512_loadu_si512(kb + 2 * (t * dch + c) * 256 + pr * 32);
                for (int r = 0; r < VR; r++) {
                    const __m512bh q = (__m512bh)_mm512_set1_epi32((int)qa[r * 16 + pr]);
                    for (int t = 0; t < 4; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], k[t], q);
                }
            }
        }
        for (int r = 0; r < VR; r++)
            for (int t = 0; t < 4; t++) _mm512_storeu_ps(s + (mt * 16 + m0 + r) * AKB + 16 * t, acc[r][t]);
    }
}

/* O[row tile mt][dims 64g .. 64g + 63] += P V for one key block: V's packed row (key pair, 16 dims) against a broadcast P pair. */
static inline void weigh_vec(Scratch *w, const uint16_t *vb, int64_t d, int mt, int64_t g) {
    const int64_t dt = d / 16;
    for (int m0 = 0; m0 < 16; m0 += VR) {
        float *o = w->o + (mt * 16 + m0) * d + 64 * g;
        __m512 acc[VR][4];
        for (int r = 0; r < VR; r++)
            for (int t = 0; t < 4; t++) acc[r][t] = _mm512_loadu_ps(o + r * d + 16 * t);
        for (int64_t c = 0; c < 2; c++) {
            const uint32_t *pa = (const uint32_t *)(w->pa + (mt * 2 + c) * 512) + m0 * 16;
            const uint16_t *v = vb + 2 * (c * dt + 4 * g) * 256;
            for (int kp = 0; kp < 16; kp++) {
                __m512bh vv[4];
                for (int t = 0; t < 4; t++) vv[t] = (__m512bh)_mm512_loadu_si512(v + t * 512 + kp * 32);
                for (int r = 0; r < VR; r++) {
                    const __m512bh pp = (__m512bh)_mm512_set1_epi32((int)pa[r * 16 + kp]);
                    for (int t = 0; t < 4; t++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], vv[t], pp);
                }
            }
        }
        for (int r = 0; r < VR; r++)
            for (int t = 0; t < 4; t++) _mm512_storeu_ps(o + r * d + 16 * t, acc[r][t]);
    }
}

/* The online softmax over one block's scores (keys t0..t0+63): P in bf16, O rescaled. */
static void softmax_block(Scratch *w, const float *scores_of_block, int64_t t0, int64_t d) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int m = 0; m < AM; m++) {
        const float *s = scores_of_block + m * AKB;
        __mmask16 vis[4];
        __m512 sv[4], best = _mm512_set1_ps(NEG);
        for (int q = 0; q < 4; q++) {
            const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32((int)(t0 + 16 * q)));
            vis[q] = _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(w->limit[m]));
            sv[q] = _mm512_loadu_ps(s + 16 * q);
            best = _mm512_mask_max_ps(best, vis[q], best, sv[q]);
        }
        const float new_max = fmaxf(w->mx[m], _mm512_reduce_max_ps(best));
        const float alpha = _mm512_cvtss_f32(exp2_ps(_mm512_set1_ps(w->mx[m] - new_max)));
        w->mx[m] = new_max;
        __m512 pv[4], sum = _mm512_setzero_ps();
        for (int q = 0; q < 4; q++) {
            pv[q] = _mm512_maskz_mov_ps(vis[q], exp2_ps(_mm512_sub_ps(sv[q], _mm512_set1_ps(new_max))));
            sum = _mm512_add_ps(sum, pv[q]);
        }
        w->l[m] = w->l[m] * alpha + _mm512_reduce_add_ps(sum);
        uint16_t *pa = w->pa + (m / 16 * 2) * 512 + (m % 16) * 32;
        _mm512_storeu_si512(pa, (__m512i)_mm512_cvtne2ps_pbh(pv[1], pv[0]));
        _mm512_storeu_si512(pa + 512, (__m512i)_mm512_cvtne2ps_pbh(pv[3], pv[2]));
        if (alpha == 1.f) continue; /* the running max held: most rows of most blocks past the first few */
        float *o = w->o + m * d;
        const __m512 a = _mm512_set1_ps(alpha);
        for (int64_t i = 0; i < d; i += 16) _mm512_storeu_ps(o + i, _mm512_mul_ps(a, _mm512_loadu_ps(o + i)));
    }
}

static void run_task(const Packed *pk, const Task *task, Scratch *w) {
    const Problem *p = pk->p;
    const int64_t b = task->b, kvh = task->kvh, r0 = task->r0, g = p->g, d = p->d, dch = d / 32;
    const int64_t q_len = p->cu_q[b + 1] - p->cu_q[b], k_len = keys_of(p, b);
    const int64_t nvec = (task->r1 - r0) * g, pos0 = k_len - q_len + r0;
    const int64_t key_end = p->causal ? pos0 + (task->r1 - r0) : k_len;
    const float qscale = p->scale * LOG2E;
    for (int64_t m = 0; m < AM; m++) {
        const int64_t row = m < nvec ? m / g : 0; /* padding vectors repeat row 0's keys; never written */
        w->limit[m] = (int32_t)(p->causal ? pos0 + row + 1 : k_len);
        w->mx[m] = NEG, w->l[m] = 0.f;
        uint16_t *qa = w->qa + (m / 16 * dch) * 512 + (m % 16) * 32;
        const float *qm = m < nvec ? p->q + ((p->cu_q[b] + r0 + m / g) * p->heads + kvh * g + m % g) * d : NULL;
        for (int64_t c = 0; c < dch; c++) {
            float *scaled = w->o; /* free until the memset below */
            for (int64_t i = 0; i < 32; i++) scaled[i] = m < nvec ? qscale * qm[32 * c + i] : 0.f;
            _mm512_storeu_si512(qa + c * 512, bf16_pairs(scaled));
        }
    }
    memset(w->o, 0, sizeof(float) * AM * d);
    const uint16_t *base = (const uint16_t *)(pk->packs + pk->pack_at[b * p->hkv + kvh] * AKB * d);
    /* the next block's scores go to the tiles before this block's softmax, so the two overlap */
    const int64_t bstride = 2 * AKB * d; /* u16 per packed block */
    scores_vec(w, w->s, base, dch, 0);
    scores_vec(w, w->s, base, dch, 1);
    for (int64_t t0 = 0, j = 0; t0 < key_end; t0 += AKB, j++) {
        float *s = w->s + (j % 2) * AM * AKB;
        if (t0 + AKB < key_end) {
            scores_vec(w, w->s + ((j + 1) % 2) * AM * AKB, base + (j + 1) * bstride, dch, 0);
            scores_vec(w, w->s + ((j + 1) % 2) * AM * AKB, base + (j + 1) * bstride, dch, 1);
        }
        softmax_block(w, s, t0, d);
        const uint16_t *vb = base + j * bstride + AKB * d;
        for (int mt = 0; mt < 2; mt++)
            for (int64_t gq = 0; gq < d / 64; gq++) weigh_vec(w, vb, d, mt, gq);
    }
    for (int64_t m = 0; m < nvec; m++) {
        float *o = p->out + ((p->cu_q[b] + r0 + m / g) * p->heads + kvh * g + m % g) * d;
        const float inv = 1.f / w->l[m];
        for (int64_t i = 0; i < d; i++) o[i] = w->o[m * d + i] * inv;
    }
}

/* Which (sequence, KV head, block) the flat pack item i is: the sequence by its first item, then the rest. */
static void pack_item(const Packed *pk, const int64_t *seq_start, int64_t batch, int64_t i, float *stage) {
    const int64_t b = owner_of(seq_start, batch, i);
    const int64_t nkb = blocks_of(keys_of(pk->p, b)), local = i - seq_start[b];
    pack_block(pk, b, local / nkb, local % nkb, stage);
}

/* The vdpbf16ps route over the whole call: 0, or 2 when out of memory. */
static int run_vec(const Problem *p, int64_t batch) {
    const int64_t d = p->d;
    int64_t *seq_start = malloc(sizeof(int64_t) * (size_t)(batch + 1)), *pack_at = malloc(sizeof(int64_t) * (size_t)(batch * p->hkv + 1));
    int64_t num_tasks = 0;
    Task *tasks = plan_tasks(p, batch, AM / p->g, &num_tasks);
    int64_t total = 0;
    if (seq_start != NULL && pack_at != NULL)
        for (int64_t b = 0; b < batch; b++) {
            seq_start[b] = total * p->hkv;
            for (int64_t h = 0; h < p->hkv; h++) pack_at[b * p->hkv + h] = total * p->hkv + h * blocks_of(keys_of(p, b));
            total += blocks_of(keys_of(p, b));
        }
    static _Thread_local AmxBuffer packs;
    const Packed pk = {p, pack_at, amx_buffer(&packs, sizeof(uint32_t) * (size_t)(total * p->hkv * AKB * d + 1))};
    int status = seq_start == NULL || pack_at == NULL || tasks == NULL || pk.packs == NULL ? 2 : 0;
    if (status == 0) {
#pragma omp parallel
        {
            Scratch w;
            float *stage = malloc(sizeof(float) * 4 * MAX_D);
            w.qa = aligned_alloc(64, 2 * AM * MAX_D), w.pa = aligned_alloc(64, 2 * AM * AKB);
            w.s = aligned_alloc(64, 2 * 4 * AM * AKB), w.o = aligned_alloc(64, 4 * AM * MAX_D);
            const int ok = stage != NULL && w.qa != NULL && w.pa != NULL && w.s != NULL && w.o != NULL;
            if (!ok) {
#pragma omp atomic write
                status = 2;
            }
#pragma omp for schedule(dynamic, 4)
            for (int64_t i = 0; i < total * p->hkv; i++)
                if (ok) pack_item(&pk, seq_start, batch, i, stage);
#pragma omp for schedule(dynamic, 1)
            for (int64_t i = 0; i < num_tasks; i++)
                if (ok) run_task(&pk, &tasks[i], &w);
            free(stage), free(w.qa), free(w.pa), free(w.s), free(w.o);
        }
    }
    free(seq_start), free(pack_at), free(tasks);
    return status;
}
#endif

#define PREFILL_ARGS                                                                                         \
    const float *q, const float *k, const float *v, const void *k_cache, const void *v_cache,                \
        const int32_t *block_tables, const int32_t *cu_q, const int32_t *cu_k, const int32_t *prefix_lens,  \
        float *out, int64_t batch, int64_t heads, int64_t hkv, int64_t d, int64_t bs, int64_t max_blocks,   \
        float scale, int causal, int kv_kind, const float *k_scale, const float *v_scale

static int attend(PREFILL_ARGS, int tiles) {
    if (hkv <= 0 || heads % hkv || d <= 0 || d % 64 || d > MAX_D || bs <= 0 || heads / hkv > AM) return 1;
    if (!kv_kind_known(kv_kind) || (kv_quantized(kv_kind) && (k_scale == NULL || v_scale == NULL))) return 1;
    if (!kv_quantized(kv_kind)) k_scale = v_scale = NULL;
#if defined(CPU_BF16)
    const Problem p = {q, k, v, k_cache, v_cache, k_scale, v_scale, block_tables, cu_q, cu_k, prefix_lens, out,
                       heads, hkv, d, bs, max_blocks, heads / hkv, scale, causal, kv_kind};
#if defined(CPU_AMX)
    if (tiles) return run_tiles(&p, batch);
#else
    if (tiles) return 3;
#endif
    return run_vec(&p, batch);
#else
    (void)q, (void)k, (void)v, (void)k_cache, (void)v_cache, (void)block_tables, (void)cu_q, (void)cu_k;
    (void)prefix_lens, (void)out, (void)batch, (void)max_blocks, (void)scale, (void)causal, (void)tiles;
    return 3;
#endif
}

/* paged_prefill_attention_f32's arguments and returns (0; 1 bad sizes; 2 out of memory), and 3 where this
 * build or process has no AMX; head_dim must be a multiple of 64 here, a GQA group at most 32 heads. */
int paged_prefill_attention_amx(PREFILL_ARGS) {
    return attend(q, k, v, k_cache, v_cache, block_tables, cu_q, cu_k, prefix_lens, out, batch, heads, hkv, d, bs,
                  max_blocks, scale, causal, kv_kind, k_scale, v_scale, 1);
}

/* The same on vdpbf16ps: 3 where this build has no AVX-512 BF16. */
int paged_prefill_attention_bf16(PREFILL_ARGS) {
    return attend(q, k, v, k_cache, v_cache, block_tables, cu_q, cu_k, prefix_lens, out, batch, heads, hkv, d, bs,
                  max_blocks, scale, causal, kv_kind, k_scale, v_scale, 0);
}

int amx_available(void) { return amx_usable(); }

int bf16_available(void) {
#if defined(CPU_BF16)
    return 1;
#else
    return 0;
#endif
}

const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
