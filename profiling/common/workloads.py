"""Synthetic workloads shared by the benchmarks: token-id prompts so every engine sees the same input."""
from __future__ import annotations

import os
import random
from dataclasses import dataclass

# English prose for perplexity and long-context prompts (public domain), beside the quality scripts
TEXT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "quality", "data",
                    "declaration_1776.txt")


@dataclass
class OfflineRequest:
    prompt_ids: list[int]
    max_tokens: int


def offline_workload(n: int = 64, prompt_range=(32, 512), output_range=(16, 256), seed: int = 0,
                     vocab_range=(100, 49000)) -> list[OfflineRequest]:
    """n requests with uniform prompt and output lengths (the engine-core benchmark's shape)."""
    rng = random.Random(seed)
    return [OfflineRequest([rng.randrange(*vocab_range) for _ in range(rng.randint(*prompt_range))],
                           rng.randint(*output_range)) for _ in range(n)]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def summarize(values: list[float], qs: tuple[int, ...] = (50, 95, 99)) -> dict[str, float]:
    """{"mean", "p50", "p95", "p99"} of values (NaN when there are none)."""
    out = {"mean": sum(values) / len(values) if values else float("nan")}
    out.update({f"p{q}": percentile(values, q) for q in qs})
    return out
