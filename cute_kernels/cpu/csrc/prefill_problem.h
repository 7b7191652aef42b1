/* What the CPU prefill attention kernels share (cpu_prefill_attention.c in fp32, cpu_prefill_attention_amx.c
 * on AMX tiles): the problem's pointers and sizes, the task list over (sequence, KV head, query rows), and
 * where a key lives (the paged prefix or the new rows). Layouts: see cpu_prefill_attention.c. */
#ifndef PREFILL_PROBLEM_H
#define PREFILL_PROBLEM_H
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    int32_t b, kvh, r0, r1;
} Task;

typedef struct {
    const float *q, *k, *v;
    const void *k_cache, *v_cache; /* of element type kv_kind */
    const float *k_scale, *v_scale; /* an 8-bit cache's scale per KV head; NULL for the float types */
    const int32_t *tables, *cu_q, *cu_k, *prefix;
    float *out;
    int64_t heads, hkv, d, bs, max_blocks, g;
    float scale;
    int causal, kv_kind;
} Problem;

/* Where key t of sequence b lives: the paged cache for the prefix, the new k/v rows after it. */
static inline int64_t key_offset(const Problem *p, int64_t b, int64_t t, int64_t prefix, int64_t kvh, int *in_cache) {
    if (t < prefix) {
        *in_cache = 1;
        const int64_t blk = p->tables[b * p->max_blocks + t / p->bs];
        return ((blk * p->bs + t % p->bs) * p->hkv + kvh) * p->d;
    }
    *in_cache = 0;
    return ((p->cu_k[b] + t - prefix) * p->hkv + kvh) * p->d;
}

static inline int64_t keys_of(const Problem *p, int64_t b) { return p->prefix[b] + p->cu_k[b + 1] - p->cu_k[b]; }

/* Tasks of at most rows_per_task query rows per (sequence, KV head), each sequence's last rows first
 * (they see the most keys, so a dynamic schedule starts the longest work first); NULL when out of memory. */
static inline Task *plan_tasks(const Problem *p, int64_t batch, int64_t rows_per_task, int64_t *num_tasks) {
    int64_t n = 0;
    for (int64_t b = 0; b < batch; b++) n += (p->cu_q[b + 1] - p->cu_q[b] + rows_per_task - 1) / rows_per_task * p->hkv;
    Task *tasks = malloc(sizeof(Task) * (n ? n : 1));
    if (tasks == NULL) return NULL;
    int64_t t = 0;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r1 = p->cu_q[b + 1] - p->cu_q[b]; r1 > 0; r1 -= rows_per_task)
            for (int64_t kvh = 0; kvh < p->hkv; kvh++)
                tasks[t++] = (Task){(int32_t)b, (int32_t)kvh, (int32_t)(r1 > rows_per_task ? r1 - rows_per_task : 0),
                                    (int32_t)r1};
    *num_tasks = n;
    return tasks;
}
#endif
