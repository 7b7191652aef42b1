"""What holding the weights quantized costs in quality, on a shipped public-domain text
(profiling/quality/data/declaration_1776.txt): every way to hold them that this device can run, against the
float path on the same weights.

    python profiling/quality/quant_quality.py [--model PATH] [--positions 512] [--llama-cpp-python PY]
        [--json profiling/out/quant_quality.json] [--smoke]

Paths: float (--quantization none), the GGUF's blocks as shipped (the default, for a GGUF) with the
float32 KV cache and with --kv-cache-dtype bf16 ("+ bf16 KV"; also its top-1 agreement with as shipped),
and each mode of runtime.accel.quantization.QUANTIZATION_MODES the device runs (a mode added there is
picked up here). Per path, over the text's first --positions tokens, teacher-forced in steps of 64 tokens
(so the quantized linears run their decode path, int8 activations, throughout): perplexity of the next
tokens, its change against the float path (target: within 2%), and top-1 agreement with the float
path (the next token greedy decoding would pick). With llama-cpp-python (importable here, or in the
Python given by --llama-cpp-python), also the top-1 agreement of the as-shipped path with llama.cpp's
own logits on the same token ids (target: >= 99%; both compute on the same quantized values).
--smoke: a tiny random Q4_1 GGUF and the text's bytes as token ids, in seconds (CI).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from cute_kernels.cpu import quant_gemm  # noqa: E402
from profiling.common.executable_arg import executable  # noqa: E402
from profiling.common.report_files import OUT, make_parents  # noqa: E402
from profiling.common.workloads import TEXT  # noqa: E402
from runtime.accel.quantization import unavailable_reason  # noqa: E402
from runtime.build import make_runner  # noqa: E402
from runtime.engine_config import FLOAT_MODE, QUANTIZATION_MODES  # noqa: E402
from runtime.sequence import SeqChunk  # noqa: E402
from weights.quantized import QuantizedTensor  # noqa: E402

PPL_TARGET, LLAMA_CPP_TARGET = 0.02, 0.99
BLOCK = 16
# tokens per step: under quant_gemm.AMX_MIN_ROWS and DEQUANT_MIN_ROWS, so every host takes the int8 paths
CHUNK = min(64, quant_gemm.AMX_MIN_ROWS - 1, quant_gemm.DEQUANT_MIN_ROWS - 1)
# top-1 agreement is also reported where the reference's top two logits lie further apart than this: a near tie
# flips with any change in the order of float32 sums (llama.cpp against itself with flash attention: 93.4% at
# all 512 positions, 99.5% at the 393 clear ones; profiling/quality/llama_cpp_emulation.py)
CLEAR_MARGIN = 0.5

# Runs in llama-cpp-python's interpreter: argv model, ids json, out .npy, Llama options json -> all positions'
# logits.
LLAMA_CPP_LOGITS = """
import json, sys
import numpy as np
from llama_cpp import Llama
ids = json.loads(open(sys.argv[2]).read())
options = dict(n_ctx=max(512, len(ids) + 8), n_threads=2, logits_all=True, verbose=False)
llm = Llama(model_path=sys.argv[1], **{**options, **json.loads(sys.argv[4])})
llm.eval(ids)
np.save(sys.argv[3], np.array(llm.scores[:len(ids)], dtype=np.float32))
"""


BF16_KV = "as shipped + bf16 KV"
BF16_WEIGHTS = "bf16 weights"  # --dtype bfloat16 on the CPU: float weights held in bf16 (runtime/accel/bf16_linear.py)


def paths(tensors: dict, device: torch.device) -> list[tuple[str, str | None, torch.dtype | None]]:
    """(label, --quantization value, KV cache dtype) for every path to measure, the float one first."""
    out = [("float", FLOAT_MODE, None)]
    if any(isinstance(t, QuantizedTensor) for t in tensors.values()):
        out += [("as shipped", None, None), (BF16_KV, None, torch.bfloat16)]
    bf16 = [(BF16_WEIGHTS, FLOAT_MODE, None)] if device.type == "cpu" else []
    return out + bf16 + [(m, m, None) for m in QUANTIZATION_MODES if unavailable_reason(m, device) is None]


def all_logits(cfg, tensors: dict, quantization: str | None, ids: list[int], edit=None,
               kv_dtype: torch.dtype | None = None, weight_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Every position's logits, fed CHUNK tokens per step: below the quantized linear's AMX_MIN_ROWS
    and DEQUANT_MIN_ROWS, so each product takes its decode path (int8 activations), the one that differs
    most from float; a long prefill would take the AMX or dequantized-weight path (bf16/fp32) instead. edit(model), when
    given, changes the built model before it runs (profiling/quality/fp8_quality_sweep.py swaps linears); kv_dtype:
    the KV cache's (None: float32), read by the chunks' prefill attention over the cached prefix."""
    blocks = math.ceil(len(ids) / BLOCK)
    budget = blocks * BLOCK * 2 * cfg.num_kv_heads * cfg.head_dim * 4 * cfg.num_layers
    runner, _ = make_runner(cfg, dict(tensors), budget, BLOCK, quantization=quantization, kv_dtype=kv_dtype,
                            weight_dtype=weight_dtype)
    if edit is not None:
        edit(runner.model)
    table = list(range(blocks))
    return torch.cat([runner.run([SeqChunk(ids[at:at + CHUNK], at, table, num_logits=len(ids[at:at + CHUNK]))])
                      for at in range(0, len(ids), CHUNK)])


