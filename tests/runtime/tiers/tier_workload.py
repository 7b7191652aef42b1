"""A workload whose prefixes outgrow the KV pool: 6 distinct 80-token prefixes (5 blocks each) asked
twice over a 24-block pool, so the second round's prefixes were evicted during the first."""
from __future__ import annotations

from runtime.llm import LLM
from runtime.sampling_params import SamplingParams
from tests.tiny_engine import tiny_engine

PROMPTS = [[(7 * p + 3 * i) % 250 + 3 for i in range(80)] + [250 + p] for p in range(6)]
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def engine(**kw):
    return tiny_engine(num_blocks=24, **kw)


def run_rounds(e, rounds: int = 2) -> list[list[int]]:
    """Blocks evicted by a request are stored before the next one asks: the writer runs in the cores' idle
    time, which a busy machine may not leave it for a while (the counts the tests assert would vary)."""
    llm, out = LLM.from_engine(e), []
    for _ in range(rounds):
        for p in PROMPTS:
            out.append(llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids)
            if e.scheduler.connector is not None:
                e.scheduler.connector.flush()
    return out


def baseline() -> list[list[int]]:
    with engine() as e:
        return run_rounds(e)
