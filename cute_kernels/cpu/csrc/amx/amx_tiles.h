/* AMX bf16 tile products for the linears on CPUs with AMX (Sapphire Rapids and later): y = bf16(x) @ W^T
 * (+ bias) with fp32 accumulation, W given by a callback that packs 32 output columns at a time.
 *
 * Why: one TDPBF16PS multiplies a 16 x 32 by a 32 x 16 bf16 tile (16K flops), 16x a vdpbf16ps; on the
 * 2-core AMX machine torch's oneDNN bf16 GEMM reaches ~2.1 TFLOP/s where our int8 VNNI tiles reach
 * ~0.45 TOP/s, and prefill is GEMM-bound. The callers (cpu_bf16_gemm.c for bf16 weights,
 * cpu_quant_amx.c for GGUF blocks) hand a packer that writes a panel's bf16 pairs; the loop, the
 * activation rounding and the edges live here once.
 *
 * Layout: tiles are 16 rows x 64 bytes. A (activations) is bf16, rows padded to 32 and k to 32 with zeros,
 * held tile-major (each 16-row x 32-value tile contiguous, a row block's k-tiles in order) so the tile
 * loads stream sequentially instead of touching 16 strided lines. B (weights) is a panel of AMX_N columns: packed[p * AMX_N + c] the bf16 pair
 * (w[c0 + c][2p], w[c0 + c][2p + 1]) as one 32-bit word (zero past n and past k), so the tile of
 * columns 0-15 at pair p0 is 16 rows of 64 bytes at packed + p0 * AMX_N with a 128-byte stride.
 * Register block: 2 A x 2 B tiles into 4 C tiles (32 rows x 32 columns), all 8 tile registers.
 * Linux grants a process AMX's tile state only on request (arch_prctl); amx_ready asks once. */
#ifndef AMX_TILES_H
#define AMX_TILES_H
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bf16_dot.h" /* to_bf16_row, CPU_BF16 */
#include "fused_rows.h" /* silu_mul_row */

/* A buffer of at least `bytes` kept for the calling thread's next call: a fresh multi-MiB allocation is
 * mapped anew by the kernel, and faulting its pages in cost as much as packing a 3072 x 576 weight. */
typedef struct {
    void *p;
    size_t bytes;
} AmxBuffer;

static inline void *amx_buffer(AmxBuffer *b, size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    if (b->bytes < bytes) {
        free(b->p);
        b->p = aligned_alloc(64, bytes);
        b->bytes = b->p != NULL ? bytes : 0;
    }
    return b->p;
}

#if defined(CPU_BF16) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define CPU_AMX 1
#include <sys/syscall.h>
long syscall(long number, ...); /* unistd.h declares it only outside strict C11 (build.py: -std=c11) */

#define AMX_K 32 /* bf16 values along k per tile step */
#define AMX_M 32 /* activation rows per register block */
#define AMX_N 32 /* output columns per panel */
#define AMX_TILE_VALUES 512 /* bf16 values of one A tile: 16 rows x 32 */
#define AMX_PANEL_BYTES (768 << 10) /* packed panels a thread holds at a time: under half its L2 */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef void (*amx_pack_fn)(const void *weight, int64_t c0, uint32_t *packed);

/* 1 when this process may use the tile registers (asked of the kernel once; a racing second ask
 * returns the same answer). */
static inline int amx_ready(void) {
    static int state = -1;
    if (state < 0) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return state;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} AmxConfig;

static inline void amx_configure(void) { /* per thread: every tile 16 rows x 64 bytes */
    AmxConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) c.rows[t] = 16, c.colsb[t] = 64;
    _tile_loadconfig(&c);
}

/* The 2 x 2 register block every AMX product here runs: C tiles 0-3 += A rows (a0, a1) x B columns (b0,
 * b1), the A tiles with row stride sa bytes, the B tiles sb; C tile 2i + j takes a_i x b_j. */
