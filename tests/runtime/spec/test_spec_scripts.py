"""The head training and the speculation benchmark at their --smoke size on the default model (CI): the
training writes heads that --speculative medusa|eagle loads, and the benchmark runs them with greedy output
identical to no speculation."""
import json
import sys

import pytest

from runtime.spec.heads import load_heads
from tests.profiling.test_profiling_scripts import run_script

pytestmark = pytest.mark.slow


def test_train_heads_smoke_then_bench_spec_smoke(tmp_path):
    proc = run_script("profiling/quality/train_heads.py", "--smoke", "--out", str(tmp_path), "--json",
                      str(tmp_path / "train.json"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trained = json.loads((tmp_path / "train.json").read_text())
    paths = {kind: r["path"] for kind, r in trained["kinds"].items()}
    assert set(paths) == {"medusa", "eagle"}
    for kind, path in paths.items():
        head, draft_ids = load_heads(path)
        assert head.cfg.kind == kind and head.cfg.target_vocab == 49152 and len(draft_ids) > 2
        assert len(trained["kinds"][kind]["acceptance_by_position"]) == 2
    out = tmp_path / "bench.json"
    proc = run_script("profiling/benchmarks/bench_spec.py", "--smoke", "--medusa", paths["medusa"], "--eagle",
                      paths["eagle"], "--json", str(out), timeout=400)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert {(r["workload"], r["proposer"]) for r in rows} >= {("chat T=0", "medusa"), ("chat T=0", "eagle"),
                                                             ("agentic T=0", "suffix"), ("chat T=1", "ngram")}
    assert all(r["identical"] for r in rows if r["identical"] is not None), "greedy output changed"
    assert any(r["by_position"] for r in rows if r["proposer"] == "suffix")
    print(proc.stdout, file=sys.stderr)
