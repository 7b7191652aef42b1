"""The end of profiling/gpu/gpu_suite.sh on the GPU: one table from the steps' logs and JSON, and every log
packed into one tar under $OUT (a GPU run returns at most 8 files, 16 MiB each).

    python3 profiling/gpu/gpu_suite_report.py table LOGS [--out FILE] [--seconds N]   exit 0: every step passed
    python3 profiling/gpu/gpu_suite_report.py pack LOGS TARFILE

Per family: the smoke (checks ok, kernel calls made), its worst relative error against the torch
reference, the GPU tests (pytest's summary, or how far a cut-off run got), and the benchmark
headline beside its peer, with the numbers as bench_kernels.py / bench_generate.py wrote them.
Pure Python: no torch.
"""
from __future__ import annotations

import argparse
import io
import json
import re
import sys
import tarfile
from pathlib import Path

FAMILIES = ("decode", "fused", "fp8", "prefill", "engine")
TIMEOUT_RCS = ("124", "137")
TAR_LIMIT = 15 << 20  # under the 16 MiB a returned file may have


def read_steps(logs: Path) -> list[dict]:
    steps = []
    for line in (logs / "steps.tsv").read_text().splitlines() if (logs / "steps.tsv").is_file() else []:
        family, kind, label, rc, seconds, limit = (line.split("\t") + [""] * 6)[:6]
        steps.append({"family": family, "kind": kind, "label": label, "rc": rc, "seconds": seconds,
                      "limit": limit, "log": logs / f"{kind}_{label}.log", "json": logs / f"{kind}_{label}.json"})
    return steps


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _tail(path: Path, n: int = 1) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    return " | ".join(lines[-n:])[:160] or "empty log"


