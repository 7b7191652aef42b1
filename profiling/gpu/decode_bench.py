"""`bench_kernels.py decode`: the cute paged decode kernel's achieved bandwidth, as a fraction of this
device's copy bandwidth measured in the same run (a large torch device-to-device copy), beside the
torch reference and, where importable, FlashInfer's paged decode and flash-attn's kvcache function
on the same cache.

Bytes counted are the ones a decode must move: every context token's K and V of every KV head once,
plus q and the output. A kernel that reads each K/V byte once at copy speed scores 1.0.

The e4m3 rows (E4M3_CASES) time the same kernel over the cache quantized to float8_e4m3fn (per-head
scales, amax / 448) beside the bf16 cache: K/V bytes per token, the bytes and time ratios against the
targets (>= 1.8x fewer bytes, >= 1.6x faster), the error against the bf16 kernel over the dequantized
bytes (the kernel's) and against the bf16 cache's output (what quantization costs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class DecodeCase:
    batch: int
    context: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def name(self) -> str:
        return f"b{self.batch} ctx{self.context} h{self.heads}:{self.kv_heads} d{self.head_dim}"

    def kv_bytes_per_token(self, kv_elem: int = 2) -> int:
        return 2 * self.kv_heads * self.head_dim * kv_elem

    def bytes_moved(self, elem: int = 2, kv_elem: int | None = None) -> int:
        kv = self.batch * self.context * self.kv_bytes_per_token(elem if kv_elem is None else kv_elem)
        return kv + 2 * self.batch * self.heads * self.head_dim * elem


DECODE_CASES = [
    DecodeCase(64, 4096, 32, 8, 128),  # the target: >= 80% of copy bandwidth
    DecodeCase(1, 32768, 32, 8, 128),  # one long sequence: all split-KV
    DecodeCase(8, 8192, 32, 8, 128),
    DecodeCase(256, 1024, 32, 8, 128),
    DecodeCase(64, 4096, 32, 8, 64),
    DecodeCase(32, 2048, 32, 32, 128),  # no GQA
]
E4M3_CASES = [
    DecodeCase(64, 4096, 64, 8, 128),  # the e4m3 target: b64, 4k context, GQA 8:1
    DecodeCase(64, 4096, 32, 8, 128),
]
E4M3_TARGETS = {"bytes": 1.8, "speed": 1.6}
COPY_BYTES = 1 << 31


def copy_bandwidth(time_ms: Callable) -> float:
    """GB/s of a 2 GiB device-to-device torch copy (read + write counted)."""
    import torch

    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src))
    return 2 * COPY_BYTES / ms / 1e6


def make_case(case: DecodeCase):
    """A shuffled paged cache holding every sequence's context, and one query token per sequence."""
    import torch

    from cute_kernels.attention_args import DecodeArgs

    g = torch.Generator(device="cuda").manual_seed(0)
    per_seq = -(-case.context // 16)
    num_blocks = case.batch * per_seq
    shape = (num_blocks, 16, case.kv_heads, case.head_dim)
    k_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
    v_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g)
    tables = torch.randperm(num_blocks, device="cuda", generator=g).view(case.batch, per_seq).int()
    lens = torch.full((case.batch,), case.context, dtype=torch.int32, device="cuda")
    q = torch.randn(case.batch, case.heads, case.head_dim, device="cuda", dtype=torch.bfloat16, generator=g)
    return DecodeArgs(q, k_cache, v_cache, tables, lens, case.head_dim ** -0.5)


def _flashinfer_ms(args, case: DecodeCase, time_ms: Callable) -> float | None:
    """FlashInfer's paged decode over the same cache (NHD pages of 16), when it is installed."""
    try:
        import flashinfer
    except ImportError:
        return None
    import torch

    per_seq = args.block_tables.shape[1]
    indptr = torch.arange(0, case.batch * per_seq + 1, per_seq, dtype=torch.int32, device="cuda")
    last = torch.full((case.batch,), (case.context - 1) % 16 + 1, dtype=torch.int32, device="cuda")
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), "NHD")
    wrapper.plan(indptr, args.block_tables.flatten(), last, case.heads, case.kv_heads, case.head_dim, 16,
                 q_data_type=torch.bfloat16)
    return time_ms(lambda: wrapper.run(args.q, (args.k_cache, args.v_cache)))


