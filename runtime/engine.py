"""LLMEngine: the step-driven core. add_request / abort_request / step() -> incremental outputs.

Data flows one way: request -> scheduler -> model runner -> sampler -> detokenizer -> outputs.
"""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from runtime.engine_config import EngineConfig, available_host_memory
from runtime.engine_stats import EngineStats
from runtime.errors import RequestError, UserError
from runtime.host_allocator import tune_host_allocator
from runtime.kv.block_manager import BlockManager
from runtime.kv.block_pool import BlockPool
from runtime.model.config import ModelConfig
from runtime.model.factory import default_dtype, make_runner
from runtime.model_runner import SeqChunk
from runtime.output_processor import append_token, take_delta
from runtime.outputs import CompletionOutput, RequestOutput
from runtime.sampler import SamplingRow, logprob_records, processed_probs, sample
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from runtime.sequence import RequestMetrics, Sequence
from runtime.spec.factory import make_proposer
from runtime.spec.proposer import Draft, Proposer
from runtime.spec.verify import verify_one
from runtime.tokenizer.detokenizer import IncrementalDetokenizer
from runtime.tokenizer.tokenizer import Tokenizer

log = logging.getLogger("cute_serve")


@dataclass(eq=False)
class RequestState:
    request_id: str
    prompt_ids: list[int]
    seqs: list[Sequence]
    metrics: RequestMetrics
    reported_final: bool = False


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f"invalid device {name!r}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is available")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return default_dtype(device)
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def kv_budget(config: EngineConfig, device: torch.device) -> int:
    """Bytes for the KV cache; read once the weights are resident, so free memory no longer counts them."""
    if config.kv_cache_memory is not None:
        return config.kv_cache_memory
    if device.type == "cuda":
        torch.cuda.empty_cache()  # load-time temporaries held by the caching allocator are free memory too
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.85)
    return int(available_host_memory() * config.kv_cache_fraction)


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, tensors: dict[str, torch.Tensor],
                 tokenizer: Tokenizer) -> None:
        self.config = config
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.max_model_len = min(model_config.max_position_embeddings, config.max_model_len or 1 << 62)
        if self.device.type == "cpu":
            tune_host_allocator()
        # The draft comes first and the target's KV budget is read last, so free memory excludes both models.
        self.proposer: Proposer | None = make_proposer(config, model_config, self.device, self.dtype)
        self.runner, self.ledger = self._build_runner(tensors)
        self.pool = BlockPool(self.ledger.num_blocks, config.enable_prefix_caching)
        self.blocks = BlockManager(self.pool, config.block_size)
        self.scheduler = Scheduler(SchedulerConfig(config.max_num_batched_tokens, config.max_num_seqs,
                                                   config.scheduler), self.blocks)
        self.eos_ids = set(tokenizer.eos_token_ids) | set(model_config.eos_token_ids)
        self.requests: dict[str, RequestState] = {}
        self.stats = EngineStats()
        self._seq_ids = itertools.count()
        self._aborted: list[RequestState] = []
        if config.log_ledger:
            log.info(self.ledger.describe())

    def _build_runner(self, tensors: dict[str, torch.Tensor]):
        runner, ledger = make_runner(self.model_config, tensors, lambda: kv_budget(self.config, self.device),
                                     self.config.block_size, self.device, self.dtype, self.config.backend)
        if ledger.num_blocks < 1:
            need = ledger.bytes_per_token * self.config.block_size
            raise UserError(f"the KV cache budget ({ledger.budget_bytes} bytes) holds no block of "
                            f"{self.config.block_size} tokens ({need} bytes needed)")
        return runner, ledger

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    # -- requests -----------------------------------------------------------------------------

    def _check_prompt(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise RequestError("the prompt is empty")
        bad = next((t for t in prompt_ids if not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise RequestError(f"prompt token id {bad!r} is not in [0, {self.vocab_size})")
        n, m = len(prompt_ids), params.max_tokens
        if n + m > self.max_model_len:
            raise RequestError(f"prompt ({n} tokens) + max_tokens ({m}) = {n + m} exceeds the model's context "
                               f"length of {self.max_model_len} tokens", code="context_length_exceeded")
        if n + 1 > self.ledger.max_tokens:
            raise RequestError(f"prompt ({n} tokens) + 1 can never fit the KV cache of {self.ledger.max_tokens} tokens")
        if n + m > self.max_request_tokens:  # past the context check, only static's up-front reservation
            raise RequestError(f"prompt ({n} tokens) + max_tokens ({m}) can never fit the KV cache of "
                               f"{self.ledger.max_tokens} tokens, which static batching reserves up front")

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise RequestError if add_request would; reads only fixed limits, so any thread may call it."""
        params.validate(self.vocab_size)
        self._check_prompt(prompt_ids, params)

    def encode_text(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of a prompt text; text longer than the context could hold even at the longest
        token per position is refused before the tokenizer spends seconds (and GBs) on it."""
        per_token = self.tokenizer.max_chars_per_token
        if per_token is not None and len(text) > self.max_model_len * per_token:
            raise RequestError(f"the prompt has {len(text)} characters: more than the model's context of "
                               f"{self.max_model_len} tokens can hold (at most {per_token} characters a token)",
                               code="context_length_exceeded")
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """The chat template rendered with the assistant's turn opened, then encode_text."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.encode_text(text, add_special_tokens=False)  # the template writes BOS itself

    @property
    def max_request_tokens(self) -> int:
        """Most prompt + output tokens a request may ask for: the context, and in static mode, which
        reserves it all up front, the KV cache too."""
        if self.config.scheduler == "static":
            return min(self.max_model_len, self.ledger.max_tokens)
        return self.max_model_len

    def encode_prompt(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.encode_text(prompt)
        if not isinstance(prompt, list):
            raise RequestError("a prompt is a string or a list of token ids")
        return list(prompt)

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> list[int]:
        """Validate and enqueue; raises RequestError (nothing enqueued) on bad input. Returns prompt ids."""
        if request_id in self.requests:
            raise RequestError(f"duplicate request id {request_id!r}")
        params.validate(self.vocab_size)
        prompt_ids = self.encode_prompt(prompt)
        self._check_prompt(prompt_ids, params)
        metrics = RequestMetrics(arrival=arrival_time or time.perf_counter())
        seqs = [self._new_seq(request_id, i, prompt_ids, params, metrics) for i in range(params.n)]
        self.requests[request_id] = RequestState(request_id, prompt_ids, seqs, metrics)
        self.stats.prompt_tokens += len(prompt_ids)
        for seq in seqs:
            self.scheduler.add(seq)
        return prompt_ids

    def _new_seq(self, request_id: str, index: int, prompt_ids: list[int], params: SamplingParams,
                 metrics: RequestMetrics) -> Sequence:
        seq_id = next(self._seq_ids)
        gen = None
        if not params.greedy:  # unseeded: from the engine seed and arrival order, so a rerun is reproducible
            seed = params.seed + index if params.seed is not None else self.config.seed * 1_000_003 + seq_id
            gen = torch.Generator(device=self.device).manual_seed(seed % 2**63)
        seq = Sequence(seq_id, request_id, index, list(prompt_ids), len(prompt_ids), params,
                       metrics, generator=gen)
        seq.detokenizer = IncrementalDetokenizer(self.tokenizer, prompt_ids, params.skip_special_tokens)
        return seq

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now; its blocks return to the pool at once. False if unknown or done."""
        state = self.requests.get(request_id)
        if state is None:
            return False
        for seq in state.seqs:
            if not seq.is_finished:
                seq.finish_reason = "abort"
                self._finish(seq)
        self._aborted.append(state)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one forward pass over the scheduled batch; return outputs of requests that changed."""
        times = self.stats.times
        t0 = time.perf_counter()
        drafts = self._propose()
        tp = time.perf_counter()
        times.propose += tp - t0
        sched = self.scheduler.schedule({seq: len(d.tokens) for seq, d in drafts.items()})
        self._drop_unverified_drafts(drafts, sched)
        self.stats.preemptions += len(sched.preempted)
        changed = {self.requests[s.request_id] for s in sched.out_of_memory}
        for seq in sched.out_of_memory:
            log.warning("request %s ran out of KV cache capacity; finishing it", seq.request_id)
            seq.finish_reason = "length"
            self._finish(seq)
        t1 = time.perf_counter()
        times.schedule += t1 - tp
        if sched.chunks:
            changed |= self._run(sched, drafts)
        t2 = time.perf_counter()
        outputs = [self._output(state) for state in changed | set(self._aborted)]
        self._aborted.clear()
        times.output += time.perf_counter() - t2
        self.stats.steps += 1
        return outputs

    def _propose(self) -> dict[Sequence, Draft]:
        """Draft tokens for decoding sequences that allow speculation (empty without a proposer)."""
        if self.proposer is None or self.config.scheduler == "static":  # static never verifies drafts
            return {}
        k = self.config.num_speculative_tokens
        room = {s: min(k, s.params.max_tokens - s.num_output_tokens - 1, self.max_model_len - len(s.token_ids) - 1)
                for s in self.scheduler.running if s.num_remaining == 1 and s.params.speculative}
        drafts = self.proposer.propose([s for s, r in room.items() if r > 0], k)
        for seq, d in drafts.items():
            n = room[seq]
            d.tokens = d.tokens[:n]
            d.probs = d.probs[:n] if d.probs is not None else None
        return {s: d for s, d in drafts.items() if d.tokens}

    def _drop_unverified_drafts(self, drafts: dict[Sequence, Draft], sched: SchedulerOutput) -> None:
        """Drafts the scheduler left out (short of budget or blocks, or preempted) are never verified:
        the proposer forgets its guesses, and the last real token too, which it must run again to
        draft the next step."""
        verifying = {c.seq for c in sched.chunks if c.num_spec_tokens}
        for seq in drafts.keys() - verifying:
            self.proposer.on_verified(seq, len(seq.token_ids) - 1)

    def _sampling_row(self, seq: Sequence, extra: list[int] = ()) -> SamplingRow:
        """Sampling context of seq's next token, with `extra` draft tokens treated as already output."""
        p = seq.params
        prompt = seq.token_ids[:seq.num_prompt_tokens] if p.repetition_penalty != 1.0 else []
        out = seq.output_ids + list(extra) if (p.repetition_penalty != 1.0 or p.presence_penalty
                                               or p.frequency_penalty) else []
        banned = self._banned(seq) if seq.num_output_tokens + len(extra) < p.min_tokens else []
        return SamplingRow(p, out, prompt, seq.generator, banned)

    def _run(self, sched: SchedulerOutput, drafts: dict[Sequence, Draft]) -> set[RequestState]:
        times = self.stats.times
        t0 = time.perf_counter()
        chunks, specs = [], []
        for c in sched.chunks:
            seq = c.seq
            start = seq.num_computed
            spec = drafts[seq].tokens[:c.num_spec_tokens] if c.num_spec_tokens else []
            reaches_end = start + c.num_tokens == len(seq.token_ids)
            chunks.append(SeqChunk(seq.token_ids[start:start + c.num_tokens] + spec, start, seq.block_table,
                                   num_logits=len(spec) + 1 if reaches_end else 0))
            specs.append(spec)
            if c.num_tokens > 1 or seq.num_output_tokens == 0:
                self.stats.computed_prefill_tokens += c.num_tokens
        ids, positions, batch, rows = self.runner.prepare(chunks)
        t1 = time.perf_counter()
        logits = self.runner.forward(ids, positions, batch, rows)
        t2 = time.perf_counter()
        for c in sched.chunks:
            c.seq.num_computed += c.num_tokens
            self.blocks.register_full_blocks(c.seq)
        sampled = [(c.seq, spec) for c, ch, spec in zip(sched.chunks, chunks, specs) if ch.num_logits]
        plain = [seq for seq, spec in sampled if not spec]
        plain_rows = [i for i, (_, spec) in enumerate(sampled) if not spec]
        offsets = np.cumsum([0] + [len(spec) + 1 for _, spec in sampled])
        result = (sample(self._rows_of(logits, offsets[plain_rows]), [self._sampling_row(s) for s in plain])
                  if plain else None)
        verified = self._verify(sampled, logits, offsets, drafts)
        t3 = time.perf_counter()
        now = time.perf_counter()
        changed = set()
        for i, seq in enumerate(plain):
            if seq.ghost:
                self._accept(seq, result.token_ids[i], None, now)
                continue
            self._accept(seq, result.token_ids[i], result.logprobs[i], now)
            changed.add(self.requests[seq.request_id])
        for seq, tokens, lp, proposed in verified:
            self._accept_verified(seq, tokens, lp, proposed, now)
            changed.add(self.requests[seq.request_id])
        times.prepare += t1 - t0
        times.forward += t2 - t1
        times.sample += t3 - t2
        times.output += time.perf_counter() - t3
        return changed

    @staticmethod
    def _rows_of(logits: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
        """logits[rows] without a copy when rows are all of them (numpy-array indexing is a slow path)."""
        if len(rows) == logits.shape[0] and (rows == np.arange(len(rows))).all():
            return logits
        return logits.index_select(0, torch.from_numpy(rows).to(logits.device))

    def _verify(self, sampled, logits: torch.Tensor, offsets: np.ndarray, drafts: dict[Sequence, Draft]):
        """(seq, tokens to emit, logprob records, drafts verified) for every sequence that verified drafts
        this step (the budget may have let fewer through than were drafted)."""
        out = []
        for i, (seq, spec) in enumerate(sampled):
            if not spec:
                continue
            rows = [self._sampling_row(seq, spec[:j]) for j in range(len(spec) + 1)]
            seq_logits = logits[offsets[i]:offsets[i + 1]]
            probs = processed_probs(seq_logits, rows)
            q = drafts[seq].probs
            tokens = verify_one(probs, spec, q[:len(spec)] if q is not None else None, rows[0])
            lp = None
            if seq.params.logprobs is not None:
                tok = torch.tensor(tokens, device=seq_logits.device)
                lp = logprob_records(seq_logits[:len(tokens)], tok, seq.params.logprobs)
            out.append((seq, tokens, lp, len(spec)))
        return out

    def _accept_verified(self, seq: Sequence, tokens: list[int], lp, proposed: int, now: float) -> None:
        """Emit verified tokens in order (stopping early on a stop condition) and roll back rejected KV."""
        accepted = len(tokens) - 1
        start_len = len(seq.token_ids)
        for j, tok in enumerate(tokens):
            self._accept(seq, tok, lp[j] if lp else None, now)
            if seq.is_finished:
                break
        self.stats.spec_proposed += proposed
        self.stats.spec_accepted += accepted
        self.stats.spec_verify_steps += 1
        seq.metrics.spec_proposed += proposed
        seq.metrics.spec_accepted += accepted
        if seq.is_finished:
            return
        # KV is valid for the known tokens and the accepted drafts, not for rejected ones
        seq.num_computed = start_len + accepted
        self.blocks.truncate(seq, seq.num_computed)
        self.blocks.register_full_blocks(seq)
        self.proposer.on_verified(seq, seq.num_computed)

    def _banned(self, seq: Sequence) -> list[int]:
        if seq.num_output_tokens >= seq.params.min_tokens:
            return []
        return sorted((set() if seq.params.ignore_eos else self.eos_ids) | set(seq.params.stop_token_ids))

    def _accept(self, seq: Sequence, token: int, logprobs, now: float) -> None:
        if seq.ghost:  # static-batch padding: computed, never reported
            seq.token_ids.append(token)
            if len(seq.token_ids) >= min(len(seq.block_table) * self.config.block_size, self.max_model_len):
                self.scheduler.finish(seq)
            return
        m = seq.metrics
        if m.first_token is None:
            m.first_token = now
        m.last_token = now
        m.num_output_tokens += 1
        self.stats.generated_tokens += 1
        if logprobs is not None:
            seq.logprobs.append(logprobs)
        append_token(seq, token, self.eos_ids, self.max_model_len)
        m.longest_choice = max(m.longest_choice, seq.num_output_tokens)
        if seq.finish_reason:
            self._finish(seq)

    def _finish(self, seq: Sequence) -> None:
        if self.config.scheduler == "static" and seq.finish_reason != "abort" and seq in self.scheduler.running:
            seq.padding_from = len(seq.token_ids)  # a static batch computes finished members until its longest is done
            self.scheduler.release_drained_batch()
            return
        self.scheduler.finish(seq)
        if self.config.scheduler == "static":  # an abort may leave only padding members: release them too
            self.scheduler.release_drained_batch()
        if self.proposer is not None:
            self.proposer.release(seq)

    def _output(self, state: RequestState) -> RequestOutput:
        outs = []
        for seq in state.seqs:
            delta_text, delta_ids, delta_records = take_delta(seq)
            wants_logprobs = seq.params.logprobs is not None
            outs.append(CompletionOutput(seq.index, seq.text, seq.output_ids, seq.finish_reason, seq.stop_reason,
                                         delta_text, delta_ids, list(seq.logprobs) if wants_logprobs else None,
                                         delta_records if wants_logprobs else None))
        finished = all(s.finish_reason is not None for s in state.seqs)
        if finished:
            state.metrics.finished = state.metrics.finished or time.perf_counter()
            self.requests.pop(state.request_id, None)
            for seq in state.seqs:
                self.stats.finished[seq.finish_reason] = self.stats.finished.get(seq.finish_reason, 0) + 1
        return RequestOutput(state.request_id, state.prompt_ids, outs, finished, state.metrics.as_dict(),
                             state.metrics.num_cached_prompt_tokens)
