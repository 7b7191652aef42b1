"""`python profiling/gpu/bench_kernels.py fused`: the fused elementwise kernels (add+RMSNorm, RoPE,
silu-and-mul, paged KV write) at Llama 3 8B's shapes, decode (64 rows) and prefill (4096 rows):
achieved bandwidth as a fraction of the device copy bandwidth measured in the same run, and the
speed-up over the torch reference ops."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 8, 128


@dataclass(frozen=True)
class FusedCase:
    op: str
    rows: int

    @property
    def name(self) -> str:
        return f"{self.op} rows {self.rows}"


CASES = [FusedCase(op, rows) for op in ("add_rms_norm", "rope", "silu_and_mul", "write_kv") for rows in (64, 4096)]


def _inputs(case: FusedCase):
    """(kernel call, reference call, bytes the op must move) for one case."""
    import torch

    from cute_kernels import reference
    from cute_kernels.hopper.fused import fused_ops

    bf16, n = dict(device="cuda", dtype=torch.bfloat16), case.rows
    if case.op == "add_rms_norm":
        x, res, w = torch.randn(n, HIDDEN, **bf16), torch.randn(n, HIDDEN, **bf16), torch.rand(HIDDEN, **bf16)
        return (lambda: fused_ops.add_rms_norm(x, res, w, 1e-5), lambda: reference.add_rms_norm_ref(x, res, w, 1e-5),
                (4 * n + 1) * HIDDEN * 2)
    if case.op == "rope":
        qk = torch.randn(n, HEADS + KV_HEADS, HEAD_DIM, **bf16)
        cos, sin = torch.rand(n, 1, HEAD_DIM // 2, device="cuda"), torch.rand(n, 1, HEAD_DIM // 2, device="cuda")
        return (lambda: fused_ops.rope_(qk, cos, sin), lambda: reference.rope_ref(qk, cos, sin),
                2 * qk.numel() * 2 + 2 * cos.numel() * 4)
    if case.op == "silu_and_mul":
        gate_up = torch.randn(n, 2 * INTER, **bf16)
        return (lambda: fused_ops.silu_and_mul(gate_up), lambda: reference.silu_and_mul_ref(gate_up), 3 * n * INTER * 2)
    k, v = torch.randn(n, KV_HEADS, HEAD_DIM, **bf16), torch.randn(n, KV_HEADS, HEAD_DIM, **bf16)
    caches = [torch.zeros(n // 16 + 8, 16, KV_HEADS, HEAD_DIM, **bf16) for _ in range(2)]
    slots = torch.randperm(caches[0].shape[0] * 16, device="cuda")[:n]
    return (lambda: fused_ops.write_kv(k, v, *caches, slots), lambda: reference.write_kv(k, v, *caches, slots),
            4 * k.numel() * 2)


def run(dry_run: bool, time_ms: Callable[[Callable], float]) -> list[dict]:
    from cute_kernels.toolchain.kernel_path import kernel_path

    if dry_run:
        return [{"case": c.name, "path": kernel_path(), "dry_run": True} for c in CASES]
    from profiling.gpu.decode_bench import copy_bandwidth

    bandwidth = copy_bandwidth(time_ms)
    rows = []
    for case in CASES:
        try:
            kernel, ref, nbytes = _inputs(case)
            cute_ms, ref_ms = time_ms(kernel, 5, 50), time_ms(ref, 5, 50)
            gbs = nbytes / cute_ms / 1e6
            rows.append({"case": case.name, "path": kernel_path(), "cute_us": round(cute_ms * 1e3, 1),
                         "gb_s": round(gbs), "of_copy_bw": round(gbs / bandwidth, 2),
                         "vs_torch": round(ref_ms / cute_ms, 2)})
        except Exception as exc:  # one failing case must not hide the others
            rows.append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return rows
