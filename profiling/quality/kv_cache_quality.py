"""What holding the KV cache in fewer bits costs in quality: every --kv-cache-dtype the CPU reads, against
the bf16 cache, on the weights as shipped, in three cases:

- text: the shipped public-domain text (profiling/quality/data/declaration_1776.txt), teacher-forced in
  64-token chunks (each chunk attends over the cached, quantized prefix);
- long: that text three times over, so the cache holds 2k+ tokens when the last chunks read it (also
  scored alone: the positions past 2048);
- multi-turn: a four-turn chat about the text, the user turns prefilled, every assistant token decoded one
  step at a time (the fused decode step, where it runs), teacher-forced on the bf16 cache's own greedy
  replies.

    python profiling/quality/kv_cache_quality.py [--model PATH] [--json profiling/out/kv_cache_quality.json]
        [--smoke]

Per case and dtype: perplexity and its change against the bf16 cache (target: within 1%), and greedy
top-1 agreement with the bf16 cache at all positions and where the bf16 cache's top two logits lie more
than CLEAR_MARGIN apart. int8 and fp8_e4m3 run with calibrated scales (runtime/accel/kv_scales.py: the
engine's default without checkpoint scales); "fp8_e4m3 @1.0" with every scale 1.0, vLLM's default when a
checkpoint has none. The calibration text (runtime/spec/data/public_domain.txt) is not the scored text.
--smoke: a tiny random model and the text's bytes as token ids, in seconds (CI).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import torch  # noqa: E402

from profiling.common.report_files import OUT, make_parents  # noqa: E402
from profiling.common.workloads import TEXT  # noqa: E402
from profiling.quality.quant_quality import CLEAR_MARGIN  # noqa: E402
from runtime.accel.kv_scales import KVScaleSource, calibration_ids  # noqa: E402
from runtime.build import make_runner  # noqa: E402
from runtime.sequence import SeqChunk  # noqa: E402
from weights.checkpoint import kv_scale_names  # noqa: E402

PPL_TARGET = 0.01
BLOCK, CHUNK = 16, 64
LONG_COPIES, LONG_FROM = 3, 2048
REFERENCE = "bf16"
# label -> (cache dtype, every scale 1.0 instead of the calibrated ones)
CACHES = {"float32": (torch.float32, False), "bf16": (torch.bfloat16, False), "int8": (torch.int8, False),
          "fp8_e4m3": (torch.float8_e4m3fn, False), "fp8_e4m3 @1.0": (torch.float8_e4m3fn, True)}
QUESTIONS = ("Summarize this text in two sentences:\n\n{text}", "Which grievances does it list first?",
             "What does it say about the people's right to change their government?",
             "Rewrite its opening sentence in plain modern English.")
REPLY_TOKENS = 64


@dataclass
class Scores:
    """Per scored position: the log-probability of the next token, the greedy token, the top-two margin."""

    logprob: list[float] = field(default_factory=list)
    top1: list[int] = field(default_factory=list)
    margin: list[float] = field(default_factory=list)

    def add(self, logits: torch.Tensor, targets: list[int]) -> None:
        lp = logits.float().log_softmax(-1)
        top2 = logits.float().topk(2, dim=-1).values
        self.logprob += lp[torch.arange(len(targets)), torch.tensor(targets)].tolist()
        self.top1 += logits.argmax(-1).tolist()
        self.margin += (top2[:, 0] - top2[:, 1]).tolist()

    def since(self, start: int) -> "Scores":
        return Scores(self.logprob[start:], self.top1[start:], self.margin[start:])


def runner_for(cfg, tensors: dict, label: str, tokens: int, calibration: list[int]):
    dtype, unit_scales = CACHES[label]
    tensors = dict(tensors)
    if unit_scales:  # a checkpoint that carries scales of 1.0
        tensors.update({name: torch.ones(()) for n in range(cfg.num_layers) for name in kv_scale_names(n)})
    blocks = math.ceil(tokens / BLOCK) + 1
    budget = blocks * BLOCK * 2 * cfg.num_kv_heads * cfg.head_dim * 4 * cfg.num_layers
    runner, _ = make_runner(cfg, tensors, budget, BLOCK, kv_dtype=dtype, kv_scale_source=KVScaleSource(calibration))
    return runner, list(range(blocks))


def teacher_forced(runner, table: list[int], ids: list[int]) -> Scores:
    """Every position's next-token scores, CHUNK tokens per step over the cached prefix."""
    scores = Scores()
    for at in range(0, len(ids) - 1, CHUNK):
        chunk = ids[at:at + CHUNK]
        logits = runner.run([SeqChunk(chunk, at, table, num_logits=len(chunk))])
        targets = ids[at + 1:at + 1 + len(chunk)]
        scores.add(logits[:len(targets)], targets)
    return scores


