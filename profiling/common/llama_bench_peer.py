"""llama.cpp's own C++ benchmark (`llama-bench`, built from the llama.cpp that llama-cpp-python vendors)
run as a peer in a benchmark's own sitting: decode tokens/s of `tg128`, at an empty context and after a
prompt of `depth` tokens (`-d`), on the same GGUF and thread count."""
from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class BenchRow:
    """One llama-bench test: its name as llama-bench prints it (tg128, tg128 @ d2048) and its mean tok/s."""

    name: str
    tok_s: float


def llama_bench(binary: str, model: str, depths: list[int], threads: int, new_tokens: int = 128,
                repetitions: int = 3) -> list[BenchRow]:
    """Decode-only rows (-p 0 -n new_tokens) at each depth; RuntimeError (its stderr's tail) where it fails."""
    cmd = [binary, "-m", model, "-p", "0", "-n", str(new_tokens), "-t", str(threads), "-r", str(repetitions),
           "-d", ",".join(map(str, depths)), "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-400:]}")
    rows = []
    for test in json.loads(done.stdout):
        depth = int(test.get("n_depth", 0))
        rows.append(BenchRow(f"tg{test['n_gen']}" + (f" @ d{depth}" if depth else ""), float(test["avg_ts"])))
    return rows
