"""CUDA graphs for decode steps: the whole forward (every layer and the LM head) of a step whose
sequences each feed one token, captured once per batch-size bucket and replayed, so a decode step
costs one graph launch instead of hundreds of kernel launches.

Buckets are 1, 2, 4, 8, ... up to max_num_seqs (itself the last); a batch is padded to the next one.
Inputs live in static buffers that every replay reads: the step's rows first, then padding rows that
write their K/V to a scratch slot (the last KV block, which the engine keeps out of the block pool)
and attend over it alone, so they never touch live KV. Block tables are as wide as the longest
context (up to MAX_GRAPH_CONTEXT tokens where the backend's captured decode reads tables to their full
width: the sync-free reference); a step with a longer sequence, prefill and mixed steps, and
speculative verification (several tokens per sequence) run eagerly. Captured only on CUDA; the CPU
path never captures.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cute_kernels.reference_static import StaticDecodePlan
from runtime.model.attention_batch import AttentionBatch
from runtime.model.runner import ModelRunner, Runner
from runtime.sequence import SeqChunk

log = logging.getLogger("cute_serve")
# The sync-free reference decode reads every sequence's table to its full width, so then the width is
# capped: batch 64 x 4096 tokens of Llama 3 8B's KV is ~0.5 GB per gather.
MAX_GRAPH_CONTEXT = 4096


def capture_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... below max_num_seqs, then max_num_seqs itself."""
    sizes, n = [], 1
    while n < max_num_seqs:
        sizes.append(n)
        n *= 2
    return sizes + [max_num_seqs]


def padded_size(batch: int, sizes: list[int]) -> int | None:
    """The smallest captured size that holds `batch` rows; None when the batch is too large."""
    return next((s for s in sizes if s >= batch), None)


def uses_graphs(device: torch.device, enforce_eager: bool) -> bool:
    return device.type == "cuda" and not enforce_eager