def _hung_at(path: Path) -> str:
    """The innermost frame of the first traceback faulthandler dumped before the timeout, if any."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return "no log"
    for i, line in enumerate(lines):
        if "most recent call first" in line and i + 1 < len(lines):
            return "in " + lines[i + 1].strip()
    return _tail(path)


def _status(step: dict) -> str | None:
    """A cell for a step that did not finish by itself, else None."""
    rc = step["rc"]
    if rc.startswith("skip"):
        return rc
    if rc in TIMEOUT_RCS:
        return f"TIMEOUT at {step['limit']} s"
    return None


def smoke_cells(step: dict | None) -> tuple[str, str, str | None]:
    """(smoke cell, worst error cell, detail line or None)."""
    if step is None:
        return "-", "-", None
    checks = (_load(step["json"]) or {}).get("checks", [])
    errs = [c["err"] for c in checks if c.get("err") is not None]
    err = f"{max(errs):.1e}" if errs else "-"
    failed = [c for c in checks if not c.get("ok")]
    if (status := _status(step)) is not None:
        return status, err, f"hung after: {checks[-1]['name'] if checks else 'start'}; {_hung_at(step['log'])}"
    if failed:
        return f"FAIL {len(checks) - len(failed)}/{len(checks)} ok", err, f"{failed[0]['name']}: {failed[0]['detail']}"
    if step["rc"] != "0" or not checks:
        return f"FAIL exit {step['rc']}", err, _tail(step["log"], 2)
    return f"ok {len(checks)}/{len(checks)}, {sum(c.get('calls', 0) for c in checks)} calls", err, None


_SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed|error|errors|skipped|deselected)\b.*?)\s*=*$")
_PROGRESS = re.compile(r"^([.FEsxX]+)\s*(\[\s*\d+%\])?$")


def tests_cells(step: dict | None) -> tuple[str, str | None]:
    """(tests cell, detail line or None)."""
    if step is None:
        return "-", None
    try:
        lines = step["log"].read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    summary = next((m.group(1) for ln in reversed(lines) if (m := _SUMMARY.match(ln.strip()))), None)
    failed = next((ln.split(" ", 1)[1].strip() for ln in lines if ln.startswith(("FAILED ", "ERROR "))), None)
    if (status := _status(step)) and status.startswith("skip"):
        return status, None
    if status:
        marks = "".join(m.group(1) for ln in lines if (m := _PROGRESS.match(ln.strip())))
        return (f"{status}: {marks.count('.')} ok, {marks.count('F') + marks.count('E')} failed",
                f"cut off; {_hung_at(step['log'])}")
    if summary is None:
        return f"FAIL exit {step['rc']}", _tail(step["log"], 2)
    short = ", ".join(part for part in re.sub(r" in [\d.]+s.*$", "", summary).split(", ")
                      if "deselected" not in part)
    return short, (f"first failure: {failed}" if failed and step["rc"] != "0" else None)


def _num(row: dict, key: str):
    value = row.get(key)
    return value if isinstance(value, (int, float)) else None


def _span(values: list) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "n/a"
    lo, hi = min(values), max(values)
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _prefill(rows: list[dict]) -> str:
    cases = [r for r in rows if _num(r, "cute_tflops") is not None]
    t = next((r for r in cases if "target" in r), None) or max(cases, key=lambda r: r["cute_tflops"])
    return (f"{t['case']}: {t['cute_tflops']} TFLOP/s ({t.get('of_peak')} of peak) vs cuDNN SDPA "
            f"{t.get('cudnn_tflops')} (x{t.get('vs_cudnn')}), flash SDPA {t.get('flash_tflops')} (x{t.get('vs_flash')}); "
            f"{len(cases)} cases {_span([r['cute_tflops'] for r in cases])} TFLOP/s, "
            f"x{_span([_num(r, 'vs_cudnn') for r in cases])} of cuDNN")


def _decode(rows: list[dict]) -> str:
    cases = [r for r in rows if _num(r, "of_copy") is not None]
    copy = next((r["copy_GBs"] for r in rows if "copy_GBs" in r), None)
    t = cases[0]
    peers = [f"{name} x{t[f'vs_{name}']}" for name in ("flashinfer", "flash_attn") if f"vs_{name}" in t]
    return (f"{t['case']}: {t['of_copy']} of copy bandwidth ({t.get('cute_GBs')} of {copy} GB/s), torch ref "
            f"x{t.get('vs_torch_ref')}, {', '.join(peers) or 'FlashInfer / flash-attn not installed'}; "
            f"{len(cases)} cases {_span([r['of_copy'] for r in cases])} of copy")


def _fused(rows: list[dict]) -> str:
    cases = [r for r in rows if _num(r, "of_copy_bw") is not None]
    return (f"{len(cases)} cases {_span([r['of_copy_bw'] for r in cases])} of copy bandwidth, "
            f"x{_span([_num(r, 'vs_torch') for r in cases])} vs the torch ops")


def _fp8(rows: list[dict]) -> str:
    big = [r for r in rows if _num(r, "cute_rowwise_tflops") is not None]
    small = [r for r in rows if _num(r, "cute_rowwise_of_floor") is not None]
    parts = [f"{r['case']}: rowwise {r['cute_rowwise_tflops']} TFLOP/s vs torch._scaled_mm "
             f"{r.get('scaled_mm_tflops')} (x{r.get('rowwise_vs_scaled_mm')})" for r in big[:1]]
    if small:
        parts.append(f"{len(small)} decode shapes {_span([r['cute_rowwise_of_floor'] for r in small])} of the HBM "
                     f"floor (_scaled_mm {_span([_num(r, 'scaled_mm_of_floor') for r in small])})")
    return "; ".join(parts)


def _fp8_engine(rows: list[dict]) -> str:
    if any("skipped" in r for r in rows):
        return "skipped: " + next(r["skipped"] for r in rows if "skipped" in r)[:100]
    by = {r["case"].rsplit(" ", 1)[-1]: r for r in rows if _num(r, "tpot_ms") is not None}
    return (f"batch-1 TPOT bf16 {by['bf16']['tpot_ms']} ms, fp8 {by['fp8']['tpot_ms']} ms "
            f"(x{by['fp8'].get('speedup_vs_bf16')})")


def _generate(rows: list[dict]) -> str:
    cute = {r["case"].rsplit(" ", 1)[-1]: r for r in rows if " cute " in r.get("case", "")}
    one, many = cute.get("1", {}), cute.get("64", {})
    return (f"cute backend batch 1 TPOT {one.get('tpot_ms')} ms = {one.get('tpot_vs_floor')}x its floor, "
            f"x{one.get('vs_torch_backend')} vs the torch backend; batch 64 {many.get('out_tok_s')} tok/s "
            f"(x{many.get('vs_torch_backend')})")


HEADLINES = {"prefill": _prefill, "decode": _decode, "fused": _fused, "fp8": _fp8, "fp8_engine": _fp8_engine,
             "generate": _generate}


def bench_cell(step: dict) -> str:
    name = "" if step["label"] == step["family"] else f"{step['label']}: "
    if status := _status(step):
        return f"{name}{status}"
    rows = _load(step["json"])
    if not isinstance(rows, list):
        return f"{name}FAIL exit {step['rc']}: {_tail(step['log'])}"
    errors = [r for r in rows if "error" in r]
    cases = [r for r in rows if "case" in r]
    first = f"(first: {errors[0]['case']}: {errors[0]['error'][:80]})" if errors else ""
    if errors and len(errors) == len(cases):
        return f"{name}all {len(cases)} cases FAILED {first}"
    try:
        head = HEADLINES[step["label"]](rows)
    except Exception:  # noqa: BLE001 - a renamed column must not lose the table
        head = f"{len(rows)} rows (see {step['json'].name})"
    return name + head + (f"; {len(errors)} cases FAILED {first}" if errors else "")


def table(logs: Path, seconds: str) -> tuple[str, bool]:
    steps = read_steps(logs)
    out = io.StringIO()
    for s in (s for s in steps if s["kind"] == "preflight"):
        verdict = "ok" if s["rc"] == "0" else f"FAIL (exit {s['rc']})"
        out.write(f"preflight {s['label']}: {verdict}: {_tail(s['log'])}\n")
    header = f"{'family':<8} {'smoke':<20} {'max err':<8} {'GPU tests':<30} benchmark (beside its peer)"
    out.write(header + "\n" + "-" * len(header) + "\n")
    details = []
    for family in FAMILIES:
        mine = [s for s in steps if s["family"] == family]
        if not mine:
            continue
        smoke, err, smoke_detail = smoke_cells(next((s for s in mine if s["kind"] == "smoke"), None))
        tests, tests_detail = tests_cells(next((s for s in mine if s["kind"] == "tests"), None))
        benches = [bench_cell(s) for s in mine if s["kind"] == "bench"] or ["-"]
        out.write(f"{family:<8} {smoke:<20} {err:<8} {tests:<30} {benches[0]}\n")
        out.write("".join(f"{'':<69} {more}\n" for more in benches[1:]))
        details += [f"{family} {what}: {d[:200]}" for what, d in (("smoke", smoke_detail), ("tests", tests_detail)) if d]
    out.write("".join(line + "\n" for line in details))
    ok = bool(steps) and all(s["rc"] == "0" for s in steps)
    out.write(f"== gpu_suite: {'PASS' if ok else 'FAIL'} in {seconds} s; "
              f"{sum(s['rc'] == '0' for s in steps)}/{len(steps)} steps ok\n")
    return out.getvalue(), ok


def pack(logs: Path, tar_path: Path) -> int:
    """Every file of `logs` into one .tar.gz; logs over 1 MiB keep their head and tail if it runs big."""
    for clip in (None, 1 << 20, 64 << 10):
        with tarfile.open(tar_path, "w:gz") as tar:
            for path in sorted(p for p in logs.rglob("*") if p.is_file()):
                data = path.read_bytes()
                if clip and len(data) > clip:
                    data = data[:clip // 4] + b"\n[... clipped by gpu_suite_report.py ...]\n" + data[-clip // 2:]
                info = tarfile.TarInfo(f"logs/{path.relative_to(logs)}")
                info.size, info.mtime = len(data), int(path.stat().st_mtime)
                tar.addfile(info, io.BytesIO(data))
        if tar_path.stat().st_size <= TAR_LIMIT:
            return 0
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table")
    t.add_argument("logs", type=Path)
    t.add_argument("--out", type=Path)
    t.add_argument("--seconds", default="?")
    p = sub.add_parser("pack")
    p.add_argument("logs", type=Path)
    p.add_argument("tar", type=Path)
    args = parser.parse_args(argv)
    if args.cmd == "pack":
        return pack(args.logs, args.tar)
    text, ok = table(args.logs, args.seconds)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
