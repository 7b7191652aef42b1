"""FP8 GEMM benchmark (`python profiling/gpu/bench_kernels.py fp8`): the CuTe e4m3 GEMM (rowwise and
128x128 block scales) beside torch._scaled_mm (cuBLASLt, row-wise scales) and bf16 torch.matmul, in
the same run on the same shapes. Prefill-sized M: TFLOP/s and the ratio to _scaled_mm. Decode-sized M
(<= 64): the weight-bytes bandwidth floor (N x K bytes at the chip's published HBM bandwidth) over the
measured time, i.e. the fraction of the floor reached; and where the host splits K (fewer output tiles
than SMs), the same GEMM unsplit, so the row shows what split-K buys.
"""
from __future__ import annotations

from dataclasses import dataclass

HBM_BYTES_PER_S = {"H100": 3.35e12, "H200": 4.8e12, "H800": 3.35e12}  # published, SXM


@dataclass(frozen=True)
class GemmCase:
    m: int
    n: int
    k: int

    @property
    def name(self) -> str:
        return f"M{self.m} N{self.n} K{self.k}"

    @property
    def decode(self) -> bool:
        return self.m <= 64

    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


# Llama-3-8B's projections (qkv 6144x4096, gate_up 28672x4096, down 4096x14336) and 8192^3; at decode
# sizes also o_proj (4096x4096) and one KV head group's k/v (1024x4096), whose few tiles split K.
FP8_CASES = [GemmCase(8192, 8192, 8192)] + [
    GemmCase(m, n, k) for m in (4096, 64, 16, 1) for n, k in ((6144, 4096), (28672, 4096), (4096, 14336))
] + [GemmCase(m, n, k) for m in (16, 1) for n, k in ((4096, 4096), (1024, 4096))]


def bench_case(case: GemmCase, time_ms) -> dict:
    import torch

    from cute_kernels.fp8_quant import quantize_activation_blocks, quantize_rowwise, quantize_weight_blocks
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_host import prepare_fp8_gemm
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_launch import launch_fp8_gemm
    from cute_kernels.hopper.fp8_gemm.fp8_gemm_spec import num_splits
    from cute_kernels.toolchain.kernel_path import kernel_path

    x = torch.randn(case.m, case.k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(case.n, case.k, device="cuda", dtype=torch.bfloat16) * 0.02
    (a, sa), (b, sb) = quantize_rowwise(x), quantize_rowwise(w)
    rowwise = prepare_fp8_gemm(a, b, sa, sb)
    (ab, sab), (bb, sbb) = quantize_activation_blocks(x), quantize_weight_blocks(w)
    block = prepare_fp8_gemm(ab, bb, sab, sbb)
    ms = {
        "cute_rowwise": time_ms(lambda: launch_fp8_gemm(rowwise)),
        "cute_block": time_ms(lambda: launch_fp8_gemm(block)),
        "scaled_mm": time_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16)),
        "bf16_matmul": time_ms(lambda: x @ w.t()),
    }
    splits = num_splits(case.m, case.n, case.k)
    if splits > 1:
        unsplit = prepare_fp8_gemm(a, b, sa, sb, splits=1)
        ms["cute_rowwise_unsplit"] = time_ms(lambda: launch_fp8_gemm(unsplit))
    row = {"case": case.name, "path": kernel_path(), "splits": splits,
           **{f"{k}_us": round(v * 1e3, 1) for k, v in ms.items()}}
    if case.decode:
        name = torch.cuda.get_device_name()
        bw = next((v for key, v in HBM_BYTES_PER_S.items() if key in name), None)
        floor_ms = case.n * case.k / bw * 1e3 if bw else None
        row |= {f"{k}_of_floor": round(floor_ms / v, 2) if floor_ms else None
                for k, v in ms.items() if k != "bf16_matmul"}
    else:
        row |= {f"{k}_tflops": round(case.flops() / v / 1e9, 1) for k, v in ms.items()}
        row["rowwise_vs_scaled_mm"] = round(ms["scaled_mm"] / ms["cute_rowwise"], 2)
    return row


def run_fp8_bench(dry_run: bool, time_ms) -> list[dict]:
    """time_ms(fn) -> mean milliseconds of fn on the GPU (bench_kernels' timer)."""
    if dry_run:
        from cute_kernels.hopper.fp8_gemm.fp8_gemm_spec import num_splits
        from cute_kernels.toolchain.kernel_path import kernel_path

        return [{"case": c.name, "path": kernel_path(), "decode": c.decode, "gflop": round(c.flops() / 1e9, 1),
                 "splits": num_splits(c.m, c.n, c.k), "dry_run": True} for c in FP8_CASES]
    rows = []
    for case in FP8_CASES:
        try:
            rows.append(bench_case(case, time_ms))
        except Exception as exc:  # one failing case must not hide the others
            rows.append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return rows
