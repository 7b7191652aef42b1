"""The optimization ladder's one fixed workload: chat requests in groups that share a long system
prompt (what prefix caching reuses), with notes of random length pasted before the question and
long-tailed output lengths (what static batching pads and over-reserves for), and a slice of
copy-heavy requests (repeat or lightly edit a given text: what n-gram speculation guesses). Seeded,
built from text through the model's own chat template.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

from profiling.benchmarks.bench_prefix import TOPICS, system_prompt
from profiling.benchmarks.bench_spec import COPY_TASKS
from runtime.tokenizer.tokenizer import Tokenizer


@dataclass
class LadderRequest:
    prompt_ids: list[int]
    max_tokens: int
    kind: str  # "chat" or "copy"
    group: int  # which shared system prompt


@dataclass
class LadderShape:
    requests: int = 16
    groups: int = 4  # distinct system prompts, shared round-robin
    system_tokens: int = 250
    max_notes: int = 30  # pasted notes of about a dozen tokens each, 0..max_notes per chat request
    copy_fraction: float = 0.25
    output_range: tuple[int, int] = (16, 256)  # chat outputs, log-uniform: many short, a few long
    copy_tokens: int = 160
    seed: int = 0


def ladder_workload(tokenizer: Tokenizer, shape: LadderShape) -> list[LadderRequest]:
    rng = random.Random(shape.seed)
    rules = system_prompt(shape.system_tokens, tokenizer)
    # a distinct head per group, so groups share nothing and each group's prefix is its own
    systems = [f"You are assistant number {g} of the {TOPICS[g % len(TOPICS)]} help desk. {rules}"
               for g in range(shape.groups)]
    lo, hi = shape.output_range
    num_copy = round(shape.requests * shape.copy_fraction)
    copy_at = set(rng.sample(range(shape.requests), num_copy))
    out = []
    for i in range(shape.requests):
        group = i % shape.groups
        if i in copy_at:
            user, kind, max_tokens = f"{COPY_TASKS[i % len(COPY_TASKS)]}\n(ticket {i})", "copy", shape.copy_tokens
        else:
            a, b = rng.sample(TOPICS, 2)
            notes = " ".join(f"Note {k}: the {rng.choice(TOPICS)} group meets on day {rng.randint(1, 28)} in room "
                             f"{rng.randint(1, 99)}." for k in range(rng.randint(0, shape.max_notes)))
            user, kind = f"{notes}\nQuestion {i}: what links {a} and {b}? Give one concrete example.", "chat"
            max_tokens = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        ids = tokenizer.encode_chat([{"role": "system", "content": systems[group]}, {"role": "user", "content": user}])
        out.append(LadderRequest(ids, max_tokens, kind, group))
    return out


def describe(workload: list[LadderRequest]) -> dict:
    prompts = [len(r.prompt_ids) for r in workload]
    return {"requests": len(workload), "copy_requests": sum(r.kind == "copy" for r in workload),
            "groups": len({r.group for r in workload}), "prompt_tokens": sum(prompts),
            "prompt_range": [min(prompts), max(prompts)], "output_tokens": sum(r.max_tokens for r in workload),
            "output_range": [min(r.max_tokens for r in workload), max(r.max_tokens for r in workload)]}