static inline void amx_step2x2(const void *a0, const void *a1, int64_t sa, const void *b0, const void *b1, int64_t sb) {
    _tile_loadd(4, a0, sa);
    _tile_loadd(5, a1, sa);
    _tile_loadd(6, b0, sb);
    _tile_loadd(7, b1, sb);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
}

/* C tiles 0-3 from / to a 32 x 32 fp32 block at c (row stride ld floats; zeroed where c is NULL). */
static inline void amx_load2x2(const float *c, int64_t ld) {
    if (c == NULL) {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        return;
    }
    _tile_loadd(0, c, ld * 4);
    _tile_loadd(1, c + 16, ld * 4);
    _tile_loadd(2, c + 16 * ld, ld * 4);
    _tile_loadd(3, c + 16 * ld + 16, ld * 4);
}

static inline void amx_store2x2(float *c, int64_t ld) {
    _tile_stored(0, c, ld * 4);
    _tile_stored(1, c + 16, ld * 4);
    _tile_stored(2, c + 16 * ld, ld * 4);
    _tile_stored(3, c + 16 * ld + 16, ld * 4);
}

/* out[32][32] (row stride ldo floats) = the two A row tiles at a (tile-major, tiles_k of them each) .
 * the packed panel, over tiles_k steps of AMX_K values. */
static inline void amx_block(const uint16_t *a, int64_t tiles_k, const uint32_t *packed, float *out, int64_t ldo) {
    amx_load2x2(NULL, 0);
    const uint16_t *a1 = a + tiles_k * AMX_TILE_VALUES;
    for (int64_t t = 0; t < tiles_k; t++)
        amx_step2x2(a + t * AMX_TILE_VALUES, a1 + t * AMX_TILE_VALUES, 64, packed + t * 16 * AMX_N,
                    packed + t * 16 * AMX_N + 16, AMX_N * 4);
    amx_store2x2(out, ldo);
}

/* One panel against activation rows r0..r1: full blocks land in y, edges pass through scratch. */
static void amx_panel(const uint16_t *xb, int64_t r0, int64_t r1, int64_t kp, const uint32_t *packed,
                      const float *bias, float *y, int64_t n, int64_t c0, float *scratch) {
    const int64_t cols = n - c0 < AMX_N ? n - c0 : AMX_N;
    for (; r0 < r1; r0 += AMX_M) {
        const int64_t rows = r1 - r0 < AMX_M ? r1 - r0 : AMX_M;
        const int direct = rows == AMX_M && cols == AMX_N;
        float *out = direct ? y + r0 * n + c0 : scratch;
        const int64_t ldo = direct ? n : AMX_N;
        amx_block(xb + r0 * kp, kp / AMX_K, packed, out, ldo);
        if (bias == NULL && direct) continue;
        for (int64_t r = 0; r < rows; r++) {
            float *dst = y + (r0 + r) * n + c0, *src = out + r * ldo;
            for (int64_t c = 0; c < cols; c++) dst[c] = src[c] + (bias != NULL ? bias[c0 + c] : 0.f);
        }
    }
}

enum { AMX_PLAIN = 0, AMX_GLU = 1, AMX_GLU_BF16 = 2 }; /* amx_gemm's glu: the GLU's rows as fp32, or as bf16 */

/* Rows r0..r1 of y[:, c0 : c0 + 32] (row stride n) = silu(gate) * up, the two products of one row block
 * against a gate panel and its up panel (packed after it), through scratch: fused_rows.h's silu_mul_row,
 * so a row gets the bits silu_and_mul_f32 gives it over the two products stored; with AMX_GLU_BF16, y holds
 * bf16 and gets those values rounded as to_bf16_row rounds the stored rows (what the next linear would do). */
