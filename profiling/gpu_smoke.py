"""The GPU suite's first minute: is this an sm_90 device, do the kernels load (AOT library or JIT), and
does one small launch of each attention kernel and of each fused elementwise op match the torch reference? Exit 0 only if all hold, so
a broken toolchain costs a minute of GPU time instead of the whole suite. `--dry-run`: list the checks."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHECKS = ("device is sm_90", "kernels load", "prefill matches the reference", "decode (2 splits + merge) matches",
          "fused norm/rope/silu/KV write match", "fp8 quantize + GEMM match")


def _rel(got, want) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def smoke() -> list[tuple[str, bool, str]]:
    import torch

    from cute_kernels.attention_args import DecodeArgs, PrefillArgs
    from cute_kernels.hopper.decode_host import decode_attention
    from cute_kernels.hopper.prefill_launch import prefill_attention
    from cute_kernels.reference import decode_attention_ref, prefill_attention_ref
    from cute_kernels.toolchain.kernel_path import kernel_path, kernels_unavailable_reason

    cap = torch.cuda.get_device_capability()
    results = [(CHECKS[0], cap == (9, 0), f"{torch.cuda.get_device_name()} sm_{cap[0]}{cap[1]}")]
    reason = kernels_unavailable_reason()
    results.append((CHECKS[1], reason is None, reason or kernel_path()))
    if reason is not None:
        return results
    g = torch.Generator(device="cuda").manual_seed(0)
    rnd = lambda *s: torch.randn(*s, device="cuda", generator=g).bfloat16()  # noqa: E731
    q, k, v = rnd(40, 8, 128), rnd(40, 2, 128), rnd(40, 2, 128)
    cu = torch.tensor([0, 17, 40], dtype=torch.int32, device="cuda")
    pre = PrefillArgs(q, k, v, cu, cu, 128 ** -0.5, max_seqlen_q=23)
    err = _rel(prefill_attention(pre), prefill_attention_ref(PrefillArgs(q.float(), k.float(), v.float(), cu, cu,
                                                                         128 ** -0.5)))
    results.append((CHECKS[2], err < 1e-2, f"relative error {err:.1e}"))
    kc, vc = rnd(20, 16, 2, 128), rnd(20, 16, 2, 128)
    tables = torch.randperm(20, device="cuda", generator=g).view(2, 10).int()
    dec = DecodeArgs(rnd(2, 8, 128), kc, vc, tables, torch.tensor([150, 33], dtype=torch.int32, device="cuda"),
                     128 ** -0.5)
    err = _rel(decode_attention(dec, splits=2), decode_attention_ref(DecodeArgs(
        dec.q.float(), kc.float(), vc.float(), tables, dec.context_lens, dec.scale)))
    results.append((CHECKS[3], err < 1e-2, f"relative error {err:.1e}"))
    err = _fused_error(rnd)
    results.append((CHECKS[4], err < 1e-2, f"worst relative error {err:.1e}"))
    results.append(_fp8_check(rnd))
    return results


def _fused_error(rnd) -> float:
    """Worst relative error of one small launch of each fused op (inf when the KV write misses a slot)."""
    import torch

    from cute_kernels import reference
    from cute_kernels.hopper import fused_ops as ops

    x, res, w = rnd(3, 4096), rnd(3, 4096), rnd(4096).abs()
    errs = [_rel(ops.add_rms_norm(x, res, w, 1e-5)[0], reference.add_rms_norm_ref(x.float(), res.float(), w.float(),
                                                                                  1e-5)[0])]
    gate_up = rnd(3, 2048)
    errs.append(_rel(ops.silu_and_mul(gate_up), reference.silu_and_mul_ref(gate_up.float())))
    qk, cos, sin = rnd(3, 10, 128), rnd(3, 1, 64).float(), rnd(3, 1, 64).float()
    want = reference.rope_ref(qk.float(), cos, sin)
    errs.append(_rel(ops.rope_(qk, cos, sin), want))
    kv, cache = rnd(3, 2, 128), torch.zeros(2, 16, 2, 128, device="cuda", dtype=torch.bfloat16)
    ops.write_kv(kv, kv, cache, cache, torch.tensor([3, -1, 20], device="cuda"))
    errs.append(0.0 if torch.equal(cache.view(-1, 2, 128)[[3, 20]], kv[[0, 2]]) else float("inf"))
    return max(errs)


def _fp8_check(rnd) -> tuple[str, bool, str]:
    """Per-token quantization kernel (bit-equal to torch's) feeding the rowwise FP8 GEMM, unsplit and
    split-K (two splits of K=256's two k-tiles)."""
    import torch

    from cute_kernels.fp8_quant import quantize_rowwise
    from cute_kernels.hopper.fp8_gemm_launch import fp8_gemm, fp8_kernels_unavailable_reason, quantize_rows
    from cute_kernels.reference import fp8_gemm_ref

    reason = fp8_kernels_unavailable_reason()
    if reason is not None:
        return CHECKS[5], False, reason
    x, w = rnd(5, 256), rnd(128, 256)
    (a, sa), (b, sb) = quantize_rows(x), quantize_rowwise(w)
    same = a.view(torch.uint8).equal(quantize_rowwise(x)[0].view(torch.uint8))
    ref = fp8_gemm_ref(a, b, sa, sb, out_dtype=torch.float32)
    err, split_err = _rel(fp8_gemm(a, b, sa, sb), ref), _rel(fp8_gemm(a, b, sa, sb, splits=2), ref)
    return (CHECKS[5], same and max(err, split_err) < 1e-2,
            f"quantizer bit-equal: {same}; GEMM relative error {err:.1e}, split-K {split_err:.1e}")


def main(argv: list[str]) -> int:
    if "--dry-run" in argv:  # the modules the smoke needs import here too (no CUDA needed)
        import cute_kernels.hopper.decode_host  # noqa: E401, F401
        import cute_kernels.hopper.decode_launch
        import cute_kernels.hopper.fp8_gemm_launch  # noqa: E401, F401
        import cute_kernels.hopper.fused_ops
        import cute_kernels.hopper.prefill_launch  # noqa: F401
        print("smoke checks: " + "; ".join(CHECKS))
        return 0
    try:
        results = smoke()
    except Exception as exc:  # a crash is a failed smoke, reported in one line
        results = [("smoke", False, f"{type(exc).__name__}: {exc}"[:300])]
    for name, ok, detail in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    return 0 if all(ok for _, ok, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
