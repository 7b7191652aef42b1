"""Speculative decoding on the default model, off against on, in one run (each pair alternated, --reps times):

 chat      held-out chat prompts (none of runtime/spec/prompts.py's topics), T=0 and T=0.7: the trained heads
           (--speculative medusa and eagle) against no speculation; greedy output is compared (identical by
           contract under --deterministic; without it, on CPUs with AMX a step of 32 rows or more takes the
           AMX tiles, which round otherwise than the int8 routes, so batch 8's verify steps may differ);
 T=1       the same prompts at temperature 1: what speculation costs where it does not pay (the per-request
           throttle turns it down; target >= 0.95x of off);
 agentic   copy-heavy traffic: a tool call's JSON echoed back with one field changed, a code edit returning
           the whole file, a typo fix repeating a paragraph, and each request sent twice (repeated structured
           answers): suffix decoding against today's n-gram proposer (target >= 1.3x) and against off.

at batch 1 (one request at a time) and batch 8 (the prompts together). Output tok/s = generated tokens /
wall time of the generate call; per proposer the acceptance by draft position and the mean accepted length.
`line`: the acceptance a draft needed to pay for its verify row at that batch, from the step times the
throttle's clock measured during the run (runtime/spec/step_clock.py; - where it timed too few steps).
Each proposer keeps one clock through the run (a server's engine keeps one for its life), and before each
batch size one untimed pass of the chat prompts per proposer lets it time that batch's steps.

    python profiling/benchmarks/bench_spec.py [--max-tokens 96] [--reps 2] [--batches 1,8] [--json out.json] [--smoke]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from runtime.build import build_engine, heads_proposer  # noqa: E402
from runtime.engine_config import EngineConfig  # noqa: E402
from runtime.llm import LLM  # noqa: E402
from runtime.load import load_model  # noqa: E402
from runtime.sampling_params import SamplingParams  # noqa: E402
from runtime.spec.hidden_tap import HiddenTap  # noqa: E402
from runtime.spec.ngram import NgramProposer  # noqa: E402
from runtime.spec.step_clock import StepClock  # noqa: E402
from runtime.spec.suffix import SuffixProposer  # noqa: E402
from runtime.spec.throttle import Throttle  # noqa: E402

CHAT = ["Tell me a short story about a dragon who learns to cook.", "What are three fun facts about octopuses?",
        "Explain how a refrigerator keeps food cold.", "Write a short poem about autumn leaves.",
        "Give me tips for learning to play the guitar.", "Describe a day in the life of a lighthouse keeper.",
        "Why is the sky blue?", "Write a thank-you note to a teacher."]
CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
'''
TOOL = ('{"tool": "search_flights", "arguments": {"from": "SFO", "to": "JFK", "date": "2024-05-01", '
        '"passengers": 2, "cabin": "economy"}, "status": "pending"}')
PARAGRAPH = ("The lighthouse keeper climbed the stairs every evening to light the lamp. He had done this for "
             "thirty years, and he never mised a single night, even during the worst storms of the winter.")
COPY_TASKS = [f"Repeat this code exactly, but rename the variable subtotal to base:\n\n{CODE}",
              f"Fix the typo in this paragraph and repeat the whole paragraph:\n\n{PARAGRAPH}"]  # the ladder's too
AGENTIC = [f"Here is a tool call: {TOOL}\nReturn exactly the same JSON with status set to \"done\".", *COPY_TASKS,
           "List the planets of the solar system as a JSON array of objects with name and order."]


def measure(llm: LLM, prompts: list[list[int]], params: SamplingParams, batch: int) -> dict:
    """Output tok/s over the prompts, `batch` at a time; the tokens; the proposer's acceptance."""
    engine = llm.engine
    engine.reset_stats()
    tokens, t0 = [], time.perf_counter()
    for i in range(0, len(prompts), batch):
        outs = llm.generate(prompts[i:i + batch], params, use_tqdm=False)
        tokens += [o.outputs[0].token_ids for o in outs]
    seconds = time.perf_counter() - t0
    s = engine.stats
    return {"tok_s": sum(map(len, tokens)) / seconds, "tokens": tokens, "acceptance": s.spec_acceptance_rate,
            "by_position": s.spec_acceptance_by_pos, "accepted_per_step": s.spec_mean_accepted_len}


def proposers(engine, model_cfg, tap: HiddenTap, heads: dict[str, str]) -> dict:
    """Fresh proposers by name (a suffix proposer's response cache starts empty each time). Each name's
    throttles share one step clock for the whole run, as a server's engine keeps one: step times belong to
    the engine, and a clock started afresh for every 64-token run priced its first steps' drafts by the
    row-cost model alone, which at batch 8 drafts where the measured line (~1) says nothing pays."""
    clocks = collections.defaultdict(StepClock)
    made = {"ngram": lambda: Throttle(NgramProposer(1, 4), clock=clocks["ngram"]),
            "suffix": lambda: Throttle(SuffixProposer(), clock=clocks["suffix"])}
    for kind, path in heads.items():
        config = EngineConfig(speculative=kind, speculative_model=path or None)
        head = heads_proposer(config, model_cfg, engine.model_runner, tap)
        made[kind] = lambda head=head, kind=kind: Throttle(head, clock=clocks[kind])
    return made


