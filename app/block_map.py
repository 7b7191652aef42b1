"""The KV block map: one cell per block, colored by state; a dark dot marks a cached block whose KV a tier
below the pool (host memory, disk) also holds, so evicting it costs a load, not a prefill."""
from __future__ import annotations

import numpy as np

from runtime.kv.block_pool import ALSO_BELOW

# BlockPool.states(): free, cached-but-free, in use by one sequence, shared by several
STATE_NAMES = ("free", "cached (free)", "in use", "shared")
STATE_COLORS = np.array([[232, 232, 232], [140, 190, 250], [250, 170, 60], [200, 50, 60],
                         [255, 255, 255]], dtype=np.uint8)  # the last: past the end of the pool
_PAST_END = 4
BELOW_NAME, BELOW_COLOR = "also held below (dot)", (40, 40, 40)


def render(states: np.ndarray, columns: int = 64, cell: int = 6, max_blocks: int = 4096) -> np.ndarray:
    """An RGB image of the map; a pool larger than max_blocks is shown in groups (worst state wins)."""
    base, below = states & ~np.uint8(ALSO_BELOW), (states & ALSO_BELOW) != 0
    group = max(1, -(-len(states) // max_blocks))
    if group > 1:
        pad = (-len(states)) % group
        base = np.pad(base, (0, pad)).reshape(-1, group).max(axis=1)
        below = np.pad(below, (0, pad)).reshape(-1, group).any(axis=1)
    rows = -(-len(base) // columns)
    grid = np.full(rows * columns, _PAST_END, dtype=np.uint8)
    grid[: len(base)] = base
    dotted = np.zeros(rows * columns, dtype=bool)
    dotted[: len(below)] = below
    img = STATE_COLORS[grid.reshape(rows, columns)]
    img = img.repeat(cell, axis=0).repeat(cell, axis=1)
    dot = np.zeros((cell, cell), dtype=bool)
    dot[cell // 2 - cell // 6:cell // 2 + max(1, cell // 6)] = True  # the middle third of a cell
    img[np.kron(dotted.reshape(rows, columns), dot & dot.T)] = BELOW_COLOR
    img[::cell, :] = 255  # thin white grid lines between cells
    img[:, ::cell] = 255
    return img
