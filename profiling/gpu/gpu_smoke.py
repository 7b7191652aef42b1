"""The GPU suite's first checks, one kernel family per process (`--family decode|fused|fp8|prefill`): is
this an sm_90 device, does the family's kernel library load (AOT, or the DSL's JIT), and do a few
small launches match the torch reference? Exit 0 only if all hold. The suite runs each family under
its own timeout, so a hang in one family costs that family's seconds and hides nothing else.

    python3 profiling/gpu/gpu_smoke.py --family NAME [--json PATH]   (no --family: every family, in order)
    python3 profiling/gpu/gpu_smoke.py --dry-run [--family NAME]     list the checks; import what they need

Each result line is printed (and flushed) as soon as it is known; --json writes
{"family": ..., "checks": [{"name", "ok", "detail", "err", "calls"}]} with `err` the worst relative
error against the reference and `calls` the kernel entry points called.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAMILY_ORDER = ("decode", "fused", "fp8", "prefill")  # prefill last: a hang there hides nothing
COMMON_CHECKS = ("device is sm_90", "kernels load")
CHECKS = {
    "decode": "decode (2 splits + merge, bf16 and e4m3 caches) matches the reference",
    "fused": "fused add_rms_norm / rope / silu_and_mul / KV write (bf16, e4m3 bit-equal) match",
    "fp8": "fp8 quantize (bit-equal) + GEMM (unsplit, split-K) match",
    "prefill": "prefill (2 ragged sequences, GQA 4, causal) matches the reference",
}
MODULES = {  # what each family's check imports (the dry run imports them too)
    "decode": ("cute_kernels.hopper.decode.decode_host", "cute_kernels.hopper.decode.decode_launch",
               "cute_kernels.hopper.decode.decode_aot", "cute_kernels.kv_e4m3"),
    "fused": ("cute_kernels.hopper.fused.fused_ops", "cute_kernels.hopper.fused.fused_aot", "cute_kernels.kv_e4m3"),
    "fp8": ("cute_kernels.hopper.fp8_gemm.fp8_gemm_launch", "cute_kernels.hopper.fp8_gemm.fp8_gemm_aot", "cute_kernels.fp8_quant"),
    "prefill": ("cute_kernels.hopper.prefill.prefill_launch", "cute_kernels.toolchain.aot_loader"),
}
TOLERANCE = 1e-2


def _rel(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def _result(name: str, ok: bool, detail: str, err: float | None = None, calls: int = 0) -> dict:
    return {"name": name, "ok": bool(ok), "detail": detail, "err": err, "calls": calls}


def _library_reason(family: str) -> str | None:
    """None when this process can launch `family`'s kernels, else why not."""
    from cute_kernels.toolchain.kernel_path import kernel_path, kernels_unavailable_reason

    if family == "fp8":
        from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import fp8_kernels_unavailable_reason

        return fp8_kernels_unavailable_reason()
    if kernel_path() == "jit":
        return kernels_unavailable_reason()
    from cute_kernels.toolchain.aot_library import AotUnavailable, get_library

    module, cls = {"prefill": ("cute_kernels.toolchain.aot_loader", "AotPrefillKernels"),
                   "decode": ("cute_kernels.hopper.decode.decode_aot", "AotDecodeKernels"),
                   "fused": ("cute_kernels.hopper.fused.fused_aot", "AotFusedOps")}[family]
    try:
        get_library(getattr(importlib.import_module(module), cls))
    except AotUnavailable as exc:
        return f"no usable AOT kernels: {exc}"
    return None


def _decode(rnd) -> dict:
    import torch

    from cute_kernels.attention_args import DecodeArgs
    from cute_kernels.hopper.decode.decode_host import decode_attention
    from cute_kernels.reference import decode_attention_ref

    g = torch.Generator(device="cuda").manual_seed(1)
    kc, vc = rnd(20, 16, 2, 128), rnd(20, 16, 2, 128)
    tables = torch.randperm(20, device="cuda", generator=g).view(2, 10).int()
    dec = DecodeArgs(rnd(2, 8, 128), kc, vc, tables, torch.tensor([150, 33], dtype=torch.int32, device="cuda"),
                     128 ** -0.5)
    got = decode_attention(dec, splits=2)
    torch.cuda.synchronize()
    err = _rel(got, decode_attention_ref(DecodeArgs(dec.q.float(), kc.float(), vc.float(), tables,
                                                    dec.context_lens, dec.scale)))
    fp8_err = _decode_e4m3(dec)
    worst = max(err, fp8_err)
    return _result(CHECKS["decode"], worst < TOLERANCE, f"relative error {err:.1e}, e4m3 cache {fp8_err:.1e}",
                   worst, 2)


