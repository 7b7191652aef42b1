/* One whole decode step of a Llama-family model with block-quantized weights, fp32 activations and
 * an fp32, bf16, int8 or e4m3 paged KV cache (kv_elem.h): every layer for a few rows (one new token per sequence)
 * in one call.
 *
 * Why: at batch 1 the weights (~67 MB of Q4_1 for SmolLM2-135M) stream from memory in ~10 ms, so a
 * step is bandwidth-bound only if nothing else costs time. Per layer the per-op path makes ~10 ctypes
 * calls, ~30 torch ops and an OpenMP fork/join per op; here ONE parallel region runs the whole step,
 * with a barrier between ops (the implicit one of each work-shared loop) and no allocation per layer.
 * GEMVs split over output rows, so both cores stream disjoint halves of each weight.
 *
 * The ops are the per-op kernels' own code (quant_dot.h, attention_rows.h, fused_rows.h), in the
 * order of runtime/model/llama.py's DecoderLayer: add+RMSNorm, q8 activations, qkv (+ bias), RoPE
 * (rotate-half), KV write at the step's slots, paged GQA decode attention, o_proj, add+RMSNorm,
 * gate_up, silu*mul, down; then the final add+RMSNorm. Python wrapper: cute_kernels/cpu/decode_step.py.
 * A linear may instead hold bf16 weights (type BF16, bf16_dot.h): its input is then rounded to bf16 where
 * another would be quantized to q8 blocks, and its GEMV is bf16 dot products with fp32 sums.
 */
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "amx/bf16_panels.h"
#include "amx/quant_panels.h"
#include "attention_rows.h"
#include "bf16_dot.h"
#include "fused_rows.h"
#include "quant_dot.h"
#include "tiles/quant_tiles.h"

#define GEMV_ROWS 16  /* rows a step takes when some linear has only the GEMV (docs/cpu_kernels.md: why 16) */
#define MAX_ROWS 1024 /* rows a step takes when every linear has the tiles GEMM (bf16: the AMX tiles) for that many */

enum { QKV = 0, O_PROJ = 1, GATE_UP = 2, DOWN = 3 };
enum { BF16 = 16 }; /* a weight type beside quant_dot.h's block types: [rows, cols] bf16, as decode_step.py says */

typedef struct { /* one decoder layer, as decode_step.py's DecodeLayer */
    const uint8_t *weight[4]; /* blocks of qkv [q + 2 kv, hidden], o_proj, gate_up [2 inter, hidden], down */
    int32_t type[4];          /* Q4_0 / Q4_1 / Q8_0 (or grouped: row_groups.h) / BF16 */
    int64_t tiles_from[4];    /* the fewest rows the linear's tiles GEMM serves (quant_gemm.py's TILES_ROWS); larger
                                 than MAX_ROWS: it has none, and steps stop at GEMV_ROWS rows */
    int64_t amx_from[4];      /* the fewest rows (past GEMV_ROWS) from which it takes the AMX tiles instead (bf16
                                 pairs: bf16 weights, or grouped blocks dequantized a panel at a time); larger than
                                 MAX_ROWS: never */
    const float *qkv_bias;    /* NULL: none */
    const float *input_norm, *post_norm;
    void *k_cache, *v_cache;  /* [num_blocks, block_size, kv_heads, head_dim] of the model's kv_kind */
    const float *k_scale, *v_scale; /* [kv_heads] for an 8-bit cache; NULL for the float types */
} DecodeLayer;

typedef struct { /* the model, as decode_step.py's DecodeModel; built once */
    const DecodeLayer *layers;
    int64_t num_layers, hidden, heads, kv_heads, head_dim, inter, num_blocks, block_size, max_positions;
    float eps, scale;
    int32_t kv_kind; /* KV_F32, KV_BF16, KV_I8 or KV_E4M3 */
    const float *final_norm, *cos_table, *sin_table; /* rope tables [max_positions, head_dim / 2] */
} DecodeModel;

typedef struct { /* the step's activations, one allocation */
    float *res, *h, *qkv, *attn, *gate_up, *d, *s;
    float *parts; /* the attention's split-KV partials */
    int8_t *q8;
    uint16_t *xb; /* a bf16 linear's input */
    int32_t *corr; /* the tiles GEMM's Q8_0 block sums */
    uint16_t *xt;  /* a bf16 linear's input as the AMX tiles read it (past GEMV_ROWS rows; NULL: none) */
    int *amx_failed; /* shared: an AMX product could not allocate its buffers (bf16 linears then take the GEMV) */
} Work;

