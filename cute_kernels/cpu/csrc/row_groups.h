/* The 8-row group layout of Q4_0, Q4_1 and Q8_0 weights (cute_kernels/cpu/row_groups.py says why and
 * how it is laid out): a grouped type's id is its base type's | GROUPED_TYPE, and rows 8g..8g+7 hold, per
 * block b, one chunk of 8 blocks' bytes where row 8g's block b starts in the file's layout. */
#ifndef ROW_GROUPS_H
#define ROW_GROUPS_H
#include <stdint.h>
#include <string.h>

#define GROUPED_TYPE 8
#define IS_GROUPED(type) ((type) & GROUPED_TYPE)
#define BASE_TYPE(type) ((type) & (GROUPED_TYPE - 1))
#define GROUP_ROWS 8

/* The f16 d (and Q4_1's m) before a block's values; the grouped types are the block types 0-2. */
static inline int group_head_bytes(int base) { return base == 1 ? 4 : 2; } /* Q4_1: d, m */
static inline int group_value_bytes(int base) { return base == 2 ? 32 : 16; } /* Q8_0: 32 int8 */

/* The chunk of row `row`'s block b in a grouped weight w (row_bytes per row, bb bytes per block). */
static inline const uint8_t *group_chunk(const uint8_t *w, int64_t row_bytes, int64_t bb, int64_t row, int64_t b) {
    return w + (row / GROUP_ROWS) * GROUP_ROWS * row_bytes + b * GROUP_ROWS * bb;
}

/* Lane l's block of a chunk, written as the file lays a block out (for the scalar and packing paths). */
static inline void group_block(const uint8_t *chunk, int base, int l, uint8_t *blk) {
    const int head = group_head_bytes(base), steps = group_value_bytes(base) / 4;
    for (int h = 0; h < head; h += 2) memcpy(blk + h, chunk + h * GROUP_ROWS + 2 * l, 2);
    for (int t = 0; t < steps; t++) memcpy(blk + head + 4 * t, chunk + head * GROUP_ROWS + 32 * t + 4 * l, 4);
}
#endif
