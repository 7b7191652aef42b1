"""Tiers below an engine's KV pool, from its settings (--kv-offload-bytes, --kv-disk-path): the connector
plugged into the scheduler and the pool, and a runner whose close() writes the cached blocks out."""
from __future__ import annotations

from dataclasses import dataclass

from runtime.engine import LLMEngine
from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.kv.cache import KVLedger
from runtime.model.runner import ModelRunner, RunnerWithClose
from runtime.tiers.block_io import BlockIO
from runtime.tiers.connector import Tier, TieredConnector
from runtime.tiers.disk_tier import DiskTier
from runtime.tiers.fingerprint import fingerprint
from runtime.tiers.host_tier import HostTier
from weights.config import ModelConfig


def wants_tiers(config: EngineConfig) -> bool:
    """Whether the settings ask for tiers; UserError (before any model loads) for settings they cannot run with."""
    if not (config.kv_offload_bytes or config.kv_disk_path):
        return False
    flags = "--kv-offload-bytes / --kv-disk-path"
    if not config.enable_prefix_caching or config.scheduler != "continuous":
        raise UserError(f"{flags} keep prefix blocks: they need prefix caching and continuous batching")
    if config.tensor_parallel_size * config.pipeline_parallel_size > 1:
        raise UserError(f"{flags} hold one process's KV: not yet with --tensor-parallel-size or "
                        "--pipeline-parallel-size > 1")
    return True


@dataclass
class OpenTiers:
    fingerprint: bytes
    tiers: list[Tier]


def open_tiers(config: EngineConfig, runner: ModelRunner, ledger: KVLedger, cfg: ModelConfig) -> OpenTiers:
    """The tiers the settings ask for (wants_tiers said yes), named in the ledger before the engine logs it.
    Runs the fingerprint's probe in the pool's first block: before any request."""
    fp = fingerprint(runner, ledger, cfg)
    tiers: list[Tier] = [HostTier(config.kv_offload_bytes)] if config.kv_offload_bytes else []
    if config.kv_disk_path:
        tiers.append(DiskTier(config.kv_disk_path, config.kv_disk_bytes, fp))
    ledger.tiers = ", ".join(t.describe() for t in tiers)
    return OpenTiers(fp, tiers)


def attach_tiers(engine: LLMEngine, opened: OpenTiers) -> None:
    """Plug the tiers into the built engine's scheduler, pool and runner."""
    connector = TieredConnector(BlockIO(engine.model_runner.kv_caches), opened.fingerprint, opened.tiers,
                                engine.stats)
    engine.scheduler.connector = connector
    engine.pool.on_evict = connector.offer
    pool = engine.pool
    engine.runner = RunnerWithClose(engine.runner, lambda: connector.close(  # the cached blocks written out
        [(b, h, pool.block_tokens[b]) for h, b in pool.cached.items()]))