/* The most rows a step takes: every linear on the tiles GEMM or the AMX tiles for many rows (all_tiles), else
 * GEMV_ROWS. */
int decode_step_max_rows(int all_tiles) { return all_tiles ? MAX_ROWS : GEMV_ROWS; }

/* y[m, n] = x @ W^T (+ bias) from quantized activations; groups of 8 output rows split over the team,
 * in cpu_quant_gemm.c's order (dot_tile8, dot_tile for the last n % 8), so a row gets its bits. */
/* The same for bf16 weights [n, k] against wk->xb: groups of 4 output rows over the team. */
static void gemv_bf16(const uint16_t *w, const Work *wk, const float *bias, float *y, int64_t m, int64_t n,
                      int64_t k) {
#pragma omp for schedule(static)
    for (int64_t g = 0; g < (n + BF16_TILE - 1) / BF16_TILE; g++) {
        const int64_t c0 = g * BF16_TILE;
        const int cols = (int)(n - c0 < BF16_TILE ? n - c0 : BF16_TILE);
        for (int64_t r0 = 0; r0 < m; r0 += BF16_TILE) {
            const int nr = (int)(m - r0 < BF16_TILE ? m - r0 : BF16_TILE);
            float out[BF16_TILE * BF16_TILE];
            bf16_tile(wk->xb + r0 * k, k, nr, w + c0 * k, k, cols, k, out, BF16_TILE);
            for (int r = 0; r < nr; r++)
                for (int l = 0; l < cols; l++)
                    y[(r0 + r) * n + c0 + l] = out[r * BF16_TILE + l] + (bias != NULL ? bias[c0 + l] : 0.f);
        }
    }
}

static void gemv(const uint8_t *w, int type, const Work *wk, const float *bias, float *y, int64_t m, int64_t n,
                 int64_t k) {
    if (type == BF16) {
        gemv_bf16((const uint16_t *)w, wk, bias, y, m, n, k);
        return;
    }
    const int64_t nb = k / QK, row_bytes = nb * BLOCK_BYTES[BASE_TYPE(type)];
#pragma omp for schedule(static)
    for (int64_t g = 0; g < (n + 7) / 8; g++) {
        const int64_t c0 = g * 8, cols = n - c0 < 8 ? n - c0 : 8;
        for (int64_t r0 = 0; r0 < m; r0 += ROW_TILE) {
            const int nr = (int)(m - r0 < ROW_TILE ? m - r0 : ROW_TILE);
            float out[ROW_TILE * 8];
            if (cols == 8)
                dot_tile8(w + c0 * row_bytes, row_bytes, type, nb, wk->q8 + r0 * k, wk->d + r0 * nb, wk->s + r0 * nb,
                          k, nr, out);
            else
                for (int64_t l = 0; l < cols; l++) {
                    float col[ROW_TILE];
                    dot_tile(w + (c0 + l) * row_bytes, type, nb, wk->q8 + r0 * k, wk->d + r0 * nb, wk->s + r0 * nb, k,
                             nr, col);
                    for (int r = 0; r < nr; r++) out[r * 8 + l] = col[r];
                }
            for (int r = 0; r < nr; r++)
                for (int64_t l = 0; l < cols; l++)
                    y[(r0 + r) * n + c0 + l] = out[r * 8 + l] + (bias != NULL ? bias[c0 + l] : 0.f);
        }
    }
}

/* Whether linear i takes the AMX tiles for m rows (its input then bf16 rows, as for a bf16 weight's GEMV). */
static int on_amx(const DecodeLayer *L, int i, int64_t m) { return m > GEMV_ROWS && m >= L->amx_from[i]; }

/* Whether linear i reads its input as bf16 rows (wk->xb) rather than q8 blocks. */
static int reads_bf16(const DecodeLayer *L, int i, int64_t m) { return L->type[i] == BF16 || on_amx(L, i, m); }

/* A linear on the AMX tiles (amx_tiles.h, the per-op route's product: bf16_linear's for bf16 weights, quant_amx's
 * for grouped blocks, so a row gets the bits that route gives it). Where their buffers could not be had, a bf16
 * weight takes the GEMV; grouped blocks leave *wk->amx_failed set and the step reports out of memory. */
static void amx_team(const uint8_t *w, int type, const Work *wk, const float *bias, float *y, int64_t m, int64_t n,
                     int64_t k) {
#if defined(CPU_AMX)
    const Bf16Weight bw = {(const uint16_t *)w, n, k};
    const GroupedWeight gw = {w, n, k, BASE_TYPE(type)};
    if (type == BF16) amx_gemm_team(NULL, wk->xb, m, k, pack_bf16_panel, &bw, bias, y, n, 0, wk->xt, wk->amx_failed);
    else amx_gemm_team(NULL, wk->xb, m, k, pack_quant_panel, &gw, bias, y, n, 0, wk->xt, wk->amx_failed);
#pragma omp barrier
    if (!*wk->amx_failed) return;
#endif
    if (type == BF16) gemv_bf16((const uint16_t *)w, wk, bias, y, m, n, k); /* (check_step: AMX builds only) */
}