def _decode_e4m3(dec) -> float:
    """The same step over the cache quantized to e4m3 (per-head scales), against the reference over the
    dequantized bytes."""
    from dataclasses import replace

    import torch

    from cute_kernels.hopper.decode.decode_host import decode_attention
    from cute_kernels.kv_e4m3 import dequantize_e4m3, quantize_e4m3
    from cute_kernels.kv_quant import KVScales
    from cute_kernels.reference import decode_attention_ref

    ks, vs = (torch.tensor([0.01, 0.02], device="cuda") for _ in range(2))
    fp8 = replace(dec, k_cache=quantize_e4m3(dec.k_cache, ks), v_cache=quantize_e4m3(dec.v_cache, vs),
                  kv_scales=KVScales(ks, vs))
    got = decode_attention(fp8, splits=2)
    torch.cuda.synchronize()
    exact = replace(dec, q=dec.q.float(), k_cache=dequantize_e4m3(fp8.k_cache, ks),
                    v_cache=dequantize_e4m3(fp8.v_cache, vs))
    return _rel(got, decode_attention_ref(exact))


def _fused(rnd) -> dict:
    import torch

    from cute_kernels import reference
    from cute_kernels.hopper.fused import fused_ops as ops

    x, res, w = rnd(3, 4096), rnd(3, 4096), rnd(4096).abs()
    errs = {"add_rms_norm": _rel(ops.add_rms_norm(x, res, w, 1e-5)[0],
                                 reference.add_rms_norm_ref(x.float(), res.float(), w.float(), 1e-5)[0])}
    gate_up = rnd(3, 2048)
    errs["silu_and_mul"] = _rel(ops.silu_and_mul(gate_up), reference.silu_and_mul_ref(gate_up.float()))
    qk, cos, sin = rnd(3, 10, 128), rnd(3, 1, 64).float(), rnd(3, 1, 64).float()
    want = reference.rope_ref(qk.float(), cos, sin)
    errs["rope"] = _rel(ops.rope_(qk, cos, sin), want)
    kv, cache = rnd(3, 2, 128), torch.zeros(2, 16, 2, 128, device="cuda", dtype=torch.bfloat16)
    ops.write_kv(kv, kv, cache, cache, torch.tensor([3, -1, 20], device="cuda"))
    torch.cuda.synchronize()
    errs["write_kv"] = 0.0 if torch.equal(cache.view(-1, 2, 128)[[3, 20]], kv[[0, 2]]) else float("inf")
    errs["write_kv_e4m3"] = _write_e4m3(kv * 8)
    worst = max(errs.values())
    return _result(CHECKS["fused"], worst < TOLERANCE,
                   "relative errors " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()), worst, len(errs))


def _write_e4m3(kv) -> float:
    """The quantizing KV write (saturating: kv * 8 / 0.01 passes 448) is bit-equal to the reference."""
    import torch

    from cute_kernels.hopper.fused import fused_ops as ops
    from cute_kernels.kv_e4m3 import write_kv_e4m3_ref

    scale = torch.tensor([0.01, 0.05], device="cuda")
    slots = torch.tensor([3, -1, 20], device="cuda")
    got, want = (torch.zeros(2, 16, 2, 128, device="cuda", dtype=torch.float8_e4m3fn) for _ in range(2))
    ops.write_kv(kv, kv, got, got, slots, scale, scale)
    write_kv_e4m3_ref(kv, kv, want, want, slots, scale, scale)
    torch.cuda.synchronize()
    return 0.0 if torch.equal(got.view(torch.uint8), want.view(torch.uint8)) else float("inf")