def _flash_attn_ms(args, time_ms: Callable) -> float | None:
    """flash-attn's flash_attn_with_kvcache over the same paged cache, when it is installed (FA2 wants
    pages of 256 tokens and refuses ours: the row then says so)."""
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return None
    q = args.q.unsqueeze(1)  # [batch, 1 new token, heads, d]
    return time_ms(lambda: flash_attn_with_kvcache(q, args.k_cache, args.v_cache, cache_seqlens=args.context_lens,
                                                   block_table=args.block_tables, softmax_scale=args.scale))


def _peer_columns(name: str, measure: Callable[[], float | None], gbs: Callable, cute_ms: float) -> dict:
    """A peer's GB/s and its time over ours, nothing when it is not installed, its error when it fails."""
    try:
        ms = measure()
    except Exception as exc:  # noqa: BLE001 - a peer's failure is reported, not fatal
        return {name: f"error {type(exc).__name__}"}
    return {} if ms is None else {f"{name}_GBs": round(gbs(ms)), f"vs_{name}": round(ms / cute_ms, 2)}


def bench_decode_case(case: DecodeCase, copy_gbs: float, time_ms: Callable) -> dict:

    from cute_kernels.hopper.decode.decode_host import prepare_decode_args
    from cute_kernels.hopper.decode.decode_launch import launch_decode
    from cute_kernels.reference import decode_attention_ref, plan_decode
    from cute_kernels.toolchain.kernel_path import kernel_path

    args = make_case(case)
    launch = prepare_decode_args(args)  # the per-step plan and buffers, outside the timed region
    cute_ms = time_ms(lambda: launch_decode(launch))
    ref_plan = plan_decode(args.block_tables, args.context_lens, 16)
    ref_args = type(args)(args.q, args.k_cache, args.v_cache, args.block_tables, args.context_lens, args.scale,
                          plan=ref_plan)
    torch_ms = time_ms(lambda: decode_attention_ref(ref_args), warmup=1, iters=3)
    err = ((launch.out.float() - decode_attention_ref(ref_args).float()).norm() / launch.out.float().norm()).item()
    gbs = lambda ms: case.bytes_moved() / ms / 1e6  # noqa: E731
    row = {"case": case.name, "path": kernel_path(), "splits": launch.num_splits, "cute_us": round(cute_ms * 1e3, 1),
           "cute_GBs": round(gbs(cute_ms)), "of_copy": round(gbs(cute_ms) / copy_gbs, 2),
           "torch_ref_GBs": round(gbs(torch_ms)), "vs_torch_ref": round(torch_ms / cute_ms, 1),
           "rel_err": f"{err:.1e}"}
    row |= _peer_columns("flashinfer", lambda: _flashinfer_ms(args, case, time_ms), gbs, cute_ms)
    row |= _peer_columns("flash_attn", lambda: _flash_attn_ms(args, time_ms), gbs, cute_ms)
    return row


def quantize_case(args):
    """The case's cache as float8_e4m3fn with per-(KV head) scales amax / 448, K and V apart."""
    from dataclasses import replace

    from cute_kernels.kv_e4m3 import E4M3_MAX, quantize_e4m3
    from cute_kernels.kv_quant import KVScales

    scales = [c.abs().amax(dim=(0, 1, 3)).float().clamp_min(1e-6) / E4M3_MAX for c in (args.k_cache, args.v_cache)]
    return replace(args, k_cache=quantize_e4m3(args.k_cache, scales[0]), v_cache=quantize_e4m3(args.v_cache, scales[1]),
                   kv_scales=KVScales(scales[0], scales[1]))


