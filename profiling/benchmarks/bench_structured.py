"""Structured-output cost: decode tok/s at batch 1 and batch N, free vs. constrained by a JSON schema,
in the same run over the same engine.

    python profiling/benchmarks/bench_structured.py [--model PATH] [--batch 1,32] [--max-tokens 64] [--device cpu]
    python profiling/benchmarks/bench_structured.py --adversarial [--requests 96] [--rounds 3] [--concurrency 4]
        [--hostile 2] [--kinds "1.3 MB schema,ambiguous grammar"]

The schema asks for a long array of small objects so the grammar never ends before max_tokens; the
free run uses ignore_eos to the same length. Prints tok/s per case and constrained/free ratios, and
the share of the sampling stage (where masks are filled and applied: not overlapped with the forward).
--adversarial: plain requests' TTFT/TPOT p99 on a real server, idle and while hostile grammars and
schemas are sent alongside, in turn for --rounds rounds (profiling/common/adversarial.py), and their
ratios per round and over all rounds; --kinds picks some of the hostile kinds (to find which one costs).
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from profiling.common import adversarial  # noqa: E402
from runtime.llm import LLM  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402
from structured import StructuredOutput  # noqa: E402

SCHEMA = {"type": "array", "minItems": 200, "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                     "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}}},
    "required": ["name", "age", "tags"], "additionalProperties": False}}
PROMPT = [{"role": "user", "content": "List people as JSON objects with name, age and tags."}]


def run(llm: LLM, batch: int, max_tokens: int, structured: bool) -> tuple[float, float]:
    """(generated tok/s, sampling share of the step time)."""
    ids = llm.engine.limits.encode_chat(PROMPT)
    p = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=not structured,
                       structured=StructuredOutput.json_schema(SCHEMA) if structured else None)
    llm.engine.reset_stats()
    t0 = time.perf_counter()
    outs = llm.generate([ids] * batch, p, use_tqdm=False)
    dt = time.perf_counter() - t0
    tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
    t = llm.engine.stats.times
    return tokens / dt, t.sample / max(1e-9, t.prepare + t.forward + t.sample + t.output)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--adversarial", action="store_true", help="plain requests beside hostile grammars, on a server")
    ap.add_argument("--requests", type=int, default=96, help="--adversarial: plain requests per run")
    ap.add_argument("--rounds", type=int, default=3, help="--adversarial: idle and hostile runs, in turn")
    ap.add_argument("--kinds", default=None, help="--adversarial: the hostile kinds to send, comma-separated "
                    f"(default: all of {', '.join(adversarial.HOSTILE)})")
    ap.add_argument("--concurrency", type=int, default=4, help="--adversarial: plain requests at once")
    ap.add_argument("--hostile", type=int, default=2, help="--adversarial: hostile clients sending at once")
    ap.add_argument("--server-args", default="", help="--adversarial: more flags for the server, one string "
                    "(e.g. \"--grammar-compile-cpu-share 1\": the compile workers uncapped)")
    args = ap.parse_args()
    if args.adversarial:
        kinds = [k.strip() for k in args.kinds.split(",")] if args.kinds else None
        unknown = sorted(set(kinds or ()) - set(adversarial.HOSTILE))
        if unknown:
            ap.error(f"--kinds: unknown {', '.join(unknown)}; choose from {', '.join(adversarial.HOSTILE)}")
        adversarial.main(args.model, args.requests, args.concurrency, args.max_tokens, args.hostile, args.rounds,
                         kinds, shlex.split(args.server_args))
        return
    # no prefix caching: the second run of each pair would skip the prefill the first one paid for
    llm = LLM(args.model, device=args.device, max_num_seqs=256, enable_prefix_caching=False)
    run(llm, 1, 8, False), run(llm, 1, 8, True)  # warm-up: first forwards, the schema compiled
    for batch in (int(b) for b in args.batch.split(",")):
        free, free_share = run(llm, batch, args.max_tokens, False)
        con, con_share = run(llm, batch, args.max_tokens, True)
        print(f"batch {batch:3d}: free {free:8.1f} tok/s (sampling {free_share:5.1%})   json schema {con:8.1f} tok/s "
              f"(sampling {con_share:5.1%})   ratio {con / free:.3f}", flush=True)


if __name__ == "__main__":
    main()
