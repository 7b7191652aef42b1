"""`python profiling/gpu/bench_kernels.py prefill`: the cute sm_90a prefill kernel against torch SDPA with
the cuDNN backend (FA3-class on Hopper) and the flash backend (FA2), on the same inputs in one run.

Cases: causal and not, head_dim 64 and 128, 512 to 16k tokens per sequence (the batch keeps ~16k
tokens per launch), GQA 32:8, bf16; plus a paged-prefix case (new chunks over cached keys, which SDPA
sees gathered into contiguous K/V, so it does less work than the kernel). TFLOP/s count only the
visible (unmasked) score entries: 4 * d * heads * sum over queries of visible keys.
Scheduler A/B (causal cases in ORDER_CASES): the same kernel and inputs with the persistent CTAs
walking the longest-first tile list vs the tiles in plain (sequence, head, query tile) order.
"""
from __future__ import annotations

from dataclasses import dataclass

from profiling.gpu.gpu_peaks import peak_tflops, time_ms

TOKENS_PER_LAUNCH = 16384


@dataclass(frozen=True)
class PrefillCase:
    seqlen: int  # new tokens (queries) per sequence
    head_dim: int
    causal: bool
    prefix: int = 0  # cached tokens before each sequence's chunk (paged)
    heads: int = 32
    kv_heads: int = 8

    @property
    def batch(self) -> int:
        return max(1, TOKENS_PER_LAUNCH // self.seqlen)

    @property
    def name(self) -> str:
        mask = "causal" if self.causal else "full"
        prefix = f"+{self.prefix}paged" if self.prefix else ""
        return f"b{self.batch} L{self.seqlen}{prefix} h{self.heads}:{self.kv_heads} d{self.head_dim} {mask}"

    def flops(self) -> float:
        q, k = self.seqlen, self.seqlen + self.prefix
        visible = q * self.prefix + q * (q + 1) / 2 if self.causal else q * k
        return 4.0 * self.head_dim * self.heads * self.batch * visible


PREFILL_CASES = [
    PrefillCase(seqlen, d, causal)
    for causal in (True, False) for d in (128, 64) for seqlen in (512, 1024, 2048, 4096, 8192, 16384)
] + [PrefillCase(2048, 128, True, prefix=2048)]
TARGET = PrefillCase(4096, 128, True)  # the target: >= 550 TFLOP/s and >= 1.0x cuDNN
ORDER_CASES = [TARGET, PrefillCase(16384, 128, True), PrefillCase(2048, 64, True)]


def _inputs(case: PrefillCase):
    import torch

    from cute_kernels.attention_args import PrefillArgs

    dev, dt, b, d = "cuda", torch.bfloat16, case.batch, case.head_dim
    q = torch.randn(b * case.seqlen, case.heads, d, device=dev, dtype=dt)
    k = torch.randn(b * case.seqlen, case.kv_heads, d, device=dev, dtype=dt)
    v = torch.randn_like(k)
    cu = torch.arange(0, b * case.seqlen + 1, case.seqlen, device=dev, dtype=torch.int32)
    paged = {}
    if case.prefix:
        blocks = case.prefix // 16
        k_cache = torch.randn(b * blocks, 16, case.kv_heads, d, device=dev, dtype=dt)
        tables = torch.randperm(b * blocks, device=dev, dtype=torch.int32).view(b, blocks)
        paged = dict(k_cache=k_cache, v_cache=torch.randn_like(k_cache), block_tables=tables,
                     prefix_lens=torch.full((b,), case.prefix, device=dev, dtype=torch.int32))
    return PrefillArgs(q, k, v, cu, cu, d ** -0.5, case.causal, max_seqlen_q=case.seqlen, **paged)


def _sdpa_operands(case: PrefillCase, args):
    """[B, H, L, d] views for SDPA; keys [prefix ; new] gathered and KV heads expanded outside the timing."""
    import torch

    from cute_kernels.reference import gather_paged

    b, group = case.batch, case.heads // case.kv_heads

    def keys(new, cache):
        per_seq = new.view(b, case.seqlen, case.kv_heads, -1)
        if case.prefix:
            cached = torch.stack([gather_paged(cache, args.block_tables[i], case.prefix) for i in range(b)])
            per_seq = torch.cat([cached, per_seq], dim=1)
        return per_seq.repeat_interleave(group, 2).transpose(1, 2).contiguous()

    q = args.q.view(b, case.seqlen, case.heads, -1).transpose(1, 2)
    return q, keys(args.k, args.k_cache), keys(args.v, args.v_cache)


def _sdpa_ms(case: PrefillCase, q, k, v, backend) -> float | None:
    """SDPA on one backend, or None where it refuses these inputs."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    mask = causal_lower_right(q.shape[2], k.shape[2]) if case.causal and case.prefix else None
    causal = case.causal and not case.prefix
    try:
        with sdpa_kernel(backend):
            return time_ms(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal))
    except RuntimeError:
        return None


def bench_prefill_case(case: PrefillCase) -> dict:
    import torch
    from torch.nn.attention import SDPBackend

    from cute_kernels.hopper.prefill.prefill_host import prepare_prefill_args
    from cute_kernels.hopper.prefill.prefill_launch import launch_prefill
    from cute_kernels.toolchain.kernel_path import kernel_path

    args = _inputs(case)
    launch_args = prepare_prefill_args(args)
    cute_ms = time_ms(lambda: launch_prefill(launch_args))
    q, k, v = _sdpa_operands(case, args)
    tflops = lambda ms: round(case.flops() / ms / 1e9, 1) if ms else None  # noqa: E731
    cute = tflops(cute_ms)
    cudnn = tflops(_sdpa_ms(case, q, k, v, SDPBackend.CUDNN_ATTENTION))
    flash = tflops(_sdpa_ms(case, q, k, v, SDPBackend.FLASH_ATTENTION))
    peak = peak_tflops(torch.cuda.get_device_name())
    ratio = lambda other: round(cute / other, 2) if other else "n/a"  # noqa: E731
    return {"case": case.name, "path": kernel_path(), "cute_ms": round(cute_ms, 3), "cute_tflops": cute,
            "cudnn_tflops": cudnn or "n/a", "flash_tflops": flash or "n/a", "vs_cudnn": ratio(cudnn),
            "vs_flash": ratio(flash), "of_peak": round(cute / peak, 2) if peak else "n/a"}


def bench_tile_order(case: PrefillCase) -> dict:
    """Longest-first vs in-order tile lists for the persistent grid, same launch otherwise."""
    import dataclasses

    import torch

    from cute_kernels.hopper.prefill.prefill_host import prepare_prefill_args
    from cute_kernels.hopper.prefill.prefill_launch import launch_prefill

    longest_first = prepare_prefill_args(_inputs(case))
    in_order = dataclasses.replace(longest_first, tile_order=torch.sort(longest_first.tile_order).values)
    first_ms, order_ms = (time_ms(lambda a=a: launch_prefill(a)) for a in (longest_first, in_order))
    return {"case": f"tile order: {case.name}", "ctas": longest_first.num_ctas,
            "tiles": longest_first.tile_order.numel(), "longest_first_ms": round(first_ms, 3),
            "in_order_ms": round(order_ms, 3), "speedup": round(order_ms / first_ms, 3)}


def run_prefill(dry_run: bool) -> list[dict]:
    if dry_run:
        from cute_kernels.toolchain.kernel_path import kernel_path

        return [{"case": c.name, "path": kernel_path(), "gflop": round(c.flops() / 1e9, 1), "dry_run": True}
                for c in PREFILL_CASES] + [{"case": f"tile order: {c.name}", "dry_run": True} for c in ORDER_CASES]
    import torch

    rows = [{"device": torch.cuda.get_device_name(), "dense_bf16_peak_tflops": peak_tflops(torch.cuda.get_device_name())}]
    for case in PREFILL_CASES:
        try:
            rows.append(bench_prefill_case(case) | ({"target": ">=550 TFLOP/s, >=1.0x cudnn"} if case == TARGET else {}))
        except Exception as exc:  # one failing case must not hide the others
            rows.append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"[:200]})
    for case in ORDER_CASES:
        try:
            rows.append(bench_tile_order(case))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            rows.append({"case": f"tile order: {case.name}", "error": f"{type(exc).__name__}: {exc}"[:200]})
    return rows
