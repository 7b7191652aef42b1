"""What runs in a compile worker process: its own GrammarCompiler (no cache: the parent keeps one,
bounded in bytes), scheduled SCHED_IDLE so a long compile yields the CPU to the engine at once. A
compile that outlives its time limit or its client is ended by killing the process (structured/service.py).

Nice 10 was not enough on a 2-core CPU server: the engine's OpenMP threads meet at a barrier after
every op, and a niced compile holding a core delayed each meeting (plain requests' TPOT 3.8x beside
slow compiles); an idle-class process is preempted as soon as an engine thread wakes."""
from __future__ import annotations

import os
import signal
from typing import Any

from structured.compile import build

NICENESS = 10  # a busy engine thread at 0 gets ~90% of a shared core back from a compile at 10
_compiler: Any = None  # this worker's GrammarCompiler


def start_worker(tokenizer_info_json: str) -> None:
    """The pool's initializer: the compiler over the parent's tokenizer info."""
    import xgrammar as xgr

    global _compiler
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux
        os.nice(NICENESS)
    # pebble's own SIGTERM handler is Python: it cannot run inside a compile, which would then go on
    # for pebble's grace period (seconds) before the SIGKILL; a compile has nothing to clean up
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.deserialize_json(tokenizer_info_json), max_threads=1,
                                    cache_enabled=False)


def compile_serialized(kind: str, text: str) -> str:
    """The compiled grammar as xgrammar's JSON (the parent deserializes it over its TokenizerInfo)."""
    return build(_compiler, kind, text).serialize_json()