def top1_agreement(logits: torch.Tensor, reference: torch.Tensor, margin: float = 0.0) -> float:
    """Share of positions whose greedy token is the reference's, over those where the reference's top two
    logits lie more than margin apart (all positions at margin 0)."""
    top2 = reference.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1] > margin) | (margin <= 0)
    return (logits.argmax(-1) == reference.argmax(-1))[clear].float().mean().item()


def perplexity(logits: torch.Tensor, ids: list[int]) -> float:
    return math.exp(F.cross_entropy(logits[:-1].float(), torch.tensor(ids[1:])).item())


def llama_cpp_logits(python: str, model_path: str, ids: list[int], **options) -> np.ndarray:
    """options: more keyword arguments of llama_cpp.Llama (e.g. flash_attn=True); none: its defaults."""
    with tempfile.TemporaryDirectory() as tmp:
        ids_file, out = os.path.join(tmp, "ids.json"), os.path.join(tmp, "logits.npy")
        with open(ids_file, "w") as f:
            json.dump(ids, f)
        subprocess.run([python, "-c", LLAMA_CPP_LOGITS, model_path, ids_file, out, json.dumps(options)],
                       check=True)
        return np.load(out)


def load(args) -> tuple:
    """(config, tensors, token ids of the text, model path or None)."""
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    if args.smoke:
        from tests.model_files import write_tiny_gguf  # the unit tests' tiny random model

        path = os.path.join(tempfile.mkdtemp(), "tiny-q4_1.gguf")
        write_tiny_gguf(path, qtype="Q4_1")
        from weights.load import load_checkpoint

        ck = load_checkpoint(path, keep_quantized=True)
        return ck.config, ck.tensors, list(text.encode()[:args.positions]), path
    from runtime.load import load_model

    cfg, tensors, tok, path = load_model(args.model)
    ids = tok.encode(text)[:args.positions]
    return cfg, tensors, ids, path


