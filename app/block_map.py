"""The KV block map: one cell per block, colored by state."""
from __future__ import annotations

import numpy as np

# BlockPool.states(): free, cached-but-free, in use by one sequence, shared by several
STATE_NAMES = ("free", "cached (free)", "in use", "shared")
STATE_COLORS = np.array([[232, 232, 232], [140, 190, 250], [250, 170, 60], [200, 50, 60],
                         [255, 255, 255]], dtype=np.uint8)  # the last: past the end of the pool
_PAST_END = 4


def render(states: np.ndarray, columns: int = 64, cell: int = 6, max_blocks: int = 4096) -> np.ndarray:
    """An RGB image of the map; a pool larger than max_blocks is shown in groups (worst state wins)."""
    group = max(1, -(-len(states) // max_blocks))
    if group > 1:
        pad = (-len(states)) % group
        states = np.pad(states, (0, pad)).reshape(-1, group).max(axis=1)
    rows = -(-len(states) // columns)
    grid = np.full(rows * columns, _PAST_END, dtype=np.uint8)
    grid[: len(states)] = states
    img = STATE_COLORS[grid.reshape(rows, columns)]
    img = img.repeat(cell, axis=0).repeat(cell, axis=1)
    img[::cell, :] = 255  # thin white grid lines between cells
    img[:, ::cell] = 255
    return img
