"""LLMEngine: the step-driven core. add_request / abort_request / step() -> incremental outputs.

One step: propose drafts -> schedule (model-ready chunks) -> prepare -> forward -> sample / verify ->
the output stage keeps tokens up to a stop -> the scheduler's update takes them -> outputs. Data flows
one way: request -> scheduler -> runner -> sampler -> output stage. The engine sees its runner and
proposer through their seams only; runtime/build.py picks them (with the wings they need).
"""
from __future__ import annotations

import itertools
import logging
import time

import torch

from runtime.engine_config import EngineConfig
from runtime.engine_stats import EngineStats, PhaseTimer
from runtime.errors import RequestError
from runtime.kv.block_manager import BlockManager
from runtime.kv.block_pool import BlockPool
from runtime.model.runner import EngineParts
from runtime.output_processor import OutputProcessor, RequestState
from runtime.outputs import RequestOutput
from runtime.request_limits import Admitted, RequestLimits
from runtime.sampling.sampler import sample_step
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Scheduler, SchedulerOutput
from runtime.sequence import Draft, Proposer, RequestMetrics, Sequence
from runtime.tokenizer.tokenizer import Tokenizer
from weights.config import ModelConfig

log = logging.getLogger("cute_serve")


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, tokenizer: Tokenizer,
                 parts: EngineParts) -> None:
        self.config, self.model_config, self.tokenizer = config, model_config, tokenizer
        self.device, self.dtype, self.max_model_len = parts.device, parts.dtype, parts.max_model_len
        self.runner, self.model_runner, self.ledger = parts.runner, parts.model_runner, parts.ledger
        self.stats = EngineStats()
        self.timer = PhaseTimer(self.stats)
        self.pool = BlockPool(parts.pool_blocks, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, BlockManager(self.pool, config.block_size), self.stats, self.max_model_len)
        self.limits = RequestLimits(tokenizer, model_config.vocab_size, self.max_model_len,
                                    parts.pool_blocks * config.block_size, config.scheduler == "static")
        eos_ids = set(tokenizer.eos_token_ids) | set(model_config.eos_token_ids)
        self.output = OutputProcessor(tokenizer, eos_ids, self.max_model_len, self.stats)
        self.proposer: Proposer | None = None
        self.set_proposer(parts.proposer)
        self._seq_ids = itertools.count()
        self._aborted: list[RequestState] = []
        if config.log_ledger:
            log.info(self.ledger.describe())

    def close(self) -> None:
        """Release what outlives the object: tensor-parallel worker processes (idempotent)."""
        self.runner.close()

    def failure(self) -> str | None:
        """Why no step can run any more (a tensor-parallel worker died), or None; safe from any thread."""
        return self.runner.failure()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_proposer(self, proposer: Proposer | None) -> None:
        """Speculate with this proposer from now on (a draft model gets its own KV pool); engine idle."""
        self.proposer = proposer
        self.scheduler.set_draft_pool(proposer.num_kv_blocks if proposer is not None else 0)

    @property
    def requests(self) -> dict[str, RequestState]:
        return self.output.requests

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> list[int]:
        """Validate and enqueue; raises RequestError (nothing enqueued) on bad input. Returns prompt ids."""
        self._check_new(request_id)
        return self.add(request_id, self.limits.admit(prompt, params), arrival_time)

    def add(self, request_id: str, request: Admitted, arrival_time: float | None = None) -> list[int]:
        """Enqueue a request RequestLimits.admit has admitted (from any thread). Returns its prompt ids."""
        self._check_new(request_id)
        metrics = RequestMetrics(arrival=arrival_time or time.perf_counter())
        seqs = [self._new_seq(request_id, i, request, metrics) for i in range(request.params.n)]
        self.output.add(request_id, request.prompt_ids, seqs)
        for seq in seqs:
            self.scheduler.add(seq)
        return request.prompt_ids

    def _check_new(self, request_id: str) -> None:
        if request_id in self.requests:
            raise RequestError(f"duplicate request id {request_id!r}")
    def _new_seq(self, request_id: str, index: int, request: Admitted, metrics: RequestMetrics) -> Sequence:
        seq_id, params = next(self._seq_ids), request.params
        gen = None
        if not params.greedy:  # unseeded: from the engine seed and arrival order, so a rerun is reproducible
            seed = params.seed + index if params.seed is not None else self.config.seed * 1_000_003 + seq_id
            gen = torch.Generator(device=self.device).manual_seed(seed % 2**63)
        grammar = request.grammar.processor(self.output.eos_ids) if request.grammar is not None else None
        return Sequence(seq_id, request_id, list(request.prompt_ids), len(request.prompt_ids), params, metrics,
                        generator=gen, grammar=grammar,
                        draw_seed=seed if gen is not None and self.config.deterministic else None)

    def abort_request(self, request_id: str) -> bool:
        """Stop a request now; its blocks return to the pool at once. False if unknown or done."""
        state = self.requests.get(request_id)
        if state is None:
            return False
        for c in state.choices:
            if c.finish_reason is None:
                self.output.finish(c.seq, "abort")
                self.scheduler.abort(c.seq)
        self._aborted.append(state)
        return True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        """Run one forward pass over the scheduled batch; return outputs of requests that changed."""
        timer = self.timer
        timer("propose")
        drafts = self._propose()
        timer("schedule")
        sched = self.scheduler.schedule(drafts)
        changed = {self.output.state_of(seq) for seq in sched.out_of_memory}
        for seq in sched.out_of_memory:
            log.warning("request %s ran out of KV cache capacity; finishing it", seq.request_id)
            self.output.finish(seq, "length")
            self.scheduler.finish(seq)
        if sched.model_chunks:
            changed |= self._run(sched)
        timer("output")
        outputs = self.output.outputs(changed | set(self._aborted))
        timer.end()
        self._aborted.clear()
        self.stats.steps += 1
        return outputs

    def _propose(self) -> dict[Sequence, Draft]:
        """Draft tokens for decoding sequences that allow speculation (empty without a proposer)."""
        if self.proposer is None:
            return {}
        k = self.config.num_speculative_tokens
        room = self.scheduler.draft_room(k)
        return self.scheduler.fit_drafts(self.proposer.propose(list(room), k), room) if room else {}

    def _run(self, sched: SchedulerOutput) -> set[RequestState]:
        timer = self.timer
        timer("prepare")
        for seq, _ in sched.sampled:
            if seq.grammar is not None:
                seq.grammar.prefetch()  # its mask fills while the forward runs
        prepared = self.runner.prepare(sched.model_chunks)
        timer("forward")
        logits = self.runner.forward(prepared)
        timer("sample")
        sampled = sample_step(sched.sampled, logits, sched.drafts, self.output.eos_ids)
        now = timer("output")
        updates, changed = self.output.accept_step(sampled, sched.padding, now)
        self.scheduler.update(sched, updates)
        return changed

    def snapshot(self, with_block_states: bool = False) -> EngineStats:
        """A copy of the metrics with the gauges filled in, safe to hand to another thread."""
        running = {s.request_id for s in self.scheduler.running}
        pool, connector = self.pool, self.scheduler.connector
        return self.stats.copy(
            num_requests_running=len(running), num_requests_waiting=len(self.requests.keys() - running),
            kv_blocks_total=pool.num_blocks, kv_blocks_used=pool.num_used,
            kv_bytes_per_block=self.ledger.bytes_per_token * self.ledger.block_size,
            prefix_cached_blocks=pool.num_cached, prefix_cache_evictions=pool.evictions,
            block_states=pool.states(connector.holds if connector else None) if with_block_states else None,
            tiers=self.stats.tiers | connector.gauges() if connector else dict(self.stats.tiers))

    def reset_stats(self) -> None:
        """Counters from zero (e.g. after a warm-up); gauges are unaffected."""
        self.stats.__init__()
        self.pool.evictions = 0

    def describe(self) -> dict[str, str]:
        """What runs, for logs and the UI's About panel."""
        cfg, runs = self.model_config, self.runner.describe()
        return {"model": f"{cfg.name} ({cfg.arch}, {cfg.num_layers} layers, "
                         f"{cfg.num_parameters() / 1e6:.1f}M parameters, context {self.max_model_len})",
                "dtype": str(self.dtype).replace("torch.", ""), "device": str(self.device),
                "backend": runs["backend"], "block size": str(self.config.block_size),
                "scheduler": self.config.scheduler,
                "prefix caching": "on" if self.config.enable_prefix_caching else "off",
                "speculative": (self.config.speculative or "on") if self.proposer else "off",
                "tensor parallel": runs["tensor parallel"], "cuda graphs": runs["cuda graphs"],
                "kv role": self.config.kv_role,
                "weights": f"{self.ledger.quantization}, {self.ledger.weight_bytes / 2**20:.1f} MiB resident",
                "memory ledger": self.ledger.describe()}