/* Linear i of layer L: the GEMV up to GEMV_ROWS rows (faster here than the tiles, whose panels each task packs
 * anew: 14.9 vs 18.3 ms a step at 8 rows, 25.5 vs 26.5 at 16), past them the AMX tiles from its amx_from rows, else
 * the tiles GEMM (check_step: every linear has its route then); the GEMV and the tiles give a row the same bits
 * (quant_tiles.h). panel: this thread's tiles panel. */
static void linear(const DecodeLayer *L, int i, const Work *wk, const float *bias, float *y, int64_t m, int64_t n,
                   int64_t k, uint8_t *panel) {
    if (m <= GEMV_ROWS) gemv(L->weight[i], L->type[i], wk, bias, y, m, n, k);
    else if (on_amx(L, i, m)) amx_team(L->weight[i], L->type[i], wk, bias, y, m, n, k);
    else tiles_team(L->weight[i], L->type[i], wk->q8, wk->d, wk->s, wk->corr, bias, y, m, n, k, panel);
}

/* x [m, k] as a linear reads it: bf16 rows (bf16: reads_bf16), else q8 blocks; blocks (rows) split over the team. */
static void quantize(const float *x, int bf16, const Work *wk, int64_t m, int64_t k) {
    if (bf16) {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; r++) to_bf16_row(x + r * k, wk->xb + r * k, k);
        return;
    }
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m * (k / QK); i++) quantize_block_q8(x + i * QK, wk->q8 + i * QK, wk->d + i, wk->s + i);
}

/* res = x + res (x alone at the first layer), h = rms_norm(res) * w, then h as its linear reads it (quantize). */
static void norm_and_quantize(const DecodeModel *md, const float *x, const float *w, int first, int bf16,
                              const Work *wk, int64_t m) {
    const int64_t dim = md->hidden;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < m; r++) {
        add_rms_norm_row(x + r * dim, first ? NULL : wk->res + r * dim, w, wk->res + r * dim, wk->h + r * dim, dim,
                         md->eps);
        if (first) memcpy(wk->res + r * dim, x + r * dim, sizeof(float) * dim);
    }
    quantize(wk->h, bf16, wk, m, dim);
}

/* RoPE on q and k of each row, then k and v into the layer's cache at the row's slot. */
static void rope_and_write_kv(const DecodeModel *md, const DecodeLayer *L, const Work *wk, int64_t m,
                              const int64_t *positions, const int64_t *slots) {
    const int64_t d = md->head_dim, half = d / 2, kv = md->kv_heads * d, width = md->heads * d + 2 * kv;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < m; r++) {
        float *row = wk->qkv + r * width;
        const float *c = md->cos_table + positions[r] * half, *s = md->sin_table + positions[r] * half;
        for (int64_t h = 0; h < md->heads + md->kv_heads; h++) rope_head(row + h * d, c, s, half);
        kv_store_heads(L->k_cache, md->kv_kind, slots[r] * kv, row + md->heads * d, md->kv_heads, d, L->k_scale);
        kv_store_heads(L->v_cache, md->kv_kind, slots[r] * kv, row + md->heads * d + kv, md->kv_heads, d, L->v_scale);
    }
}

/* attn[r] = decode attention of row r's query heads: split-KV tasks (row, KV heads, chunk), then a merge
 * per (row, KV head) (attention_rows.h); parts: their partials, scratch: the thread's scores, then its stage. */
static void attend(const DecodeModel *md, const DecodeLayer *L, const Work *wk, int64_t m, const int32_t *tables,
                   int64_t max_blocks, const int32_t *lens, int64_t max_chunks, float *parts, float *scratch) {
    const int64_t d = md->head_dim, g_n = md->heads / md->kv_heads, hkv = md->kv_heads, bs = md->block_size;
    float *stage = scratch + md->heads * chunk_tokens(bs);
    const KVCache kc = {L->k_cache, L->v_cache, md->kv_kind, stage, L->k_scale, L->v_scale};
    const int64_t hg = heads_per_task(m, max_chunks, hkv, omp_get_num_threads());
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < m * hkv / hg * max_chunks; task++)
        attend_task(task, hg, wk->qkv, (md->heads + 2 * hkv) * d, &kc, tables, max_blocks, lens, max_chunks, g_n, hkv, d,
                    bs, md->scale, scratch, parts);
