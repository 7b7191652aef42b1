"""--kv-role prefill|decode: the KV-transfer connector plugged into a built engine's scheduler (both: none)."""
from __future__ import annotations

from runtime.engine import LLMEngine
from runtime.engine_config import KV_ROLES, EngineConfig
from runtime.errors import UserError
from runtime.tiers.block_io import BlockIO
from runtime.tiers.kv_transfer.connector import TransferConnector


def wants_transfer(config: EngineConfig, tiered: bool) -> bool:
    """Whether the settings ask for a disaggregated role; UserError (before any model loads) for ones it
    cannot run with."""
    if config.kv_role not in KV_ROLES:
        raise UserError(f"unknown kv_role {config.kv_role!r} (choose from {', '.join(KV_ROLES)})")
    if config.kv_role == "both":
        return False
    flag = f"--kv-role {config.kv_role}"
    if not config.enable_prefix_caching or config.scheduler != "continuous":
        raise UserError(f"{flag} moves prefix blocks: it needs prefix caching and continuous batching")
    if config.tensor_parallel_size * config.pipeline_parallel_size > 1:
        raise UserError(f"{flag} moves one process's KV: not yet with --tensor-parallel-size or "
                        "--pipeline-parallel-size > 1")
    if tiered:
        raise UserError(f"{flag} and the KV tiers (--kv-offload-bytes / --kv-disk-path) share one connector seam: "
                        "not yet together")
    if config.kv_transfer_timeout <= 0 or config.kv_hold_timeout <= 0:
        raise UserError("--kv-transfer-timeout and --kv-hold-timeout must be > 0 seconds")
    return True


def attach_transfer(engine: LLMEngine, fp: bytes) -> TransferConnector:
    """fp: the engine's block fingerprint (tiers.fingerprint): both instances' must agree, or a block from
    another model or settings is refused and the prompt recomputed."""
    config = engine.config
    serve_at = (config.kv_transfer_host, config.kv_transfer_port) if config.kv_role == "prefill" else None
    connector = TransferConnector(BlockIO(engine.model_runner.kv_caches), fp, engine.stats, serve_at,
                                  config.kv_transfer_timeout, config.kv_hold_timeout)
    engine.scheduler.connector = connector
    engine.runner = ClosingRunner(engine.runner, connector)
    return connector


class ClosingRunner:
    """The engine's runner, unchanged, but closing it stops the connector's threads and port too."""

    def __init__(self, inner, connector: TransferConnector) -> None:
        self.inner, self.connector, self.closed = inner, connector, False

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.connector.close()
        self.inner.close()
