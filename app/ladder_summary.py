"""The About panel's view of the latest optimization ladder (profiling/benchmarks/optimization_ladder.py), when
its JSON exists: what each optimization bought on this machine, as the script measured it."""
from __future__ import annotations

import json
import os
import time

LADDER_JSON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiling", "out",
                           "ladder.json")


def ladder_markdown(path: str = LADDER_JSON) -> str:
    """A small table of the latest ladder, or "" when there is none (or it cannot be read)."""
    try:
        with open(path) as f:
            report = json.load(f)
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(os.path.getmtime(path)))
        rows = [f"| {r['rung']} | {r['output_tok_s']:.1f} | {r['speedup']:.2f}x | {r['kv_waste']:.0%} |"
                if "output_tok_s" in r else f"| {r['rung']} | {r['note']} | | |" for r in report["rungs"]]
        w = report["workload"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    head = (f"**Optimization ladder** ({report['model']}, {w['requests']} requests, batch {report['max_num_seqs']}, "
            f"measured {when}{', smoke run' if report.get('smoke') else ''})\n\n"
            "| rung | output tok/s | speed-up | KV waste |\n|---|---|---|---|")
    return "\n".join([head, *rows])