def bench_e4m3_case(case: DecodeCase, copy_gbs: float, time_ms: Callable) -> dict:
    """The kernel over an e4m3 cache vs the same kernel over the bf16 cache it was quantized from."""
    from dataclasses import replace

    import torch

    from cute_kernels.hopper.decode.decode_host import prepare_decode_args
    from cute_kernels.hopper.decode.decode_launch import launch_decode
    from cute_kernels.kv_e4m3 import dequantize_e4m3
    from cute_kernels.toolchain.kernel_path import kernel_path

    args = make_case(case)
    fp8 = quantize_case(args)
    bf16_launch, fp8_launch = prepare_decode_args(args), prepare_decode_args(fp8)
    bf16_ms = time_ms(lambda: launch_decode(bf16_launch))
    fp8_ms = time_ms(lambda: launch_decode(fp8_launch))
    # the kernel's own error: the bf16 kernel over the dequantized bytes (exact in bf16 up to the scale)
    dequant = replace(args, k_cache=dequantize_e4m3(fp8.k_cache, fp8.kv_scales.k, torch.bfloat16),
                      v_cache=dequantize_e4m3(fp8.v_cache, fp8.kv_scales.v, torch.bfloat16))
    dequant_launch = prepare_decode_args(dequant)
    launch_decode(dequant_launch)
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()  # noqa: E731
    bytes_ratio = case.kv_bytes_per_token(2) / case.kv_bytes_per_token(1)
    speedup = bf16_ms / fp8_ms
    gbs = case.bytes_moved(kv_elem=1) / fp8_ms / 1e6
    return {"case": f"{case.name} kv e4m3 vs bf16", "path": kernel_path(), "splits": fp8_launch.num_splits,
            "kv_bytes_per_token": case.kv_bytes_per_token(1), "bf16_kv_bytes_per_token": case.kv_bytes_per_token(2),
            "bytes_ratio": round(bytes_ratio, 2), "e4m3_us": round(fp8_ms * 1e3, 1), "bf16_us": round(bf16_ms * 1e3, 1),
            "speedup": round(speedup, 2), "e4m3_GBs": round(gbs), "of_copy": round(gbs / copy_gbs, 2),
            "err_vs_dequant": f"{rel(fp8_launch.out, dequant_launch.out):.1e}",
            "err_vs_bf16_cache": f"{rel(fp8_launch.out, bf16_launch.out):.1e}",
            "meets_target": bytes_ratio >= E4M3_TARGETS["bytes"] and speedup >= E4M3_TARGETS["speed"]}


def run_decode_bench(dry_run: bool, time_ms: Callable) -> list[dict]:
    from cute_kernels.hopper.decode.decode_spec import num_splits
    from cute_kernels.toolchain.kernel_path import kernel_path

    if dry_run:
        rows = [{"case": c.name, "path": kernel_path(), "splits": num_splits(c.batch, c.kv_heads, c.context),
                 "MB": round(c.bytes_moved() / 1e6, 1), "dry_run": True} for c in DECODE_CASES]
        return rows + [{"case": f"{c.name} kv e4m3 vs bf16", "MB": round(c.bytes_moved(kv_elem=1) / 1e6, 1),
                        "kv_bytes_per_token": c.kv_bytes_per_token(1), "dry_run": True} for c in E4M3_CASES]
    copy_gbs = copy_bandwidth(time_ms)
    rows = [{"case": "device copy (2 GiB)", "copy_GBs": round(copy_gbs)}]
    benches = [(bench_decode_case, c) for c in DECODE_CASES] + [(bench_e4m3_case, c) for c in E4M3_CASES]
    for bench, case in benches:
        try:
            rows.append(bench(case, copy_gbs, time_ms))
        except Exception as exc:  # one failing case must not hide the others
            rows.append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"[:200]})
    return rows