static void amx_glu_block(const uint16_t *xb, int64_t r0, int64_t r1, int64_t kp, const uint32_t *gate,
                          const uint32_t *up, void *y, int64_t n, int64_t c0, float *scratch, int glu) {
    amx_block(xb + r0 * kp, kp / AMX_K, gate, scratch, AMX_N);
    amx_block(xb + r0 * kp, kp / AMX_K, up, scratch + AMX_M * AMX_N, AMX_N);
    for (int64_t r = 0; r < r1 - r0; r++) {
        float row[AMX_N];
        float *dst = glu == AMX_GLU_BF16 ? row : (float *)y + (r0 + r) * n + c0;
        silu_mul_row(scratch + r * AMX_N, scratch + (AMX_M + r) * AMX_N, dst, AMX_N);
        if (glu == AMX_GLU_BF16) to_bf16_row(row, (uint16_t *)y + (r0 + r) * n + c0, AMX_N);
    }
}

/* Rows as the tiles read them: bf16, tile-major (16 rows x 32 values contiguous, k-tiles in order), zero
 * past m and k; from fp32 x, rounded here, or from xr, rows already rounded (row-major [m, k]). */
static void amx_round_rows(const float *x, const uint16_t *xr, int64_t m, int64_t k, int64_t mp, int64_t kp,
                           uint16_t *xb) {
#pragma omp for schedule(static)
    for (int64_t r0 = 0; r0 < mp; r0 += 16)
        for (int64_t r = r0; r < r0 + 16; r++) {
            uint16_t row[kp];
            if (r < m && xr != NULL) memcpy(row, xr + r * k, sizeof(uint16_t) * (size_t)k);
            else if (r < m) to_bf16_row(x + r * k, row, k);
            memset(row + (r < m ? k : 0), 0, sizeof(uint16_t) * (size_t)(r < m ? kp - k : kp));
            for (int64_t t = 0; t < kp / AMX_K; t++)
                memcpy(xb + r0 * kp + t * AMX_TILE_VALUES + (r - r0) * AMX_K, row + t * AMX_K, 2 * AMX_K);
        }
}

/* amx_gemm's work inside a parallel region (the fused decode step's, or amx_gemm's own): every thread of the
 * team calls it with the same arguments. x: fp32 rows, rounded here, or xr: rows already bf16; xb: a shared
 * buffer of mp x kp bf16 (mp, kp: m and k rounded up to AMX_M and AMX_K); *failed: shared, set where a
 * thread's buffers cannot be allocated, and then no thread computes. No barrier at the end: a caller that
 * reads y across threads waits first. The process must have the tiles (amx_ready). */
