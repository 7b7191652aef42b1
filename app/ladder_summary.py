"""The About panel's view of the optimization ladder (profiling/benchmarks/optimization_ladder.py): what
each optimization bought, as the script measured it, shown only when the run measured the model this
server serves. A --smoke run (the tests' tiny random model) writes elsewhere and is refused here too,
so no test's figures pass for the engine's."""
from __future__ import annotations

import json
import os

from weights.config import ModelConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LADDER_JSON = os.path.join(REPO, "profiling", "out", "ladder.json")  # the script's default for a real run
HOW = ("`python profiling/benchmarks/optimization_ladder.py` measures one (about 4 minutes on 2 cores; "
       "`--model PATH` for a model other than the default), then reload this page")


def model_identity(cfg: ModelConfig) -> str:
    """What a ladder run records and the page compares: the checkpoint's model, not how it is served."""
    return f"{cfg.name} ({cfg.arch}, {cfg.num_layers} layers, {cfg.num_parameters():,} parameters)"


def ladder_markdown(served: str, path: str = LADDER_JSON) -> str:
    """A table of the ladder at path when it measured the served model (model_identity), else a plain
    sentence saying why none is shown and how to make one."""
    shown = os.path.relpath(path, REPO) if path.startswith(REPO) else path
    try:
        with open(path) as f:
            report = json.load(f)
        if not isinstance(report, dict):
            raise ValueError("not a JSON object")
    except FileNotFoundError:
        return f"**Optimization ladder**: none measured yet for this model ({served}). {HOW}."
    except (OSError, ValueError) as exc:
        return f"**Optimization ladder**: {shown} cannot be read ({exc}). {HOW}."
    if report.get("smoke"):
        return f"**Optimization ladder**: {shown} holds a `--smoke` run of a tiny test model, not shown. {HOW}."
    measured = report.get("model_id")
    if measured != served:
        what = measured or f"{report.get('model', 'a model')} (recorded without its identity)"
        return (f"**Optimization ladder**: the last run ({shown}) measured {what}, not the served model "
                f"({served}). {HOW}.")
    try:
        return _table(report)
    except (KeyError, TypeError, ValueError) as exc:
        return f"**Optimization ladder**: {shown} is not a ladder report ({exc}). {HOW}."


def _table(report: dict) -> str:
    rows = [f"| {r['rung']} | {r['output_tok_s']:.1f} | {r['speedup']:.2f}x | {r['kv_waste']:.0%} |"
            if "output_tok_s" in r else f"| {r['rung']} | {r['note']} | | |" for r in report["rungs"]]
    w = report["workload"]
    head = (f"**Optimization ladder** of {report['model']}: {w['requests']} requests, batch {report['max_num_seqs']}; "
            f"measured on {report['machine']}, {report['date']}\n\n"
            "| rung | output tok/s | speed-up | KV waste |\n|---|---|---|---|")
    return "\n".join([head, *rows])
