"""The composition point: an engine built from its settings, with the wings those settings ask for.

The core (engine, scheduler, KV blocks, sampling, the model over its seams) imports no wing; this module
(and the wings themselves) is where they come in: the runner (this process's model, or tensor-parallel
ranks of it, wrapped in CUDA-graph replay where that applies), the linears that hold the weights
(quantized, FP8, packed), the kernel backend, the speculative proposer, the KV tiers and KV events.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from cute_kernels.kv_quant import is_quantized
from runtime.accel.block_linear import hand_glu_rows_to_down
from runtime.accel.cuda_graphs import GraphedRunner, uses_graphs
from runtime.accel.host_allocator import tune_host_allocator
from runtime.accel.kv_scales import KVScaleSource, calibration_ids, pop_kv_scales, set_kv_scales
from runtime.accel.linears import QuantizedLinears
from runtime.accel.quantization import unavailable_reason as quantization_unavailable
from runtime.accel.select_backend import select_backend
from runtime.device import (
    default_dtype,
    default_kv_dtype,
    kv_budget,
    resolve_device,
    resolve_dtype,
    resolve_kv_dtype,
    resolve_weight_dtype,
)
from runtime.engine import LLMEngine
from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.kv.cache import KVLedger, allocate_kv_cache, plan_kv_cache
from runtime.kv_events.attach import attach_kv_events
from runtime.kv_events.config import parse_kv_events_config
from runtime.load import load_model
from runtime.model.build import build_model
from runtime.model.runner import EngineParts, ModelRunner, Runner
from runtime.parallel.group import GroupSpec, ParallelGroup
from runtime.parallel.launch import Launch, check_world, from_env, group_spec, local_device, set_threads
from runtime.parallel.plan import Layout
from runtime.parallel.runner import agreed_blocks, make_parallel_runner
from runtime.parallel.worker import RankSpec, build_rank_runner, connect, rank_tensors, serve_steps, share_bytes
from runtime.sequence import Proposer
from runtime.spec.draft_model import DraftModelProposer
from runtime.spec.head_proposer import HeadProposer
from runtime.spec.heads import KINDS as HEAD_KINDS
from runtime.spec.heads import default_heads_path, load_heads
from runtime.spec.hidden_tap import HiddenTap
from runtime.spec.ngram import NgramProposer
from runtime.spec.step_clock import StepClock
from runtime.spec.suffix import SuffixProposer
from runtime.spec.throttle import Throttle
from runtime.tiers.attach import attach_tiers, open_tiers, wants_tiers
from runtime.tiers.fingerprint import fingerprint
from runtime.tiers.kv_transfer.attach import attach_transfer, wants_transfer
from runtime.tokenizer.tokenizer import Tokenizer
from weights.config import ModelConfig
from weights.quantized import as_float


def build_engine(config: EngineConfig, model_config: ModelConfig, tensors: dict[str, torch.Tensor],
                 tokenizer: Tokenizer) -> LLMEngine:
    """Consumes `tensors`. UserError (one line) for settings this device or model cannot run."""
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, dtype, device)
    layout, launch = parallel_layout(config, model_config)  # before anything is built
    ranks = layout.world_size
    if launch is not None:
        device = local_device(launch, device)
        set_threads(launch)
    split = "tensor-parallel ranks" if layout.tp > 1 else "pipeline stages"
    weight_dtype = resolve_weight_dtype(config.dtype, device, tensors)
    if ranks > 1 and weight_dtype is not None:
        if config.dtype != "auto":
            raise UserError(f"--dtype {config.dtype}: {split} hold float weights in float32 only (use --dtype float32)")
        weight_dtype = None  # the start-up log's "float32 x N" says so
    if ranks > 1 and is_quantized(kv_dtype):
        raise UserError(f"--kv-cache-dtype {config.kv_cache_dtype}: {split} do not shard an 8-bit cache's "
                        "scales yet (use --kv-cache-dtype auto, bf16 or float32)")
    calibration = calibration_ids(tokenizer.encode) if is_quantized(kv_dtype) else None
    if (reason := quantization_unavailable(config.quantization, device)) is not None:
        raise UserError(reason)
    if layout.pp > 1 and config.speculative in HEAD_KINDS:
        raise UserError(f"--speculative {config.speculative} reads the final hidden states, which live on the last "
                        "pipeline stage: not with --pipeline-parallel-size > 1")
    max_model_len = min(model_config.max_position_embeddings, config.max_model_len or 1 << 62)
    tiered = wants_tiers(config)
    events = parse_kv_events_config(config.kv_events_config)  # a bad field fails before the model loads
    transfers = wants_transfer(config, tiered)
    if device.type == "cpu":
        tune_host_allocator()
    # The draft comes first and the target's KV budget is read last, so free memory excludes both models.
    proposer = make_proposer(config, model_config, device, dtype)
    budget = lambda: kv_budget(config, device, launch.local_world_size if launch else ranks)  # noqa: E731
    if ranks == 1:
        local, ledger = make_runner(model_config, tensors, budget, config.block_size, device, dtype, config.backend,
                                    config.quantization, kv_dtype, config.deterministic,
                                    KVScaleSource(calibration, config.calculate_kv_scales), weight_dtype)
        runner: Runner = local
    else:
        spec = (group_spec(launch, layout, device, config.distributed_timeout) if launch else
                GroupSpec.create(layout, device, config.distributed_timeout))
        runner, ledger = make_parallel_runner(model_config, tensors, budget, config.block_size, device, dtype,
                                              config.backend, spec, make_runner, config.quantization, launch is not None,
                                              kv_dtype)
        local = runner.local
    ledger.require_blocks()
    heads = config.speculative in HEAD_KINDS  # they read the target's hidden states, which a replayed graph keeps to itself
    runner, pool_blocks = (runner, ledger.num_blocks) if heads else _with_graphs(config, runner, local, ledger,
                                                                                 max_model_len)
    if heads:
        runner = HiddenTap(runner, local)
        proposer = Throttle(heads_proposer(config, model_config, local, runner), clock=_step_clock(config))
    tiers = open_tiers(config, local, ledger, model_config) if tiered else None
    transfer_fp = fingerprint(local, ledger, model_config) if transfers else None  # before any request
    engine = LLMEngine(config, model_config, tokenizer,
                       EngineParts(runner, local, ledger, pool_blocks, device, dtype, max_model_len, proposer))
    if tiers is not None:
        attach_tiers(engine, tiers)
    if events is not None:
        attach_kv_events(engine, events)
    if transfer_fp is not None:
        attach_transfer(engine, transfer_fp)
    return engine


def _with_graphs(config: EngineConfig, runner: Runner, local: ModelRunner, ledger: KVLedger,
                 max_model_len: int) -> tuple[Runner, int]:
    """Decode graphs on CUDA unless --enforce-eager (tensor-parallel steps run eagerly: their collectives
    span processes); their scratch KV block is the last, kept out of the pool. (runner, pool blocks)."""
    parallel = config.tensor_parallel_size * config.pipeline_parallel_size > 1
    if not uses_graphs(local.device, config.enforce_eager) or parallel:
        return runner, ledger.num_blocks
    if ledger.num_blocks < 2:
        raise UserError("the KV cache budget holds one block only, and CUDA graphs need one more as scratch: "
                        "raise --kv-cache-memory or pass --enforce-eager")
    graphs = GraphedRunner(local, config.max_num_seqs, max_model_len, ledger.num_blocks - 1, inner=runner)
    graphs.capture()
    return graphs, ledger.num_blocks - 1


def parallel_layout(config: EngineConfig, model_config: ModelConfig | None = None) -> tuple[Layout, Launch | None]:
    """The TP x PP layout the flags ask for and the launcher's world, if one started this process; UserError
    when the model does not split so, or the launcher's world size is another."""
    layout = Layout(config.tensor_parallel_size, config.pipeline_parallel_size)
    if model_config is not None:
        layout.check(model_config)
    launch = from_env(config.distributed_executor_backend)
    if launch is None and layout.world_size > 1 and config.distributed_executor_backend == "external_launcher":
        raise UserError("--distributed-executor-backend external_launcher: no launcher's RANK/WORLD_SIZE set")
    if launch is not None:
        check_world(launch, layout)
    return layout, launch


