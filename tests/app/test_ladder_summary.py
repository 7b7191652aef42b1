"""The About panel's optimization ladder: only a real run of the served model is shown, with its model,
machine and date; anything else is a plain sentence saying how to make one. A --smoke run writes to
its own folder and cannot be pointed at the page's file."""
import json
import os
import subprocess
import sys
import time

import pytest
import torch

from app.ladder_summary import LADDER_JSON, ladder_markdown, model_identity
from profiling.common.ladder_files import SMOKE_DIR, output_paths, run_record
from runtime.errors import UserError
from tests.server_utils import REPO
from tests.tiny_engine import tiny_weights

HOW = "python profiling/benchmarks/optimization_ladder.py"
RUNGS = [{"rung": "1 static batching", "output_tok_s": 20.0, "speedup": 1.0, "kv_waste": 0.62},
         {"rung": "4 + quantized weights", "note": "n/a (no quantization mode on this device)"}]


def report(cfg, smoke: bool = False, **extra) -> dict:
    return {"model": "m.gguf", **run_record(cfg, torch.device("cpu"), smoke), "max_num_seqs": 8,
            "workload": {"requests": 24}, "rungs": RUNGS, **extra}


def without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


def write(path, value) -> str:
    path.write_text(value if isinstance(value, str) else json.dumps(value))
    return str(path)


def test_a_run_of_the_served_model_shows_with_its_machine_and_date(tmp_path):
    cfg, _ = tiny_weights()
    r = report(cfg)
    text = ladder_markdown(model_identity(cfg), write(tmp_path / "l.json", r))
    assert text.startswith("**Optimization ladder** of m.gguf: 24 requests, batch 8;")
    assert f"measured on {r['machine']}, {r['date']}" in text and time.strftime("%Y-%m-%d", time.gmtime()) in r["date"]
    assert "| 1 static batching | 20.0 | 1.00x | 62% |" in text and "n/a (no quantization mode" in text


def test_anything_else_says_why_not_and_how_to_make_one(tmp_path):
    cfg, _ = tiny_weights()
    served = model_identity(cfg)
    other, _ = tiny_weights(num_hidden_layers=3)
    cases = {"none measured yet": str(tmp_path / "missing.json"),
             "--smoke` run of a tiny test model, not shown": write(tmp_path / "s.json", report(cfg, smoke=True)),
             f"measured {model_identity(other)}, not the served model ({served})": write(tmp_path / "o.json", report(other)),
             "measured m.gguf (recorded without its identity)": write(tmp_path / "old.json", {"model": "m.gguf"}),
             "cannot be read": write(tmp_path / "bad.json", "{not json"),
             "cannot be read (not a JSON object)": write(tmp_path / "list.json", [1, 2]),
             "not a ladder report ('date')": write(tmp_path / "nodate.json", without(report(cfg), "date")),
             "not a ladder report (string indices": write(tmp_path / "rungs.json", report(cfg, rungs=["x"]))}
    for expected, path in cases.items():
        text = ladder_markdown(served, path)
        assert expected in text and HOW in text and "| rung |" not in text, (expected, text)


def test_smoke_runs_write_to_their_own_folder_and_never_to_the_pages_file():
    assert output_paths(False, None, None) == (LADDER_JSON, LADDER_JSON[:-len("json")] + "png")
    smoke_json, smoke_png = output_paths(True, None, None)
    assert os.path.dirname(smoke_json) == os.path.dirname(smoke_png) == SMOKE_DIR and smoke_json != LADDER_JSON
    assert output_paths(True, "/tmp/x.json", None)[0] == "/tmp/x.json"
    sneaky = os.path.join(os.path.dirname(LADDER_JSON), "..", "out", "ladder.json")
    for path in (LADDER_JSON, sneaky):
        with pytest.raises(UserError, match="chat page"):
            output_paths(True, path, None)


def test_the_smoke_ladder_refuses_the_pages_file_before_it_measures_anything():
    before = os.stat(LADDER_JSON).st_mtime_ns if os.path.exists(LADDER_JSON) else None
    proc = subprocess.run([sys.executable, "profiling/benchmarks/optimization_ladder.py", "--smoke", "--json",
                           os.path.relpath(LADDER_JSON, REPO)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "chat page" in proc.stderr and "rung" not in proc.stdout
    assert (os.stat(LADDER_JSON).st_mtime_ns if os.path.exists(LADDER_JSON) else None) == before
