"""LLMEngine: the step-driven core. add_request / abort_request / step() -> incremental outputs.

One step: propose drafts -> schedule -> run the model -> sample / verify -> the output stage keeps
tokens up to a stop -> the scheduler's update takes them -> outputs. Data flows one way: request ->
scheduler -> model runner -> sampler -> detokenizer -> outputs.
"""
from __future__ import annotations

import itertools
import logging
import time

import torch

import runtime.nvtx as nvtx
from runtime.accel.cuda_graphs import CudaGraphRunner, uses_graphs
from runtime.accel.host_allocator import tune_host_allocator
from runtime.accel.quantization import unavailable_reason as quantization_unavailable
from runtime.batching import SchedulerOutput
from runtime.device import kv_budget, resolve_device, resolve_dtype, resolve_kv_dtype
from runtime.engine_config import EngineConfig
from runtime.engine_stats import EngineStats
from runtime.errors import RequestError, UserError
from runtime.kv.block_manager import BlockManager
from runtime.kv.block_pool import BlockPool
from runtime.model.factory import make_runner
from runtime.model.runner import SeqChunk
from runtime.output_processor import OutputProcessor, RequestState
from runtime.outputs import RequestOutput
from runtime.parallel.plan import check_tp_size
from runtime.request_limits import RequestLimits
from runtime.sampling.batch import sample_step
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Scheduler, SeqUpdate
from runtime.sequence import RequestMetrics, Sequence
from runtime.spec.factory import make_proposer
from runtime.spec.proposer import Draft, Proposer
from runtime.tokenizer.tokenizer import Tokenizer
from weights.config import ModelConfig

log = logging.getLogger("cute_serve")


