"""The GPU suite's first minute: the kernels' library opens and one small launch of each kernel family
matches its torch reference; otherwise the suite stops before spending GPU time on the rest.

    python profiling/gpu_smoke.py [--dry-run]

Prints one line per check and exits non-zero on the first failure; --dry-run lists the checks.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rel(out, ref) -> float:
    out, ref = out.float(), ref.float()
    if out.isnan().any():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-9))


def library() -> str:
    from cute_kernels.toolchain.kernel_path import kernel_path, kernels_unavailable_reason

    reason = kernels_unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    if kernel_path() == "jit":
        return "jit (nvidia-cutlass-dsl)"
    from cute_kernels.hopper.fused_aot import AotFusedOps
    from cute_kernels.toolchain.aot_library import get_library

    lib = get_library(AotFusedOps)
    return f"aot {lib.path.name}, {len(lib.variants)} variants"


def prefill() -> float:
    import torch

    BF16 = torch.bfloat16
    from cute_kernels.attention_args import PrefillArgs
    from cute_kernels.hopper.prefill_launch import prefill_attention
    from cute_kernels.reference import prefill_attention_ref

    q = torch.randn(22, 8, 128, device="cuda", dtype=BF16)
    k, v = torch.randn(22, 2, 128, device="cuda", dtype=BF16), torch.randn(22, 2, 128, device="cuda", dtype=BF16)
    cu = torch.tensor([0, 5, 22], device="cuda", dtype=torch.int32)
    out = prefill_attention(PrefillArgs(q, k, v, cu, cu, 128 ** -0.5, max_seqlen_q=17))
    ref = prefill_attention_ref(PrefillArgs(q.float(), k.float(), v.float(), cu, cu, 128 ** -0.5))
    return _rel(out, ref)


def fused_ops() -> float:
    import torch

    BF16 = torch.bfloat16
    from cute_kernels import reference
    from cute_kernels.hopper import fused_ops as ops

    x, res = torch.randn(3, 4096, device="cuda", dtype=BF16), torch.randn(3, 4096, device="cuda", dtype=BF16)
    w = torch.rand(4096, device="cuda", dtype=BF16)
    errs = [_rel(ops.add_rms_norm(x, res, w, 1e-5)[0], reference.add_rms_norm_ref(x.float(), res.float(), w.float(),
                                                                                  1e-5)[0])]
    gate_up = torch.randn(3, 2 * 1024, device="cuda", dtype=BF16)
    errs.append(_rel(ops.silu_and_mul(gate_up), reference.silu_and_mul_ref(gate_up.float())))
    qk = torch.randn(3, 10, 128, device="cuda", dtype=BF16)
    cos, sin = torch.rand(3, 1, 64, device="cuda"), torch.rand(3, 1, 64, device="cuda")
    ref = reference.rope_ref(qk.float(), cos, sin)
    errs.append(_rel(ops.rope_(qk, cos, sin), ref))
    kv = torch.randn(3, 2, 128, device="cuda", dtype=BF16)
    cache = torch.zeros(2, 16, 2, 128, device="cuda", dtype=BF16)
    ops.write_kv(kv, kv, cache, cache, torch.tensor([3, -1, 20], device="cuda"))
    errs.append(0.0 if torch.equal(cache.view(-1, 2, 128)[[3, 20]], kv[[0, 2]]) else float("inf"))
    return max(errs)


# (name, check, what passes): a check returns a description or a relative error vs the fp32 reference
CHECKS: list[tuple[str, Callable]] = [("library", library), ("prefill", prefill), ("fused_ops", fused_ops)]
MAX_REL = 2e-2  # bf16 outputs against fp32 references (the families' own tests state tighter ones)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="list the checks, run nothing")
    args = parser.parse_args(argv)
    if args.dry_run:
        print("\n".join(f"smoke {name}: listed" for name, _ in CHECKS))
        return 0
    import torch

    for name, check in CHECKS:
        try:
            result = check()
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - the message is the point
            print(f"smoke {name}: FAIL: {type(exc).__name__}: {exc}"[:300])
            return 1
        if isinstance(result, float):
            ok = result <= MAX_REL
            print(f"smoke {name}: {'ok' if ok else 'FAIL'} (relative error {result:.1e})")
            if not ok:
                return 1
        else:
            print(f"smoke {name}: ok ({result})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
