"""Where the profiling scripts' results go: profiling/out/ by default (git ignores it), folders made on demand."""
from __future__ import annotations

import json
import os
from typing import Callable

OUT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "out")  # profiling/out


def make_parents(*paths: str) -> None:
    for path in paths:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)


def write_report(report: dict, json_path: str, png_path: str, plot: Callable[[dict, str], None]) -> None:
    """The report as JSON and its chart as a PNG; says where both went."""
    make_parents(json_path, png_path)
    with open(json_path, "w") as f:
        json.dump(report, f, indent=2)
    plot(report, png_path)
    print(f"wrote {json_path} and {png_path}")