#pragma omp for schedule(static)
    for (int64_t pair = 0; pair < m * hkv; pair++)
        merge_pair(pair, parts, lens, max_chunks, g_n, hkv, d, bs, wk->attn, md->heads * d);
}

/* act = silu(gate) * up, quantized block by block, or rounded to bf16 for a down that reads bf16 (act itself is
 * never stored). */
static void silu_mul_quantize(const DecodeModel *md, int bf16, const Work *wk, int64_t m) {
    const int64_t inter = md->inter, nb = inter / QK;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < m * nb; i++) {
        const float *g = wk->gate_up + (i / nb) * 2 * inter + (i % nb) * QK;
        float act[QK];
        silu_mul_row(g, g + inter, act, QK);
        if (bf16)
            to_bf16_row(act, wk->xb + i * QK, QK);
        else
            quantize_block_q8(act, wk->q8 + i * QK, wk->d + i, wk->s + i);
    }
}

static void layer_step(const DecodeModel *md, const DecodeLayer *L, int first, float *x, const Work *wk, int64_t m,
                       const int64_t *positions, const int64_t *slots, const int32_t *tables, int64_t max_blocks,
                       const int32_t *lens, int64_t max_chunks, float *scratch, uint8_t *panel) {
    const int64_t h = md->hidden, q_size = md->heads * md->head_dim, kv = md->kv_heads * md->head_dim;
    norm_and_quantize(md, x, L->input_norm, first, reads_bf16(L, QKV, m), wk, m);
    linear(L, QKV, wk, L->qkv_bias, wk->qkv, m, q_size + 2 * kv, h, panel);
    rope_and_write_kv(md, L, wk, m, positions, slots);
    attend(md, L, wk, m, tables, max_blocks, lens, max_chunks, wk->parts, scratch);
    quantize(wk->attn, reads_bf16(L, O_PROJ, m), wk, m, q_size);
    linear(L, O_PROJ, wk, NULL, x, m, h, q_size, panel);
    norm_and_quantize(md, x, L->post_norm, 0, reads_bf16(L, GATE_UP, m), wk, m);
    linear(L, GATE_UP, wk, NULL, wk->gate_up, m, 2 * md->inter, h, panel);
    silu_mul_quantize(md, reads_bf16(L, DOWN, m), wk, m);
    linear(L, DOWN, wk, NULL, x, m, h, md->inter, panel);
}

/* Whether linear i serves m rows past GEMV_ROWS: on the AMX tiles from its amx_from (where this build and process
 * have them, for bf16 weights or grouped blocks), else on the tiles GEMM from its tiles_from. */
static int serves(const DecodeLayer *L, int i, int64_t m) {
    if (m >= L->amx_from[i])
        return amx_usable() && (L->type[i] == BF16 || quant_panels_read(L->type[i]));
    return L->type[i] != BF16 && L->tiles_from[i] <= m && tiles_read(L->type[i]);
}

/* Whether some block-quantized linear takes the AMX tiles for m rows (which has no fallback when they fail). */
static int blocks_on_amx(const DecodeModel *md, int64_t m) {
    for (int64_t l = 0; l < md->num_layers; l++)
        for (int i = 0; i < 4; i++)
            if (md->layers[l].type[i] != BF16 && on_amx(&md->layers[l], i, m)) return 1;
    return 0;
}

/* 1 where a linear can take the AMX tiles past GEMV_ROWS rows in this process (decode_step.py asks). */
int decode_step_amx(void) { return amx_usable(); }

/* Inputs the C code would otherwise read out of bounds: 0 when all are in range. */
static int check_step(const DecodeModel *md, int64_t m, const int64_t *positions, const int64_t *slots,
                      const int32_t *lens, int64_t max_blocks) {
    if (m < 1 || m > MAX_ROWS || !kv_kind_known(md->kv_kind)) return 1;
    for (int64_t l = 0; m > GEMV_ROWS && l < md->num_layers; l++)
        for (int i = 0; i < 4; i++)
            if (!serves(&md->layers[l], i, m)) return 1;
    for (int64_t r = 0; r < m; r++)
        if (positions[r] < 0 || positions[r] >= md->max_positions || slots[r] < 0
            || slots[r] >= md->num_blocks * md->block_size || lens[r] < 1 || lens[r] > max_blocks * md->block_size)
            return 3;
    return 0;
}