def serve_launched_rank(config: EngineConfig, model_config: ModelConfig, tensors: dict[str, torch.Tensor],
                        launch: Launch) -> None:
    """A launched rank other than 0, headless: its part of the model, then rank 0's steps until it stops.
    Consumes `tensors`."""
    layout, _ = parallel_layout(config, model_config)
    device = local_device(launch, resolve_device(config.device))
    dtype = resolve_dtype(config.dtype, device)
    set_threads(launch)
    spec = group_spec(launch, layout, device, config.distributed_timeout)
    for name, t in tensors.items():
        tensors[name] = as_float(t)
    rank = RankSpec(launch.rank, model_config, rank_tensors(model_config, tensors, spec, launch.rank),
                    config.block_size, str(device), dtype, config.backend, torch.get_num_threads(), spec,
                    make_runner, config.quantization)
    tensors.clear()
    group = ParallelGroup(spec, launch.rank, device)
    runner, ledger = build_rank_runner(rank, lambda: agreed_blocks(
        group, kv_budget(config, device, launch.local_world_size) // rank.block_bytes()))
    connect(rank, runner, group)
    share_bytes(group, ledger)
    serve_steps(group, runner)


def make_runner(cfg: ModelConfig, tensors: dict[str, torch.Tensor], kv_budget_bytes: int | Callable[[], int],
                block_size: int = 16, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                backend: str = "auto", quantization: str | None = None, kv_dtype: torch.dtype | None = None,
                deterministic: bool = False, kv_scale_source: KVScaleSource = KVScaleSource(),
                weight_dtype: torch.dtype | None = None) -> tuple[ModelRunner, KVLedger]:
    """This process's model, its kernel backend and paged KV cache. A callable budget is asked only once
    the weights are in place, so free memory it reads excludes them. quantization: see
    runtime/accel/quantization.py (None: a GGUF's quantized weights as shipped). kv_dtype: the KV cache's
    element type (None: dtype). deterministic: batch-invariant linears and attention (every row as a decode row).
    weight_dtype: bfloat16 holds float linear weights in bf16 on the CPU (runtime/accel/bf16_linear.py)."""
    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    kv_dtype = kv_dtype or dtype
    checkpoint_scales = pop_kv_scales(cfg, tensors) if is_quantized(kv_dtype) else None
    linears = QuantizedLinears(quantization, device, dtype, cfg.fp8_weight_block == 128, deterministic, weight_dtype)
    attention = select_backend(backend, device, dtype)
    attention.batch_invariant = deterministic
    model = build_model(cfg, tensors, attention, device, dtype, linears)
    hand_glu_rows_to_down(model.layers)
    if is_quantized(kv_dtype):
        set_kv_scales(model, kv_dtype, kv_scale_source, checkpoint_scales, device)
    budget = kv_budget_bytes() if callable(kv_budget_bytes) else kv_budget_bytes
    ledger = plan_kv_cache(cfg, budget, block_size, kv_dtype, model.weight_bytes(), model.quantization())
    caches = allocate_kv_cache(cfg, ledger, device, kv_dtype)
    return ModelRunner(model, caches, block_size, device, deterministic), ledger


def make_proposer(config: EngineConfig, target: ModelConfig, device: torch.device,
                  dtype: torch.dtype) -> Proposer | None:
    """The proposer --speculative asks for (None without the flag)."""
    if config.speculative is None:
        return None
    if config.num_speculative_tokens < 1:
        raise UserError("--num-speculative-tokens must be >= 1")
    if config.speculative in ("ngram", "suffix"):
        try:
            return Throttle(NgramProposer(config.ngram_min, config.ngram_max) if config.speculative == "ngram"
                            else SuffixProposer(), clock=_step_clock(config))
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if config.speculative == "draft":
        if not config.draft_model:
            raise UserError("--speculative draft needs --draft-model PATH")
        draft_cfg, tensors, _, _ = load_model(config.draft_model)
        return draft_proposer(draft_cfg, tensors, target, config, device, dtype)
    if config.speculative in HEAD_KINDS:
        return None  # built with the target's runner (heads_proposer)
    raise UserError(f"unknown speculative method {config.speculative!r} (ngram, suffix, draft, medusa or eagle)")


def heads_proposer(config: EngineConfig, target: ModelConfig, local: ModelRunner, tap: HiddenTap) -> HeadProposer:
    """Trained heads over the target's hidden states: --speculative-model, or the default model's own."""
    path = config.speculative_model or default_heads_path(config.speculative, target)
    try:
        head, draft_ids = load_heads(path, local.model.norm.dtype)
    except (OSError, ValueError) as exc:
        raise UserError(f"--speculative {config.speculative}: cannot load heads from {path}: {exc}") from None
    cfg = head.cfg
    if cfg.kind != config.speculative or cfg.hidden != target.hidden_size or cfg.target_vocab != target.vocab_size:
        raise UserError(f"{path} holds {cfg.kind} heads for a {cfg.hidden}-wide model with {cfg.target_vocab} "
                        f"tokens ({cfg.target!r}); this is --speculative {config.speculative} on {target.name!r}")
    return HeadProposer(head.to(local.device), draft_ids, local.model, tap)


def draft_proposer(draft_cfg: ModelConfig, tensors: dict[str, torch.Tensor], target_cfg: ModelConfig,
                   config: EngineConfig, device: torch.device, dtype: torch.dtype,
                   kv_budget_bytes: int = 256 << 20) -> DraftModelProposer:
    """A draft model sharing the target's tokenizer, with a paged KV cache of its own: of the target's element
    type, so the draft of a model by itself proposes what the target verifies, except an 8-bit one (its scales
    are calibrated for the target's layers), where the draft takes the default."""
    if draft_cfg.vocab_size != target_cfg.vocab_size:
        raise UserError(f"the draft model's vocabulary ({draft_cfg.vocab_size}) differs from the target's "
                        f"({target_cfg.vocab_size}); they must share a tokenizer")
    kv_dtype = resolve_kv_dtype(config.kv_cache_dtype, dtype, device)
    kv_dtype = default_kv_dtype(dtype, device) if is_quantized(kv_dtype) else kv_dtype
    runner, ledger = make_runner(draft_cfg, tensors, kv_budget_bytes, config.block_size, device, dtype,
                                 config.backend, config.quantization, kv_dtype)
    return DraftModelProposer(runner, max(ledger.num_blocks, 1))


def _step_clock(config: EngineConfig) -> StepClock:
    """The throttle's step timer; off under --deterministic (drafts then follow the row-cost model alone)."""
    return StepClock(enabled=not config.deterministic)
