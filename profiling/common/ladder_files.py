"""Where the optimization ladder writes and what its JSON records of the run. A real run goes where
the chat page reads (app/ladder_summary.py's LADDER_JSON); a --smoke run (a tiny random model) goes
to profiling/out/smoke/ and may not be pointed at the page's file. The record names the model as the
page identifies the served one, the machine and the date, so the page shows only runs of its model."""
from __future__ import annotations

import os
import platform
import time

import torch

from app.ladder_summary import LADDER_JSON, model_identity
from profiling.common.report_files import OUT
from runtime.errors import UserError
from weights.config import ModelConfig

SMOKE_DIR = os.path.join(OUT, "smoke")


def output_paths(smoke: bool, json_path: str | None, png_path: str | None) -> tuple[str, str]:
    """(JSON, PNG) paths: the given ones or the defaults for the run's size; UserError when a smoke
    run would land in the page's file."""
    folder = SMOKE_DIR if smoke else os.path.dirname(LADDER_JSON)
    json_path = json_path or os.path.join(folder, "ladder.json")
    png_path = png_path or os.path.join(folder, "ladder.png")
    if smoke and os.path.realpath(json_path) == os.path.realpath(LADDER_JSON):
        raise UserError(f"--smoke measures a tiny random model: its JSON may not replace {LADDER_JSON}, which the "
                        f"chat page shows as this engine's ladder (leave --json out: it goes to {SMOKE_DIR})")
    return json_path, png_path


def run_record(cfg: ModelConfig, device: torch.device, smoke: bool) -> dict:
    """The report's fields that say what was measured, where and when."""
    return {"model_id": model_identity(cfg), "machine": machine(device), "smoke": smoke,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def machine(device: torch.device) -> str:
    """'Intel(R) Xeon(R) Processor, 2 cores, 1 torch thread' or 'NVIDIA H200 (...)' for a CUDA run."""
    threads = torch.get_num_threads()
    cpu = f"{cpu_name()}, {os.cpu_count()} cores, {threads} torch thread{'s' if threads > 1 else ''}"
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (host: {cpu})"
    return cpu


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"
