"""The engine flags are generated from EngineConfig's fields: same names, defaults and parsing as the fields say."""
from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from runtime.engine_config import EngineConfig, add_engine_args, config_from_args, parse_bytes
from runtime.errors import UserError

NOT_FLAGS = {"kv_cache_fraction", "log_ledger"}  # set from Python only (LLM(...), the server's own ledger print)
FLAGS = ["--model", "--device", "--dtype", "--backend", "--quantization", "--kv-cache-dtype", "--calculate-kv-scales",
         "--no-calculate-kv-scales", "--block-size",
         "--kv-cache-memory", "--kv-offload-bytes", "--kv-disk-path", "--kv-disk-bytes", "--kv-events-config",
         "--kv-role", "--kv-transfer-host", "--kv-transfer-port", "--kv-transfer-timeout", "--kv-hold-timeout",
         "--max-num-batched-tokens", "--max-num-seqs", "--max-model-len", "--scheduler",
         "--enable-prefix-caching", "--no-enable-prefix-caching", "--speculative", "--num-speculative-tokens",
         "--draft-model", "--speculative-model", "--ngram-min", "--ngram-max", "--tensor-parallel-size",
         "--pipeline-parallel-size", "--distributed-executor-backend", "--distributed-timeout", "--engine-seed", "--enforce-eager",
         "--no-enforce-eager", "--generation-config", "--deterministic", "--no-deterministic"]


def engine_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.Action]]:
    p = argparse.ArgumentParser()
    add_engine_args(p)
    return p, {a.dest: a for a in p._actions if a.dest != "help"}


def test_flags_are_exactly_the_cli_contract():
    _, actions = engine_parser()
    assert [s for a in actions.values() for s in a.option_strings] == FLAGS
    assert isinstance(actions["enable_prefix_caching"], argparse.BooleanOptionalAction)
    assert actions["kv_cache_memory"].type is parse_bytes
    assert actions["kv_offload_bytes"].type is parse_bytes and actions["kv_disk_bytes"].type is parse_bytes
    assert actions["engine_seed"].option_strings == ["--engine-seed"]
    assert list(actions["dtype"].choices) == ["auto", "half", "float16", "bfloat16", "float", "float32"]  # vLLM's spelling
    assert list(actions["backend"].choices) == ["auto", "torch", "cute"]
    assert list(actions["scheduler"].choices) == ["continuous", "static"]
    assert list(actions["speculative"].choices) == ["ngram", "suffix", "draft", "medusa", "eagle"]
    assert list(actions["generation_config"].choices) == ["auto", "vllm"]
    assert list(actions["quantization"].choices) == ["int8", "q4", "fp8", "none"]
    assert list(actions["distributed_executor_backend"].choices) == ["auto", "mp", "external_launcher"]  # vLLM's names


def test_every_field_but_the_python_only_ones_has_a_flag_with_its_default():
    _, actions = engine_parser()
    dest = {"seed": "engine_seed"}
    for f in fields(EngineConfig):
        if f.name in NOT_FLAGS:
            assert dest.get(f.name, f.name) not in actions, f.name
            continue
        action = actions[dest.get(f.name, f.name)]
        assert action.default == f.default, f.name
        assert action.help, f.name


def test_no_flags_give_the_default_config_and_flags_reach_their_fields():
    p, _ = engine_parser()
    assert config_from_args(p.parse_args([])) == EngineConfig()
    args = p.parse_args(["--kv-cache-memory", "2GiB", "--engine-seed", "7", "--no-enable-prefix-caching",
                         "--speculative", "ngram", "--max-model-len", "256", "--model", "m.gguf",
                         "--tensor-parallel-size", "3"])
    assert config_from_args(args) == EngineConfig(kv_cache_memory=2 << 30, seed=7, enable_prefix_caching=False,
                                                  speculative="ngram", max_model_len=256, model="m.gguf",
                                                  tensor_parallel_size=3)


@pytest.mark.parametrize("layout", [dict(tensor_parallel_size=2), dict(pipeline_parallel_size=2)])
def test_deterministic_is_refused_where_the_ranks_do_not_take_it(layout):
    with pytest.raises(UserError, match="deterministic: not with tensor_parallel_size or pipeline_parallel_size"):
        EngineConfig(deterministic=True, **layout)