def _fp8(rnd) -> dict:
    """Per-token quantization kernel (bit-equal to torch's) feeding the rowwise FP8 GEMM, unsplit and
    split-K (two splits of K=256's two k-tiles)."""
    import torch

    from cute_kernels.fp8_quant import quantize_rowwise
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import fp8_gemm, quantize_rows
    from cute_kernels.reference import fp8_gemm_ref

    x, w = rnd(5, 256), rnd(128, 256)
    (a, sa), (b, sb) = quantize_rows(x), quantize_rowwise(w)
    same = a.view(torch.uint8).equal(quantize_rowwise(x)[0].view(torch.uint8))
    ref = fp8_gemm_ref(a, b, sa, sb, out_dtype=torch.float32)
    err, split_err = _rel(fp8_gemm(a, b, sa, sb), ref), _rel(fp8_gemm(a, b, sa, sb, splits=2), ref)
    worst = max(err, split_err)
    return _result(CHECKS["fp8"], same and worst < TOLERANCE,
                   f"quantizer bit-equal: {same}; GEMM relative error {err:.1e}, split-K {split_err:.1e}", worst, 3)


def _prefill(rnd) -> dict:
    import torch

    from cute_kernels.attention_args import PrefillArgs
    from cute_kernels.hopper.prefill.prefill_launch import prefill_attention
    from cute_kernels.reference import prefill_attention_ref

    q, k, v = rnd(40, 8, 128), rnd(40, 2, 128), rnd(40, 2, 128)
    cu = torch.tensor([0, 17, 40], dtype=torch.int32, device="cuda")
    got = prefill_attention(PrefillArgs(q, k, v, cu, cu, 128 ** -0.5, max_seqlen_q=23))
    torch.cuda.synchronize()
    err = _rel(got, prefill_attention_ref(PrefillArgs(q.float(), k.float(), v.float(), cu, cu, 128 ** -0.5)))
    return _result(CHECKS["prefill"], err < TOLERANCE, f"relative error {err:.1e}", err, 1)


RUNS = {"decode": _decode, "fused": _fused, "fp8": _fp8, "prefill": _prefill}


def smoke(family: str, results: list[dict], report=print) -> list[dict]:
    """The family's checks, appended to `results` and passed to `report` as soon as each is known."""
    import torch

    def add(result: dict) -> bool:
        results.append(result)
        report(result)
        return result["ok"]

    if not torch.cuda.is_available():
        add(_result(COMMON_CHECKS[0], False, "torch sees no CUDA device"))
        return results
    cap = torch.cuda.get_device_capability()
    add(_result(COMMON_CHECKS[0], cap == (9, 0), f"{torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]}"))
    reason = _library_reason(family)
    from cute_kernels.toolchain.kernel_path import kernel_path

    if not add(_result(COMMON_CHECKS[1], reason is None, reason or kernel_path())):
        return results
    g = torch.Generator(device="cuda").manual_seed(0)
    add(RUNS[family](lambda *s: torch.randn(*s, device="cuda", generator=g).bfloat16()))
    return results


def _print(result: dict) -> None:
    print(f"{'ok  ' if result['ok'] else 'FAIL'} {result['name']}: {result['detail']}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=FAMILY_ORDER, action="append", help="default: all, in order")
    parser.add_argument("--dry-run", action="store_true", help="list the checks (no GPU needed)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    families = args.family or list(FAMILY_ORDER)
    if args.dry_run:  # the modules the checks need import here too (no CUDA needed)
        for family in families:
            for module in MODULES[family]:
                importlib.import_module(module)
            print(f"{family}: " + "; ".join((*COMMON_CHECKS, CHECKS[family])))
        return 0
    report: list[dict] = []

    def record(result: dict) -> None:  # printed and written at once: a later hang keeps what was known
        _print(result)
        if args.json:
            Path(args.json).write_text(json.dumps(report[0] if len(report) == 1 else report, indent=1))

    for family in families:
        report.append({"family": family, "checks": []})
        try:
            smoke(family, report[-1]["checks"], record)
        except Exception as exc:  # a crash is a failed check, reported in one line
            report[-1]["checks"].append(_result(f"{family} smoke", False, f"{type(exc).__name__}: {exc}"[:300]))
            record(report[-1]["checks"][-1])
    return 0 if all(r["ok"] for fam in report for r in fam["checks"]) else 1


if __name__ == "__main__":
    sys.exit(main())