class LLMEngine:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, tensors: dict[str, torch.Tensor],
                 tokenizer: Tokenizer) -> None:
        self.config = config
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, self.dtype, self.device, config.tensor_parallel_size)
        if (reason := quantization_unavailable(config.quantization, self.device)) is not None:
            raise UserError(reason)
        self.max_model_len = min(model_config.max_position_embeddings, config.max_model_len or 1 << 62)
        check_tp_size(model_config, config.tensor_parallel_size)  # before anything is built
        if self.device.type == "cpu":
            tune_host_allocator()
        # The draft comes first and the target's KV budget is read last, so free memory excludes both models.
        proposer = make_proposer(config, model_config, self.device, self.dtype)
        self.runner, self.ledger = self._make_runner(model_config, tensors)
        self.ledger.require_blocks()
        self.stats = EngineStats()
        self.graphs = self._capture_graphs()
        pool_blocks = self.ledger.num_blocks - (self.graphs is not None)  # the last block: graphs' scratch
        self.pool = BlockPool(pool_blocks, config.enable_prefix_caching)
        self.scheduler = Scheduler(config, BlockManager(self.pool, config.block_size), self.stats, self.max_model_len)
        self.limits = RequestLimits(tokenizer, model_config.vocab_size, self.max_model_len,
                                    pool_blocks * config.block_size, config.scheduler == "static")
        eos_ids = set(tokenizer.eos_token_ids) | set(model_config.eos_token_ids)
        self.output = OutputProcessor(tokenizer, eos_ids, self.max_model_len, self.stats)
        self.proposer: Proposer | None = None
        self.set_proposer(proposer)
        self._seq_ids = itertools.count()
        self._aborted: list[RequestState] = []
        if config.log_ledger:
            log.info(self.ledger.describe())

    def _make_runner(self, model_config: ModelConfig, tensors: dict[str, torch.Tensor]):
        config = self.config
        budget = lambda: kv_budget(config, self.device)  # noqa: E731
        if config.tensor_parallel_size == 1:
            return make_runner(model_config, tensors, budget, config.block_size, self.device, self.dtype,
                               config.backend, config.quantization, self.kv_dtype)
        from runtime.parallel.runner import make_tp_runner

        return make_tp_runner(model_config, tensors, budget, config.block_size, self.device, self.dtype,
                              config.backend, config.tensor_parallel_size, config.quantization)

    def close(self) -> None:
        """Release what outlives the object: tensor-parallel worker processes (idempotent)."""
        close = getattr(self.runner, "close", None)
        if close is not None:
            close()

    def failure(self) -> str | None:
        """Why no step can run any more (a tensor-parallel worker died), or None; safe from any thread."""
        failure = getattr(self.runner, "failure", None)
        return failure() if failure is not None else None

    def __enter__(self) -> "LLMEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _capture_graphs(self) -> CudaGraphRunner | None:
        """Decode graphs on CUDA unless --enforce-eager; their scratch KV block is the pool's last."""
        if not uses_graphs(self.device, self.config.enforce_eager) or self.config.tensor_parallel_size > 1:
            return None  # tensor parallel steps run eagerly: their collectives span processes
        if self.ledger.num_blocks < 2:
            raise UserError("the KV cache budget holds one block only, and CUDA graphs need one more as scratch: "
                            "raise --kv-cache-memory or pass --enforce-eager")
        graphs = CudaGraphRunner(self.runner, self.config.max_num_seqs, self.max_model_len, self.ledger.num_blocks - 1)
        graphs.capture()
        return graphs

    def set_proposer(self, proposer: Proposer | None) -> None:
        """Speculate with this proposer from now on (a draft model gets its own KV pool); engine idle."""
        self.proposer = proposer
        num_blocks = getattr(proposer, "num_kv_blocks", None)
        self.scheduler.draft_blocks = (BlockManager(BlockPool(num_blocks, False), self.config.block_size)
                                       if num_blocks else None)

    @property
    def requests(self) -> dict[str, RequestState]:
        return self.output.requests

    # -- requests -----------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    arrival_time: float | None = None) -> list[int]:
        """Validate and enqueue; raises RequestError (nothing enqueued) on bad input. Returns prompt ids."""
        if request_id in self.requests:
            raise RequestError(f"duplicate request id {request_id!r}")
        params.validate(self.model_config.vocab_size)
        prompt_ids = self.limits.encode_prompt(prompt)
        self.limits.check(prompt_ids, params)
        metrics = RequestMetrics(arrival=arrival_time or time.perf_counter())
        seqs = [self._new_seq(request_id, i, prompt_ids, params, metrics) for i in range(params.n)]
        self.output.add(request_id, prompt_ids, seqs)
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
        return Sequence(seq_id, request_id, list(prompt_ids), len(prompt_ids), params, metrics, generator=gen)

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

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one forward pass over the scheduled batch; return outputs of requests that changed."""
        times = self.stats.times
        t0 = time.perf_counter()
        drafts = self._propose()
        t1 = time.perf_counter()
        if nvtx.ON: nvtx.push("schedule")
        sched = self.scheduler.schedule({seq: len(d.tokens) for seq, d in drafts.items()})
        if nvtx.ON: nvtx.pop()
        changed = {self.output.state_of(seq) for seq in sched.out_of_memory}
        for seq in sched.out_of_memory:
            log.warning("request %s ran out of KV cache capacity; finishing it", seq.request_id)
            self.output.finish(seq, "length")
            self.scheduler.finish(seq)
        t2 = time.perf_counter()
        times.propose += t1 - t0
        times.schedule += t2 - t1
        if sched.chunks:
            changed |= self._run(sched, drafts)
        t3 = time.perf_counter()
        if nvtx.ON: nvtx.push("output")
        outputs = self.output.outputs(changed | set(self._aborted))
        if nvtx.ON: nvtx.pop()
        self._aborted.clear()
        times.output += time.perf_counter() - t3
        self.stats.steps += 1
        return outputs

    def _propose(self) -> dict[Sequence, Draft]:
        """Draft tokens for decoding sequences that allow speculation (empty without a proposer)."""
        if self.proposer is None:
            return {}
        room = self.scheduler.draft_room(self.config.num_speculative_tokens)
        drafts = self.proposer.propose(list(room), self.config.num_speculative_tokens) if room else {}
        for seq, d in drafts.items():
            n = room[seq]
            d.tokens = d.tokens[:n]
            d.probs = d.probs[:n] if d.probs is not None else None
        return {s: d for s, d in drafts.items() if d.tokens}

    def _run(self, sched: SchedulerOutput, drafts: dict[Sequence, Draft]) -> set[RequestState]:
        times = self.stats.times
        t0 = time.perf_counter()
        if nvtx.ON: nvtx.push("prepare")
        chunks, rows_of = [], []
        for c in sched.chunks:
            seq, start = c.seq, c.seq.num_computed
            spec = drafts[seq].tokens[:c.num_spec_tokens] if c.num_spec_tokens else []
            reaches_end = start + c.num_tokens == len(seq.token_ids)
            chunks.append(SeqChunk(seq.token_ids[start:start + c.num_tokens] + spec, start, seq.kv.block_table,
                                   num_logits=len(spec) + 1 if reaches_end else 0))
            if reaches_end:
                rows_of.append((seq, spec))
                if (grammar := self.output.grammar_of(seq)) is not None:
                    grammar.prefetch()  # its mask fills while the forward runs
        graph = self.graphs is not None and self.graphs.can_run(chunks)
        prepared = None if graph else self.runner.prepare(chunks)
        if nvtx.ON: nvtx.pop()
        t1 = time.perf_counter()
        logits = self.graphs.run(chunks) if graph else self.runner.forward(*prepared)
        t2 = time.perf_counter()
        if nvtx.ON: nvtx.push("sample")
        sampled = sample_step(rows_of, logits, drafts, self.output.eos_ids, self.output.grammar_of)
        if nvtx.ON: nvtx.swap("output")
        t3 = time.perf_counter()
        updates, changed = [], set()
        for s in sampled:
            if s.seq in sched.padding:  # static padding: computed, never reported
                updates.append(SeqUpdate(s.seq, s.tokens))
                continue
            kept, finished = self.output.accept(s.seq, s.tokens, s.logprobs, t3)
            updates.append(SeqUpdate(s.seq, s.tokens[:kept], finished, s.num_drafts))
            changed.add(self.output.state_of(s.seq))
            if s.num_drafts:
                self._count_verified(s.seq, s.num_drafts, len(s.tokens) - 1)
        self.scheduler.update(sched, updates)
        if nvtx.ON: nvtx.pop()
        times.prepare += t1 - t0
        times.forward += t2 - t1
        times.sample += t3 - t2
        times.output += time.perf_counter() - t3
        return changed

    def _count_verified(self, seq: Sequence, proposed: int, accepted: int) -> None:
        self.stats.spec_proposed += proposed
        self.stats.spec_accepted += accepted
        self.stats.spec_verify_steps += 1
        seq.metrics.spec_proposed += proposed
        seq.metrics.spec_accepted += accepted

    # -- what other threads may read, through AsyncEngine ------------------------------------------

    def snapshot(self, with_block_states: bool = False) -> EngineStats:
        """A copy of the metrics with the gauges filled in, safe to hand to another thread."""
        running = {s.request_id for s in self.scheduler.running}
        pool = self.pool
        return self.stats.copy(
            num_requests_running=len(running), num_requests_waiting=len(self.requests.keys() - running),
            kv_blocks_total=pool.num_blocks, kv_blocks_used=pool.num_used,
            kv_bytes_per_block=self.ledger.bytes_per_token * self.ledger.block_size,
            prefix_cached_blocks=pool.num_cached, prefix_cache_evictions=pool.evictions,
            block_states=pool.states() if with_block_states else None)

    def reset_stats(self) -> None:
        """Counters from zero (e.g. after a warm-up); gauges are unaffected."""
        self.stats.__init__()
        self.pool.evictions = 0

    def describe(self) -> dict[str, str]:
        """What runs, for logs and the UI's About panel."""
        cfg = self.model_config
        return {"model": f"{cfg.name} ({cfg.arch}, {cfg.num_layers} layers, "
                         f"{cfg.num_parameters() / 1e6:.1f}M parameters, context {self.max_model_len})",
                "dtype": str(self.dtype).replace("torch.", ""), "device": str(self.device),
                "backend": self.runner.model.backend.describe(), "block size": str(self.config.block_size),
                "scheduler": self.config.scheduler,
                "prefix caching": "on" if self.config.enable_prefix_caching else "off",
                "speculative": (self.config.speculative or "on") if self.proposer else "off",
                "tensor parallel": self._describe_tp(), "cuda graphs": self._describe_graphs(),
                "weights": f"{self.ledger.quantization}, {self.ledger.weight_bytes / 2**20:.1f} MiB resident",
                "memory ledger": self.ledger.describe()}

    def _describe_tp(self) -> str:
        n = self.config.tensor_parallel_size
        if n == 1:
            return "off"
        per_rank = self.ledger.weight_bytes + self.ledger.total_bytes
        return f"{n} ranks, {per_rank / 2**20:.1f} MiB each (weights + KV cache)"

    def _describe_graphs(self) -> str:
        g = self.graphs
        if g is None:
            return "off"
        return (f"decode at batch {', '.join(map(str, g.sizes))} (captured in {g.capture_seconds:.1f} s, "
                f"{g.graph_bytes / 2**20:.0f} MiB)")