def compare(llm, make, prompts, params, batch, names, reps) -> list[dict]:
    """Each name against off, alternated reps times; medians of the tok/s, the ratio of the medians."""
    runs = {name: [] for name in ["off", *names]}
    for _ in range(reps):
        for name in runs:
            llm.engine.set_proposer(None if name == "off" else make[name]())
            runs[name].append(measure(llm, prompts, params, batch))
            if name != "off":  # the acceptance a draft needed to pay for its row, from this run's step times
                runs[name][-1]["line"] = llm.engine.proposer.clock.row_line(batch)
    off = statistics.median(r["tok_s"] for r in runs["off"])
    rows = []
    for name in names:
        r, tok_s = runs[name][-1], statistics.median(x["tok_s"] for x in runs[name])
        same = r["tokens"] == runs["off"][-1]["tokens"] if params.greedy else None
        rows.append({"proposer": name, "off_tok_s": off, "on_tok_s": tok_s, "speedup": tok_s / off,
                     "acceptance": r["acceptance"], "by_position": r["by_position"],
                     "accepted_per_step": r["accepted_per_step"], "identical": same, "line": r["line"]})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--medusa", default="", help="Medusa heads (default: the default model's)")
    ap.add_argument("--eagle", default="", help="EAGLE-style head (default: the default model's)")
    ap.add_argument("--heads", default="medusa,eagle", help="which trained heads to measure")
    ap.add_argument("--num-speculative-tokens", type=int, default=8,
                    help="the most drafts a step, k (the heads have 4; vLLM gives suffix decoding its tree depth, 24)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true", help="2 prompts, 8 tokens, batch 2, one rep (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.max_tokens, args.reps, args.batches = 8, 1, "2"
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    cfg, tensors, tok, _ = load_model(None)
    # prefix caching off: every prompt runs again for off and each proposer, and a cache hit would hide its
    # prefill from whichever run came later (and round its rows otherwise on AMX hosts: step_rows.py)
    engine = build_engine(EngineConfig(device="cpu", kv_cache_memory=512 << 20, log_ledger=False,
                                       num_speculative_tokens=args.num_speculative_tokens,
                                       enable_prefix_caching=False), cfg, tensors, tok)
    tap = engine.runner = HiddenTap(engine.runner, engine.model_runner)
    heads = {k: getattr(args, k) for k in args.heads.split(",") if k}
    make = proposers(engine, cfg, tap, heads)
    llm = LLM.from_engine(engine)
    enc = lambda t: tok.encode_chat([{"role": "user", "content": t}])  # noqa: E731
    chat = [enc(t) for t in CHAT[:2 if args.smoke else None]]
    agentic = [enc(t) for t in AGENTIC[:1 if args.smoke else None]] * 2  # each sent twice, after the others
    measure(llm, chat[:1], SamplingParams(temperature=0, max_tokens=4), 1)  # warm-up
    n = args.max_tokens
    workloads = [("chat T=0", chat, SamplingParams(temperature=0, max_tokens=n), list(heads)),
                 ("chat T=0.7", chat, SamplingParams(temperature=0.7, seed=0, max_tokens=n), list(heads)),
                 ("chat T=1", chat, SamplingParams(temperature=1.0, seed=0, max_tokens=n), ["ngram", *heads]),
                 ("agentic T=0", agentic, SamplingParams(temperature=0, max_tokens=n), ["ngram", "suffix"])]
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        for name in make:  # untimed: each clock times this batch's steps before the measured runs
            llm.engine.set_proposer(make[name]())
            measure(llm, chat, SamplingParams(temperature=0, max_tokens=n), batch)
        for name, prompts, params, names in workloads:
            for r in compare(llm, make, prompts, params, batch, names, args.reps):
                rows.append({"workload": name, "batch": batch, **r})
                report(rows[-1])
    print(f"load average {os.getloadavg()[0]:.2f}")
    targets(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


def report(r: dict) -> None:
    same = "-" if r["identical"] is None else ("yes" if r["identical"] else "NO")
    line = "-" if r["line"] is None else f"{r['line']:.2f}"  # the acceptance a draft needed (measured)
    pos = " ".join(f"{a:.0%}" for a in r["by_position"])
    print(f"{r['workload']:<12} b={r['batch']:<2} {r['proposer']:<7} off {r['off_tok_s']:6.1f} on {r['on_tok_s']:6.1f} "
          f"tok/s  {r['speedup']:5.2f}x  accept {r['acceptance']:4.0%} [{pos}]  acc/step "
          f"{r['accepted_per_step']:.2f}  same {same}  line {line}", flush=True)


def targets(rows: list[dict]) -> None:
    """The issue's targets, each met or missed, from this run's rows."""
    def ratio(workload, batch, name, over="off"):
        mine = next((r for r in rows if r["workload"] == workload and r["batch"] == batch and r["proposer"] == name), None)
        if mine is None:
            return None
        if over == "off":
            return mine["speedup"]
        other = next(r for r in rows if r["workload"] == workload and r["batch"] == batch and r["proposer"] == over)
        return mine["on_tok_s"] / other["on_tok_s"]
    checks = []
    for batch, need in ((1, 1.5), (8, 1.2)):
        for w in ("chat T=0", "chat T=0.7"):
            checks += [(f"{w} b={batch} {k}", ratio(w, batch, k), need) for k in ("medusa", "eagle")]
        checks.append((f"agentic b={batch} suffix over ngram", ratio("agentic T=0", batch, "suffix", "ngram"), 1.3))
        checks += [(f"chat T=1 b={batch} {k}", ratio("chat T=1", batch, k), 0.95) for k in ("ngram", "medusa", "eagle")]
    for label, got, need in checks:
        if got is not None:
            print(f"target {label}: {got:.2f}x (need >= {need}x) {'met' if got >= need else 'MISSED'}")


if __name__ == "__main__":
    main()