def llama_cpp_python(args) -> str | None:
    if args.llama_cpp_python:
        return args.llama_cpp_python
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return None
    return sys.executable


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--positions", type=int, default=512, help="tokens of the text to score (default: 512)")
    ap.add_argument("--llama-cpp-python", type=executable, default=None, help="a Python with llama-cpp-python (default: this one, "
                    "when it imports llama_cpp)")
    ap.add_argument("--json", default=os.path.join(OUT, "quant_quality.json"))
    ap.add_argument("--smoke", action="store_true", help="seconds: a tiny random Q4_1 GGUF")
    args = ap.parse_args()
    torch.manual_seed(0)
    cfg, tensors, ids, path = load(args)
    print(f"{os.path.basename(path)}; {len(ids)} positions of {os.path.basename(TEXT)} in {CHUNK}-token steps (the "
          f"int8-activation path); torch threads: {torch.get_num_threads()}")
    logits = {label: all_logits(cfg, tensors, q, ids, kv_dtype=kv,
                                weight_dtype=torch.bfloat16 if label == BF16_WEIGHTS else None)
              for label, q, kv in paths(tensors, torch.device("cpu"))}
    base = logits["float"]
    base_ppl = perplexity(base, ids)
    rows = []
    print(f"{'path':<22}{'perplexity':>11}{'vs float':>10}{'top-1 = float':>15}   target (ppl within {PPL_TARGET:.0%})")
    for label, lg in logits.items():
        ppl = perplexity(lg, ids)
        change, agree = ppl / base_ppl - 1, top1_agreement(lg, base)
        rows.append({"path": label, "perplexity": ppl, "ppl_change": change, "top1_agreement_vs_float": agree})
        ok = "" if label == "float" else ("met" if abs(change) <= PPL_TARGET else "MISSED")
        print(f"{label:<22}{ppl:>11.3f}{change:>+10.2%}{agree:>15.1%}   {ok}")
    report = {"model": path, "positions": len(ids), "text": os.path.basename(TEXT), "paths": rows}
    if BF16_KV in logits:
        agree, clear = (top1_agreement(logits[BF16_KV], logits["as shipped"], m) for m in (0.0, CLEAR_MARGIN))
        report.update(bf16_kv_top1_agreement_vs_as_shipped=agree, bf16_kv_top1_agreement_vs_as_shipped_clear=clear)
        print(f"{BF16_KV} vs as shipped: top-1 agreement {agree:.1%}, {clear:.1%} where as shipped's top two "
              f"logits lie more than {CLEAR_MARGIN} apart")
    python = llama_cpp_python(args)
    why_not = ("the smoke model is not a file llama.cpp loads (no tokenizer)" if args.smoke
               else "no quantized GGUF weights" if "as shipped" not in logits
               else "llama-cpp-python not importable; pass --llama-cpp-python" if python is None else None)
    if why_not is None:
        try:
            theirs = torch.from_numpy(llama_cpp_logits(python, path, ids))
        except subprocess.CalledProcessError as exc:
            why_not = f"llama.cpp's run failed with exit status {exc.returncode}"
    if why_not is not None:
        print(f"llama.cpp: not compared ({why_not})")
    else:
        agree, clear = (top1_agreement(logits["as shipped"], theirs, m) for m in (0.0, CLEAR_MARGIN))
        # how far llama.cpp itself is from the float path: the noise floor of this comparison
        theirs_vs_float = top1_agreement(base, theirs)
        report.update(llama_cpp_top1_agreement=agree, llama_cpp_top1_agreement_clear=clear,
                      llama_cpp_top1_agreement_vs_float=theirs_vs_float, llama_cpp_perplexity=perplexity(theirs, ids))
        print(f"as shipped vs llama.cpp logits: top-1 agreement {agree:.1%} (target >= {LLAMA_CPP_TARGET:.0%}: "
              f"{'met' if agree >= LLAMA_CPP_TARGET else 'MISSED'}), {clear:.1%} where llama.cpp's top two logits lie "
              f"more than {CLEAR_MARGIN} apart; llama.cpp vs float {theirs_vs_float:.1%}, "
              f"llama.cpp perplexity {report['llama_cpp_perplexity']:.3f}")
    make_parents(args.json)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