def conversation(runner, table: list[int], tok, text: str, replies: list[list[int]] | None,
                 reply_tokens: int = REPLY_TOKENS) -> tuple[Scores, list]:
    """The multi-turn chat: each user turn prefilled, then up to reply_tokens assistant tokens one decode step
    each, the token fed back being replies[turn][i] when given (teacher forcing), else the greedy one.
    (scores of the assistant tokens, the replies)."""
    messages, cached, scores, out = [], [], Scores(), []
    for turn, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question.format(text=text)})
        ids = tok.encode_chat(messages)
        keep = next((i for i, (a, b) in enumerate(zip(cached, ids)) if a != b), min(len(cached), len(ids)))
        logits = runner.run([SeqChunk(ids[keep:], keep, table)])
        cached, reply = ids, []
        forced = replies[turn] if replies is not None else None
        while len(reply) < (len(forced) if forced is not None else reply_tokens):
            token = forced[len(reply)] if forced is not None else int(logits[0].argmax())
            scores.add(logits, [token])
            reply.append(token)
            if token in tok.eos_token_ids:
                break
            logits = runner.run([SeqChunk([token], len(cached), table)])
            cached = cached + [token]
        out.append(reply)
        messages.append({"role": "assistant", "content": tok.decode(reply, skip_special_tokens=True)})
    return scores, out


def compare(scores: Scores, ref: Scores) -> dict:
    n = len(ref.logprob)
    ppl = math.exp(-sum(scores.logprob) / n)
    agree = [a == b for a, b in zip(scores.top1, ref.top1)]
    clear = [a for a, m in zip(agree, ref.margin) if m > CLEAR_MARGIN]
    return {"positions": n, "perplexity": ppl, "top1_agreement": sum(agree) / n,
            "top1_agreement_clear": sum(clear) / max(len(clear), 1), "clear_positions": len(clear)}


def load(args):
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()
    if args.smoke:
        from tests.tiny_engine import byte_tokenizer, tiny_weights  # the unit tests' tiny random model

        cfg, tensors = tiny_weights()
        tok = byte_tokenizer()
        return cfg, tensors, tok, "tiny random llama", text[:100]
    from runtime.load import load_model

    cfg, tensors, tok, path = load_model(args.model)
    return cfg, tensors, tok, path, text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: SmolLM2-135M-Instruct")
    ap.add_argument("--json", default=os.path.join(OUT, "kv_cache_quality.json"))
    ap.add_argument("--smoke", action="store_true", help="seconds: a tiny random model")
    args = ap.parse_args()
    cfg, tensors, tok, path, text = load(args)
    ids = tok.encode(text)
    long_ids = (ids * LONG_COPIES)[:cfg.max_position_embeddings]
    long_from = LONG_FROM if len(long_ids) > LONG_FROM + CHUNK else len(long_ids) // 2  # the smoke model's is short
    calibration = calibration_ids(tok.encode)
    print(f"{os.path.basename(path)}; text: {len(ids)} tokens of {os.path.basename(TEXT)}; long: {len(long_ids)} "
          f"tokens (scored alone past {long_from}); multi-turn: {len(QUESTIONS)} turns of up to {REPLY_TOKENS} "
          f"decoded tokens; torch threads {torch.get_num_threads()}")
    results: dict[str, dict[str, Scores]] = {}
    replies = None
    for label in [REFERENCE, *(c for c in CACHES if c != REFERENCE)]:
        runner, table = runner_for(cfg, tensors, label, len(long_ids) + 2 * CHUNK, calibration)
        chat, got = conversation(runner, table, tok, text[:1200], replies, 8 if args.smoke else REPLY_TOKENS)
        replies = replies or got
        long = teacher_forced(runner, table, long_ids)
        results[label] = {"text": teacher_forced(runner, table, ids), "long": long,
                          f"long past {long_from}": long.since(long_from - 1), "multi-turn": chat}
    report = {"model": path, "reference": REFERENCE, "clear_margin": CLEAR_MARGIN, "cases": {}}
    print(f"{'case':<16}{'KV cache':<15}{'perplexity':>11}{'vs bf16':>9}{'top-1 = bf16':>14}{'(clear)':>9}   target "
          f"(ppl within {PPL_TARGET:.0%})")
    for case in results[REFERENCE]:
        ref = results[REFERENCE][case]
        base = compare(ref, ref)["perplexity"]
        report["cases"][case] = {}
        for label in CACHES:
            row = report["cases"][case][label] = scored_row(results[label][case], ref, base)
            verdict = "" if label == REFERENCE else ("met" if abs(row["ppl_change"]) <= PPL_TARGET else "MISSED")
            print_row(case, label, row, 15, f"   {verdict}")
    write_report(args.json, report)


def scored_row(scores: Scores, ref: Scores, base: float) -> dict:
    """compare's row and its perplexity change against base (the reference's)."""
    row = compare(scores, ref)
    row["ppl_change"] = row["perplexity"] / base - 1
    return row


def print_row(case: str, label: str, row: dict, width: int, tail: str = "") -> None:
    print(f"{case:<16}{label:<{width}}{row['perplexity']:>11.3f}{row['ppl_change']:>+9.2%}"
          f"{row['top1_agreement']:>14.1%}{row['top1_agreement_clear']:>9.1%}{tail}")


def write_report(path: str, report: dict) -> None:
    make_parents(path)
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