/* x [m, hidden]: the rows' embeddings in, overwritten; out [m, hidden]: the final normed hidden states.
 * block_tables [m, max_blocks] and context_lens [m] as cpu_decode_attention.c reads them (their block
 * ids checked by the caller). Returns 0, 1 (bad row count), 2 (out of memory) or 3 (a position, slot
 * or context length out of range). */
int decode_step_f32(const DecodeModel *md, float *x, float *out, int64_t m, const int64_t *positions,
                    const int64_t *slots, const int32_t *block_tables, int64_t max_blocks, const int32_t *context_lens,
                    int nthreads) {
    const int status = check_step(md, m, positions, slots, context_lens, max_blocks);
    if (status) return status;
    const int64_t h = md->hidden, d = md->head_dim, q_size = md->heads * d, width = q_size + 2 * md->kv_heads * d;
    const int64_t k_max = md->inter > h ? (md->inter > q_size ? md->inter : q_size) : (h > q_size ? h : q_size);
    int64_t max_len = 0;
    for (int64_t r = 0; r < m; r++) max_len = context_lens[r] > max_len ? context_lens[r] : max_len;
    const int64_t g_n = md->heads / md->kv_heads, max_chunks = num_chunks(max_len, md->block_size);
    const int64_t part_floats = m * md->kv_heads * max_chunks * partial_floats(g_n, d);
    const size_t floats = (size_t)m * (2 * h + width + q_size + 2 * md->inter + 3 * k_max / QK) + part_floats;
    float *buf = malloc(sizeof(float) * floats + (size_t)m * k_max * (1 + sizeof(uint16_t)));
    if (buf == NULL) return 2;
    Work wk = {.res = buf};
    wk.h = wk.res + m * h, wk.qkv = wk.h + m * h, wk.attn = wk.qkv + m * width, wk.gate_up = wk.attn + m * q_size;
    wk.d = wk.gate_up + m * 2 * md->inter, wk.s = wk.d + m * k_max / QK, wk.corr = (int32_t *)(wk.s + m * k_max / QK);
    wk.parts = (float *)(wk.corr + m * k_max / QK);
    wk.q8 = (int8_t *)(wk.parts + part_floats);
    wk.xb = (uint16_t *)(wk.q8 + m * k_max); /* after q8's m * k_max bytes (k_max is a multiple of QK: aligned) */
    const int64_t ks[3] = {h, q_size, md->inter}; /* the linears' input widths */
    size_t panel_bytes = 0; /* a thread's tiles panel: the largest any linear packs (0: no linear takes the tiles) */
    for (int i = 0; i < 3 && m > GEMV_ROWS; i++)
        panel_bytes = tiles_panel_bytes(ks[i]) > panel_bytes ? tiles_panel_bytes(ks[i]) : panel_bytes;
    int failed = 0, amx_failed = 0;
    wk.amx_failed = &amx_failed;
    if (m > GEMV_ROWS) { /* the AMX tiles' rows, padded to their 32 x 32 blocks, for the widest input */
        const int64_t mp = (m + 31) / 32 * 32, kp = (k_max + 31) / 32 * 32;
        wk.xt = aligned_alloc(64, sizeof(uint16_t) * (size_t)(mp * kp));
        amx_failed = wk.xt == NULL;
    }
    if (amx_failed && blocks_on_amx(md, m)) {
        free(buf);
        return 2;
    }
#pragma omp parallel num_threads(nthreads)
    {
        /* the attention's scores for one chunk, then a bf16 or 8-bit cache's stage of block_size rows */
        float *scratch = malloc(sizeof(float) * (md->heads * chunk_tokens(md->block_size) + md->block_size * d));
        uint8_t *panel = panel_bytes ? malloc(panel_bytes) : NULL;
        if (scratch == NULL || (panel_bytes && panel == NULL)) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) { /* read after the barrier: every thread takes the same branch, the loops' barriers match */
            for (int64_t l = 0; l < md->num_layers; l++)
                layer_step(md, &md->layers[l], l == 0, x, &wk, m, positions, slots, block_tables, max_blocks,
                           context_lens, max_chunks, scratch, panel);
#pragma omp for schedule(static)
            for (int64_t r = 0; r < m; r++)
                add_rms_norm_row(x + r * h, wk.res + r * h, md->final_norm, wk.res + r * h, out + r * h, h, md->eps);
        }
        free(scratch);
        free(panel);
    }
    free(buf);
    free(wk.xt);
    return failed || (amx_failed && blocks_on_amx(md, m)) ? 2 : 0;
}

/* The SIMD route this library was built for (isa.h), so tests and benchmarks can say which ran. */
const char *cpu_kernel_isa(void) { return cpu_isa_name(); }
