/* The decode attention's per-block dispatch, shared by its 256-bit kernels (attention_rows.h) and its 512-bit
 * ones (attention_zmm.h): a GQA group's g_n query heads go to kernels written for 1, 2 or 3 heads, and K rows
 * to score kernels that take ROWS at a time (a group's tail repeats its last row; its scores are not stored). */
#ifndef ATTENTION_GROUPS_H
#define ATTENTION_GROUPS_H
#include <stdint.h>

/* NAME(q [g_n][d], g_n, d, k, stride, n, scale, scores, ss): scores[g * ss + j] = scale * q_g . k_j for the n rows
 * k_j = k + j * stride, by SCORE_1/2/3(q, d, rows[ROWS], scale, out, out_stride). */
#define SCORE_GROUPS(NAME, SCORE, T, ROWS)                                                                   \
    static inline void NAME(const float *q, int64_t g_n, int64_t d, const T *k, int64_t stride, int64_t n,   \
                            float scale, float *scores, int64_t ss) {                                        \
        for (int64_t j = 0; j < n; j += ROWS) {                                                              \
            const T *rows[ROWS];                                                                             \
            for (int r = 0; r < ROWS; r++) rows[r] = k + (j + r < n ? j + r : n - 1) * stride;               \
            float tail[3 * ROWS];                                                                            \
            for (int64_t g = 0; g < g_n; g += 3) {                                                           \
                const int64_t gn = g_n - g < 3 ? g_n - g : 3, whole = j + ROWS <= n;                         \
                float *out = whole ? scores + g * ss + j : tail;                                             \
                const int64_t os = whole ? ss : ROWS;                                                        \
                if (gn == 3) SCORE##_3(q + g * d, d, rows, scale, out, os);                                  \
                else if (gn == 2) SCORE##_2(q + g * d, d, rows, scale, out, os);                             \
                else SCORE##_1(q + g * d, d, rows, scale, out, os);                                          \
                if (!whole)                                                                                  \
                    for (int64_t h = 0; h < gn; h++)                                                         \
                        for (int64_t r = 0; r < n - j; r++) scores[(g + h) * ss + j + r] = tail[h * ROWS + r]; \
            }                                                                                                \
        }                                                                                                    \
    }

/* NAME(acc [g_n][d], g_n, d, p, ps, v, stride, n): acc[g] += sum_j p[g * ps + j] * v_j, by WEIGH_1/2/3. */
#define WEIGH_GROUPS(NAME, WEIGH, T)                                                                         \
    static inline void NAME(float *acc, int64_t g_n, int64_t d, const float *p, int64_t ps, const T *v,      \
                            int64_t stride, int64_t n) {                                                     \
        for (int64_t g = 0; g < g_n; g += 3) {                                                               \
            const int64_t gn = g_n - g < 3 ? g_n - g : 3;                                                    \
            if (gn == 3) WEIGH##_3(acc + g * d, d, p + g * ps, ps, v, stride, n);                            \
            else if (gn == 2) WEIGH##_2(acc + g * d, d, p + g * ps, ps, v, stride, n);                       \
            else WEIGH##_1(acc + g * d, d, p + g * ps, ps, v, stride, n);                                    \
        }                                                                                                    \
    }
#endif
