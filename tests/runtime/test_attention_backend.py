"""The kernel seam: which backend select_backend picks, that describe() names what runs, that the
fp32 CPU backend really runs the C kernels, and that the runner hands max_seqlen_q to the kernels."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from cute_kernels.cpu import decode_attention as cpu_decode
from cute_kernels.cpu import prefill_attention as cpu_prefill
from runtime.accel.cpu_backend import CpuBackend
from runtime.accel.select_backend import select_backend
from runtime.errors import UserError
from runtime.model.torch_backend import TorchBackend
from runtime.sequence import SeqChunk
from tests.paths import REPO
from tests.tiny_engine import tiny_engine

CPU = torch.device("cpu")
ALL_C = "torch reference + C prefill and paged decode attention + C fused norm/rope/silu (CPU)"


def test_fp32_on_the_cpu_runs_the_c_kernels_and_says_so(monkeypatch):
    for name in ("torch", "auto"):
        backend = select_backend(name, CPU, torch.float32)
        assert isinstance(backend, CpuBackend) and backend.describe() == ALL_C
    engine = tiny_engine()
    assert engine.model_runner.model.backend.describe() == ALL_C
    calls = []
    monkeypatch.setattr(cpu_prefill, "prefill_attention_cpu", lambda args, real=cpu_prefill.prefill_attention_cpu:
                        calls.append("prefill") or real(args))
    monkeypatch.setattr(cpu_decode, "decode_attention_cpu", lambda args, real=cpu_decode.decode_attention_cpu:
                        calls.append("decode") or real(args))
    engine.runner.run([SeqChunk([5], 3, [0]), SeqChunk(list(range(3, 20)), 0, [1, 2])])  # one decode, one prefill
    layers = len(engine.model_runner.model.layers)
    assert calls == ["decode", "prefill"] * layers


def test_other_dtypes_run_the_references():
    backend = select_backend("torch", CPU, torch.bfloat16)
    assert type(backend) is TorchBackend and backend.describe() == "torch reference"


_WITHOUT_C = """
import torch
from runtime.accel.select_backend import select_backend
backend = select_backend("torch", torch.device("cpu"), torch.float32)
print(type(backend).__name__, "|", backend.describe())
"""


def test_cpu_kernels_switched_off_run_the_references():
    env = {**os.environ, "CUTE_SERVE_CPU_KERNELS": "0", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", _WITHOUT_C], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "TorchBackend | torch reference"


def test_bad_or_unavailable_backends_are_user_errors():
    with pytest.raises(UserError, match=r"unknown backend 'tpu' \(choose torch, cute or auto\)"):
        select_backend("tpu", CPU)
    with pytest.raises(UserError, match="the cute backend cannot run here: not a CUDA device"):
        select_backend("cute", CPU)


def test_the_runner_gives_prefill_the_longest_chunk_without_a_sync(monkeypatch):
    engine = tiny_engine()
    runner = engine.runner
    chunks = [SeqChunk([7], 20, [0, 1]), SeqChunk(list(range(3, 40)), 0, [2, 3, 4]),
              SeqChunk(list(range(4, 12)), 16, [5, 6])]
    _, _, batch, _ = runner.prepare(chunks)
    assert (batch.max_seqlen_q, batch.max_prefix_len) == (37, 16)
    assert (batch.num_blocks, batch.block_size) == tuple(runner.kv_caches[0][0].shape[:2])
    seen = []
    backend = runner.model.backend
    monkeypatch.setattr(backend, "prefill", lambda args, real=backend.prefill: seen.append(args) or real(args))
    runner.run(chunks)
    assert [args.max_seqlen_q for args in seen] == [37] * len(runner.model.layers)
    assert all(args.plan is seen[0].plan is not None for args in seen)  # planned once for every layer
