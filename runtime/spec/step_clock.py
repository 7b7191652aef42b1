"""What a verify row really costs: engine step times per row count, measured where the throttle sits.

The proposer is asked once per decode step, so the time between two calls is the step that ran in between
(its rows: the batch plus the drafts handed out), plus the engine's own bookkeeping, which every step
pays alike. A median per row count keeps prefill chunks and hiccups out; gaps longer than MAX_GAP_S
(the engine idle, a request arriving) are not steps and are dropped.

A draft in a batch of B pays when its acceptance chance a satisfies (B + a) / (T(B) + dT) >= B / T(B),
i.e. a >= dT / (T(B) / B): the row's cost over a token's share of the step. Where the step's cost is
not linear in its rows (the fused decode step's GEMV takes rows 4 at a time, and past 16 rows the tiles
GEMM takes over), only a measurement says where that line lies.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict, deque

MAX_GAP_S = 2.0   # longer than any decode step: the engine was idle
MIN_SAMPLES = 3   # steps of a row count before its median is trusted
KEEP = 32         # most recent steps kept per row count, so the clock follows load changes
STALE_S = 120.0   # a row count not seen for this long is forgotten: where drafts stopped, the model's
                  # line takes over again and its probes measure anew (contexts grow, load changes)


class StepClock:
    def __init__(self, clock=time.perf_counter, enabled: bool = True) -> None:
        """enabled=False: times nothing (row_line is always None), so draft lengths never depend on the
        machine's speed: --deterministic, where a request's tokens depend on the request alone."""
        self.clock, self.enabled = clock, enabled
        self.samples: dict[int, deque[float]] = defaultdict(lambda: deque(maxlen=KEEP))
        self.seen: dict[int, float] = {}  # row count -> when its last step ended
        self._last: tuple[float, int] | None = None  # (time of the last call, rows of the step it started)

    def tick(self, rows: int) -> None:
        """Called as a step's drafts are handed out: closes the previous step, opens one of `rows` rows."""
        if not self.enabled:
            return
        now = self.clock()
        if self._last is not None and 0.0 < now - self._last[0] <= MAX_GAP_S:
            self.samples[self._last[1]].append(now - self._last[0])
            self.seen[self._last[1]] = now
        for stale in [r for r, at in self.seen.items() if now - at > STALE_S]:
            del self.seen[stale], self.samples[stale]
        self._last = (now, rows)

    def step_time(self, rows: int) -> float | None:
        """The median step time at this many rows, None until MIN_SAMPLES steps were seen."""
        s = self.samples.get(rows)
        return statistics.median(s) if s is not None and len(s) >= MIN_SAMPLES else None

    def row_line(self, batch: int) -> float | None:
        """The acceptance a draft needs to pay for its row in a batch of `batch`, clamped to [1e-3, 1]:
        from the steps at `batch` rows and the larger row counts measured, by the steepest slope between
        them; None while either is unknown. The steepest, not the nearest count's: a row count timed a
        few times can read no slower than `batch` (noise), and that near-zero line let every sequence
        draft its whole length at batch 8 on chat at T=1 (0.50x of off)."""
        base = self.step_time(batch)
        if base is None:
            return None
        above = [(r, t) for r in self.samples if r > batch and (t := self.step_time(r)) is not None]
        if not above:
            return None
        slope = max((t - base) / (r - batch) for r, t in above)
        return min(1.0, max(1e-3, slope / (base / batch)))
