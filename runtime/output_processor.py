"""The output stage, after each step: stop conditions, incremental detokenization, logprobs, and
what each request has streamed so far. It owns the per-request output records and never touches
KV or the schedule: the scheduler's update takes the tokens it keeps."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from runtime.engine_stats import EngineStats
from runtime.outputs import CompletionOutput, RequestOutput
from runtime.sampling.sampler import Sampled
from runtime.sequence import RequestMetrics, Sequence, SeqUpdate
from runtime.tokenizer.detokenizer import IncrementalDetokenizer
from runtime.tokenizer.tokenizer import Tokenizer


@dataclass(eq=False)
class Choice:
    """What one sequence (one of a request's n choices) has produced and streamed."""

    seq: Sequence
    index: int
    detokenizer: IncrementalDetokenizer
    num_tokens: int = 0  # output tokens kept (a static batch's padding past them is never reported)
    text: str = ""  # detokenized output, stop string excluded
    finish_reason: str | None = None  # "stop", "length", "abort"
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    logprobs: list = field(default_factory=list)
    num_emitted_chars: int = 0  # of text, already streamed out
    num_emitted_tokens: int = 0

    @property
    def output_ids(self) -> list[int]:
        start = self.seq.num_prompt_tokens
        return self.seq.token_ids[start:start + self.num_tokens]


@dataclass(eq=False)
class RequestState:
    request_id: str
    prompt_ids: list[int]
    choices: list[Choice]
    metrics: RequestMetrics

    @property
    def finished(self) -> bool:
        return all(c.finish_reason is not None for c in self.choices)


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, eos_ids: set[int], max_model_len: int, stats: EngineStats) -> None:
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.max_model_len = max_model_len
        self.stats = stats
        self.requests: dict[str, RequestState] = {}
        self._choices: dict[Sequence, Choice] = {}

    def add(self, request_id: str, prompt_ids: list[int], seqs: list[Sequence]) -> None:
        choices = [Choice(s, i, IncrementalDetokenizer(self.tokenizer, prompt_ids, s.params.skip_special_tokens))
                   for i, s in enumerate(seqs)]
        self._choices.update((c.seq, c) for c in choices)
        self.requests[request_id] = RequestState(request_id, prompt_ids, choices, seqs[0].metrics)
        self.stats.prompt_tokens += len(prompt_ids)

    def state_of(self, seq: Sequence) -> RequestState:
        return self.requests[seq.request_id]

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a choice from outside the step's tokens (an abort, a sequence that can never fit)."""
        choice = self._choices[seq]
        if choice.finish_reason is None:
            choice.finish_reason = reason

    def accept_step(self, sampled: list[Sampled], padding: frozenset[Sequence],
                    now: float) -> tuple[list[SeqUpdate], set[RequestState]]:
        """The step's sampled tokens, in order: what each sequence keeps (the scheduler's updates) and
        the requests that changed. A static batch's padding rows keep their tokens, never reported."""
        updates, changed = [], set()
        for s in sampled:
            if s.seq in padding:
                updates.append(SeqUpdate(s.seq, s.tokens))
                continue
            kept, finished = self.accept(s.seq, s.tokens, s.logprobs, now)
            updates.append(SeqUpdate(s.seq, s.tokens[:kept], finished, s.num_drafts))
            if s.tokens:  # a deferred row (no token this step) changes nothing a client sees
                changed.add(self.state_of(s.seq))
            if s.num_drafts:
                self._count_verified(s.seq.metrics, s.num_drafts, len(s.tokens) - 1)
        return updates, changed

    def _count_verified(self, m: RequestMetrics, proposed: int, accepted: int) -> None:
        self.stats.spec_proposed += proposed
        self.stats.spec_accepted += accepted
        self.stats.spec_verify_steps += 1
        for counts, n in ((self.stats.spec_proposed_by_pos, proposed), (self.stats.spec_accepted_by_pos, accepted)):
            counts.extend([0] * (n - len(counts)))
            for j in range(n):
                counts[j] += 1
        m.spec_proposed += proposed
        m.spec_accepted += accepted

    def accept(self, seq: Sequence, tokens: list[int], logprobs: list | None, now: float) -> tuple[int, bool]:
        """Take a step's tokens in order, up to a stop condition: (tokens kept, finished)."""
        choice = self._choices[seq]
        m = seq.metrics
        for j, token in enumerate(tokens):
            if m.first_token is None:
                m.first_token = now
            m.last_token = now
            m.num_output_tokens += 1
            self.stats.generated_tokens += 1
            if logprobs is not None:
                choice.logprobs.append(logprobs[j])
            self._append(choice, token)
            m.longest_choice = max(m.longest_choice, choice.num_tokens)
            if choice.finish_reason:
                return j + 1, True
        return len(tokens), False

    def _append(self, c: Choice, token: int) -> None:
        """One token: detokenize, and check eos / stop ids, stop strings, max_tokens and the context."""
        p = c.seq.params
        c.num_tokens += 1
        n_out = c.num_tokens
        if c.seq.grammar is not None and not c.seq.grammar.accept(token):  # complete, refused or too slow: end
            c.finish_reason, c.stop_reason = c.seq.grammar.ending()
            c.text += c.detokenizer.flush()
            return
        stop_id = (not p.ignore_eos and token in self.eos_ids) or token in p.stop_token_ids
        if stop_id and n_out >= p.min_tokens:
            c.finish_reason, c.stop_reason = "stop", (token if token in p.stop_token_ids else None)
            c.text += c.detokenizer.flush()
            return
        prev_len = len(c.text)
        c.text += c.detokenizer.add(token)
        if p.stop and len(c.text) > prev_len and n_out >= p.min_tokens:
            longest = max(len(s) for s in p.stop)
            start = max(0, prev_len - longest + 1)  # a stop string may span the previous tokens
            hits = [(i, s) for s in p.stop if (i := c.text.find(s, start)) >= 0]
            if hits:
                i, s = min(hits)
                c.text = c.text[:i + len(s) if p.include_stop_str_in_output else i]
                c.finish_reason, c.stop_reason = "stop", s
                return
        if n_out >= p.max_tokens or c.seq.num_prompt_tokens + n_out >= self.max_model_len:
            c.finish_reason = "length"
            c.text += c.detokenizer.flush(drop_incomplete=True)  # cut by us: a half character is no text

    def outputs(self, states: set[RequestState]) -> list[RequestOutput]:
        """What changed for each request since its last output; finished requests leave."""
        return [self._output(state) for state in states]

    def _output(self, state: RequestState) -> RequestOutput:
        outs = []
        for c in state.choices:
            text, ids, records = _take_delta(c)
            wants_logprobs = c.seq.params.logprobs is not None
            outs.append(CompletionOutput(c.index, c.text, c.output_ids, c.finish_reason, c.stop_reason, text, ids,
                                         list(c.logprobs) if wants_logprobs else None,
                                         records if wants_logprobs else None))
        finished = state.finished
        if finished:
            state.metrics.finished = state.metrics.finished or time.perf_counter()
            if self.requests.pop(state.request_id, None) is not None:
                for c in state.choices:
                    del self._choices[c.seq]
                    self.stats.finished[c.finish_reason] = self.stats.finished.get(c.finish_reason, 0) + 1
        return RequestOutput(state.request_id, state.prompt_ids, outs, finished, state.metrics.as_dict(),
                             state.metrics.num_cached_prompt_tokens, state.metrics.num_external_prompt_tokens)


def _stop_hold_back(c: Choice) -> int:
    """Chars to hold back while streaming: the tail that could still grow into a stop string (none
    when the stop string stays in the output: what streams is never taken back)."""
    p = c.seq.params
    return 0 if p.include_stop_str_in_output else max((len(s) for s in p.stop), default=1) - 1


def _take_delta(c: Choice) -> tuple[str, list[int], list]:
    """Text, token ids and logprob records not yet streamed; while running, hold back a possible
    stop-string prefix of the text."""
    end = len(c.text) if c.finish_reason else max(c.num_emitted_chars, len(c.text) - _stop_hold_back(c))
    text = c.text[c.num_emitted_chars:end]
    c.num_emitted_chars = end
    start = c.seq.num_prompt_tokens
    ids = c.seq.token_ids[start + c.num_emitted_tokens:start + c.num_tokens]  # no full-output copy
    records = c.logprobs[c.num_emitted_tokens:]  # one per output token, when logprobs were asked for
    c.num_emitted_tokens = c.num_tokens
    return text, ids, records
