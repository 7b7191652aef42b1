"""How long OpenMP threads spin at a barrier before they sleep, set before torch loads libgomp (the
runtime reads GOMP_SPINCOUNT once, when it loads).

libgomp's default spins ~300,000 times. On a machine the engine shares (a 2-core box with another busy
process) a thread spinning at one of a step's hundreds of barriers holds the core its partner needs,
and a decode step ran up to ~10x slower (profiling/benchmarks/bench_offline.py --requests 16 under load: 15 useful
tok/s against 33-48 with 10,000 spins). 10,000 spins still outlast the short waits of a quiet machine.
A value the user set wins."""
from __future__ import annotations

import os
import sys

SPIN_COUNT = "10000"


def apply() -> bool:
    """Sets the default unless torch (and with it libgomp) is already loaded; True if it takes effect."""
    if "torch" in sys.modules:
        return False
    os.environ.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
    return True