@dataclass
class StaticDecodeInputs:
    """Every input a captured decode step reads, [max rows] (tables [max rows, width])."""

    ids: torch.Tensor  # int64
    positions: torch.Tensor  # int64
    slot_mapping: torch.Tensor  # int64
    block_tables: torch.Tensor  # int32
    context_lens: torch.Tensor  # int32
    scratch_block: int
    block_size: int

    @classmethod
    def allocate(cls, rows: int, width: int, scratch_block: int, block_size: int,
                 device: torch.device) -> "StaticDecodeInputs":
        def zeros(*shape, dtype=torch.int64):
            return torch.zeros(shape, dtype=dtype, device=device)

        inputs = cls(zeros(rows), zeros(rows), zeros(rows), zeros(rows, width, dtype=torch.int32),
                     zeros(rows, dtype=torch.int32), scratch_block, block_size)
        inputs.fill([])  # padding everywhere: what warm-up and capture run on
        return inputs

    @property
    def width(self) -> int:
        return self.block_tables.shape[1]

    def host_arrays(self, chunks: list[SeqChunk]) -> dict[str, np.ndarray]:
        """The buffers' new contents: the chunks' rows, then padding rows (token 0 at position 0,
        written to and read from the scratch block's first slot)."""
        rows, n = self.ids.shape[0], len(chunks)
        ids = np.zeros(rows, dtype=np.int64)
        positions = np.zeros(rows, dtype=np.int64)
        tables = np.full((rows, self.width), self.scratch_block, dtype=np.int32)
        context_lens = np.ones(rows, dtype=np.int32)
        for i, c in enumerate(chunks):
            ids[i], positions[i] = c.token_ids[0], c.start_pos
            tables[i, :len(c.block_table)] = c.block_table
        context_lens[:n] = positions[:n] + 1
        slots = tables[np.arange(rows), positions // self.block_size].astype(np.int64) * self.block_size
        slots += positions % self.block_size
        return dict(ids=ids, positions=positions, slot_mapping=slots, block_tables=tables, context_lens=context_lens)

    def fill(self, chunks: list[SeqChunk]) -> None:
        for name, array in self.host_arrays(chunks).items():
            getattr(self, name).copy_(torch.from_numpy(array), non_blocking=True)

    def batch(self, rows: int, num_blocks: int, num_kv_heads: int, plan: Any = None) -> AttentionBatch:
        """The attention record over the first `rows` rows: all decodes; with a plan made before the
        capture (backend.graph_decode_plan), nothing in the step syncs."""
        return AttentionBatch(slot_mapping=self.slot_mapping[:rows], num_blocks=num_blocks,
                              block_size=self.block_size, num_kv_heads=num_kv_heads, num_decode_tokens=rows,
                              decode_block_tables=self.block_tables[:rows],
                              decode_context_lens=self.context_lens[:rows],
                              decode_plan=StaticDecodePlan() if plan is None else plan)


@dataclass
class _Replay:
    """A step the graphs run: its chunks fill the static inputs in forward()."""

    chunks: list[SeqChunk]


class GraphedRunner:
    """A Runner that captures decode graphs of a ModelRunner and replays them for the steps they fit;
    every other step goes to `inner` (by default that ModelRunner), eagerly."""

    def __init__(self, runner: ModelRunner, max_num_seqs: int, max_model_len: int, scratch_block: int,
                 inner: Runner | None = None) -> None:
        self.runner = runner
        self.inner = inner or runner
        self.sizes = capture_sizes(max_num_seqs)
        if runner.model.backend.graph_reads_full_tables:
            max_model_len = min(max_model_len, MAX_GRAPH_CONTEXT)
        width = -(-max_model_len // runner.block_size)
        self.inputs = StaticDecodeInputs.allocate(self.sizes[-1], width, scratch_block, runner.block_size,
                                                  runner.device)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.plans: dict[int, Any] = {}  # per size: the backend's decode plan over the static tables
        self.capture_seconds = 0.0
        self.graph_bytes = 0

    def can_run(self, chunks: list[SeqChunk]) -> bool:
        """A pure decode step (one token per sequence, its logits wanted) that fits a captured size."""
        return (bool(self.graphs) and len(chunks) <= self.sizes[-1]
                and all(len(c.token_ids) == 1 and c.num_logits == 1 and len(c.block_table) <= self.inputs.width
                        for c in chunks))

    def _batch(self, rows: int) -> AttentionBatch:
        cache = self.runner.kv_caches[0][0]
        return self.inputs.batch(rows, cache.shape[0], cache.shape[2], self.plans.get(rows))

    def _forward(self, rows: int) -> torch.Tensor:
        r = self.runner
        batch = self._batch(rows)
        hidden = r.model(self.inputs.ids[:rows], self.inputs.positions[:rows], batch, r.kv_caches)
        return r.model.logits(hidden)

    def capture(self) -> None:
        """One graph per size, largest first (the smaller ones reuse its memory pool)."""
        device = self.runner.device
        torch.cuda.synchronize(device)
        free_before = torch.cuda.mem_get_info(device)[0]
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        backend = self.runner.model.backend
        for rows in reversed(self.sizes):
            self.plans[rows] = backend.graph_decode_plan(self._batch(rows), self.inputs.width * self.inputs.block_size)
            self._forward(rows)  # warm-up: kernels load, allocator settles, outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = self._forward(rows)
            self.graphs[rows] = (graph, logits)
        torch.cuda.synchronize(device)
        self.capture_seconds = time.perf_counter() - start
        self.graph_bytes = free_before - torch.cuda.mem_get_info(device)[0]
        log.info("captured %d decode CUDA graphs (batch %s) in %.1f s, %.1f MiB", len(self.graphs),
                 ",".join(map(str, self.sizes)), self.capture_seconds, self.graph_bytes / 2**20)

    def prepare(self, chunks: list[SeqChunk]) -> Any:
        return _Replay(chunks) if self.can_run(chunks) else self.inner.prepare(chunks)

    def forward(self, prepared: Any) -> torch.Tensor:
        """Float32 logits in chunk order; a replay's are valid until the next replay."""
        if not isinstance(prepared, _Replay):
            return self.inner.forward(prepared)
        chunks = prepared.chunks
        self.inputs.fill(chunks)
        graph, logits = self.graphs[padded_size(len(chunks), self.sizes)]
        graph.replay()
        return logits[:len(chunks)]

    def run(self, chunks: list[SeqChunk]) -> torch.Tensor:
        return self.forward(self.prepare(chunks))

    def close(self) -> None:
        self.inner.close()

    def failure(self) -> str | None:
        return self.inner.failure()

    def describe(self) -> dict[str, str]:
        return {**self.inner.describe(), "cuda graphs": f"decode at batch {', '.join(map(str, self.sizes))} (captured "
                f"in {self.capture_seconds:.1f} s, {self.graph_bytes / 2**20:.0f} MiB)"}