static void amx_gemm_team(const float *x, const uint16_t *xr, int64_t m, int64_t k, amx_pack_fn pack,
                          const void *weight, const float *bias, float *y, int64_t n, int glu, uint16_t *xb,
                          int *failed) {
    const int64_t kp = (k + AMX_K - 1) / AMX_K * AMX_K, mp = (m + AMX_M - 1) / AMX_M * AMX_M;
    const int64_t panels = (n + AMX_N - 1) / AMX_N, panel_words = kp / 2 * AMX_N * (glu ? 2 : 1);
    int64_t chunk = AMX_PANEL_BYTES / (panel_words * 4);
    chunk = chunk < 1 ? 1 : chunk;
    static _Thread_local AmxBuffer panels_buffer;
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int by_panel = panels >= nt ? nt : (int)panels, by_row = nt / by_panel; /* thread grid */
    const int64_t blocks = mp / AMX_M, pi = t % by_panel, ri = t / by_panel;
    const int64_t p_begin = panels * pi / by_panel, p_end = panels * (pi + 1) / by_panel;
    const int64_t r_begin = AMX_M * (blocks * ri / by_row), r_end_block = AMX_M * (blocks * (ri + 1) / by_row);
    const int64_t r_end = r_end_block < m ? r_end_block : m;
    const int64_t have = p_end - p_begin < chunk ? p_end - p_begin : chunk;
    uint32_t *packed = ri < by_row ? amx_buffer(&panels_buffer, sizeof(uint32_t) * (size_t)(have * panel_words)) : NULL;
    static _Thread_local AmxBuffer scratch_buffer; /* kept: the fused decode step calls this per linear */
    float *scratch = amx_buffer(&scratch_buffer, sizeof(float) * AMX_M * AMX_N * 2);
    if (scratch == NULL || (ri < by_row && have > 0 && packed == NULL)) {
#pragma omp atomic write
        *failed = 1;
    }
#pragma omp barrier
    if (!*failed) { /* read after the barrier: every thread takes the same branch */
        amx_round_rows(x, xr, m, k, mp, kp, xb);
        amx_configure();
        for (int64_t p0 = p_begin; ri < by_row && p0 < p_end; p0 += chunk) {
            const int64_t p1 = p0 + chunk < p_end ? p0 + chunk : p_end;
            for (int64_t p = p0; p < p1; p++) {
                uint32_t *at = packed + (p - p0) * panel_words;
                pack(weight, p * AMX_N, at);
                if (glu) pack(weight, n + p * AMX_N, at + panel_words / 2); /* its up panel */
            }
            for (int64_t r0 = r_begin; r0 < r_end; r0 += AMX_M) {
                const int64_t r1 = r0 + AMX_M < r_end ? r0 + AMX_M : r_end;
                for (int64_t p = p0; p < p1; p++) {
                    const uint32_t *at = packed + (p - p0) * panel_words;
                    if (glu) amx_glu_block(xb, r0, r1, kp, at, at + panel_words / 2, y, n, p * AMX_N, scratch, glu);
                    else amx_panel(xb, r0, r1, kp, at, bias, y, n, p * AMX_N, scratch);
                }
            }
        }
        _tile_release();
    }
}

/* y[m, n] = bf16(x)[m, k] @ W^T (+ bias) (or xr, rows already bf16), W's panels from pack(weight, c0, packed); with
 * glu (AMX_GLU, or AMX_GLU_BF16 for bf16 rows in y), W has 2n rows
 * (gate, then up: n a multiple of AMX_N, no bias) and y[m, n] = silu(x W_gate^T) * (x W_up^T), each output
 * panel's gate and up panels packed side by side, so the [m, 2n] product is never written. Returns 0, 2 when
 * a buffer cannot be allocated, 3 when the kernel refuses this process the tile registers.
 * Blocking: each thread owns a contiguous run of panels (or, with fewer panels than threads, a share of
 * the rows against all of them) and packs AMX_PANEL_BYTES of them at a time into a buffer of its own,
 * which stays in its L2; then every 32-row block of activations passes against that set, rows outer,
 * so a row block is read once per set and the set once per row block, both from L2. Measured on the
 * 2-core AMX machine, one core, 2016 rows: 1.1-1.3 TFLOP/s this way against 0.9-1.0 with panels outer
 * and rows streamed past each panel (the panel fell out of L1 between uses either way); with no sync
 * between threads past the rounding. */
static int amx_gemm(const float *x, const uint16_t *xr, int64_t m, int64_t k, amx_pack_fn pack, const void *weight,
                    const float *bias, float *y, int64_t n, int nthreads, int glu) {
    if (!amx_ready()) return 3;
    const int64_t kp = (k + AMX_K - 1) / AMX_K * AMX_K, mp = (m + AMX_M - 1) / AMX_M * AMX_M;
    static _Thread_local AmxBuffer rows_buffer;
    uint16_t *xb = amx_buffer(&rows_buffer, sizeof(uint16_t) * (size_t)(mp * kp));
    int failed = xb == NULL;
#pragma omp parallel num_threads(nthreads) if (nthreads > 1)
    amx_gemm_team(x, xr, m, k, pack, weight, bias, y, n, glu, xb, &failed);
    return failed ? 2 : 0;
}
#endif

/* Whether this build has the AMX route and this process may use it (for tests and logs). */
static inline int amx_usable(void) {
#if defined(CPU_AMX)
    return amx_ready();
#else
    return 0;
#endif
}
#endif
