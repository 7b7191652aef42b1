"""Self-distillation data for the draft heads: the target answers the training prompts (runtime/spec/prompts.py)
through the engine itself, at several temperatures, and its final hidden state at every response position
is recorded on the way (HiddenTap), as the decode path computes it at inference time."""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from runtime.engine import LLMEngine
from runtime.sampling_params import SamplingParams
from runtime.spec.hidden_tap import HiddenTap


@dataclass
class Samples:
    """Responses packed end to end: row i of `hidden` is the target's state that sampled `tokens[i]`."""

    hidden: torch.Tensor  # [N, hidden] float16
    tokens: torch.Tensor  # [N] int64
    starts: torch.Tensor  # [responses + 1] where each response begins
    temperatures: torch.Tensor  # [responses] what each was sampled at

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        offsets = torch.tensor([0] + [int(p.starts[-1]) for p in parts]).cumsum(0)
        starts = torch.cat([parts[0].starts[:1]] + [p.starts[1:] + o for p, o in zip(parts, offsets)])
        return Samples(torch.cat([p.hidden for p in parts]), torch.cat([p.tokens for p in parts]), starts,
                       torch.cat([p.temperatures for p in parts]))

    def split(self, every: int) -> tuple[Samples, Samples]:
        """(the rest, every `every`-th response of each temperature): a held-out set for evaluation with
        answers at every temperature (greedy ones among them) however the responses are ordered."""
        seen: dict[float, int] = {}
        held, rest = [], []
        for i, t in enumerate(self.temperatures.tolist()):
            seen[t] = seen.get(t, 0) + 1
            (held if seen[t] % every == 0 else rest).append(i)
        return self.subset(rest), self.subset(held)

    def subset(self, which: list[int]) -> Samples:
        spans = [(int(self.starts[i]), int(self.starts[i + 1])) for i in which]
        idx = torch.cat([torch.arange(a, b) for a, b in spans]) if spans else torch.empty(0, dtype=torch.long)
        lengths = torch.tensor([b - a for a, b in spans], dtype=torch.long)
        return Samples(self.hidden[idx], self.tokens[idx], torch.cat([torch.zeros(1, dtype=torch.long),
                       lengths.cumsum(0)]), self.temperatures[which])


class _Rows:
    """fp16 rows appended into one matrix that doubles as it fills: one allocation per doubling, where a
    tensor per recorded state (~1 KiB each, freed among the steps' temporaries) fragmented the heap until
    glibc held ~100 KiB per token (8.7 GB RSS after 74k tokens; 1.0 GB once malloc_trim returned it)."""

    def __init__(self, width: int) -> None:
        self.data, self.n = torch.empty((1024, width), dtype=torch.float16), 0

    def append(self, rows: torch.Tensor) -> int:
        """Stores rows; returns the index of the first."""
        while self.n + rows.shape[0] > self.data.shape[0]:
            grown = torch.empty((2 * self.data.shape[0], self.data.shape[1]), dtype=torch.float16)
            grown[:self.n] = self.data[:self.n]
            self.data = grown
        self.data[self.n:self.n + rows.shape[0]] = rows
        self.n += rows.shape[0]
        return self.n - rows.shape[0]


def collect(engine: LLMEngine, prompts: list[list[int]], temperatures: list[float], max_tokens: int,
            seed: int = 0, seconds: float = float("inf")) -> Samples:
    """Every prompt answered once at each temperature, hidden states recorded; the engine's runner is tapped.
    After `seconds` the answers still running are cut where they are (what they have is as good)."""
    deadline = time.perf_counter() + seconds
    tap = engine.runner if isinstance(engine.runner, HiddenTap) else HiddenTap(engine.runner, engine.model_runner)
    engine.runner = tap
    seqs, states, store = {}, {}, _Rows(engine.model_config.hidden_size)
    for i, (ids, temp) in enumerate((p, t) for p in prompts for t in temperatures):
        rid = f"distill-{i}"
        engine.add_request(rid, ids, SamplingParams(temperature=temp, max_tokens=max_tokens, seed=seed + i))
        seq = engine.requests[rid].choices[0].seq
        seqs[seq.seq_id], states[seq.seq_id] = (seq, temp), {}
    while engine.has_unfinished_requests():
        if time.perf_counter() > deadline:
            for rid in list(engine.requests):
                engine.abort_request(rid)
        engine.step()
        for seq_id, (first, rows) in tap.rows.items():
            at = store.append(rows.cpu())
            states[seq_id].update((first + j, at + j) for j in range(rows.shape[0]))
    rows, tokens, lengths, temps = [], [], [], []
    for seq_id, (seq, temp) in seqs.items():
        start, out, got = seq.num_prompt_tokens - 1, seq.token_ids[seq.num_prompt_tokens:], states[seq_id]
        out = out[:next((j for j in range(len(out)) if start + j not in got), len(out))]  # all, unless cut short
        if not out:
            continue
        rows += [got[start + j] for j in range(len(out))]
        tokens += out
        lengths.append(len(out))
        temps.append(temp)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), torch.tensor(lengths, dtype=torch.long).cumsum(0)])
    return Samples(store.data[torch.tensor(rows, dtype=torch.long)], torch.tensor(tokens), starts, torch.tensor(temps))
