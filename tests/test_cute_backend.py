"""The cute backend's wiring, on the CPU: which ops take the kernels, the switch to the paged decode
kernel once its host entry exists, and the references it keeps for inputs no kernel takes."""
from __future__ import annotations

import sys
import types

import torch

from cute_kernels import reference
from cute_kernels.attention_args import DecodeArgs
from runtime.model import cute_backend
from runtime.model.attention_batch import AttentionBatch
from runtime.model.cute_backend import CuteBackend


def test_decode_runs_the_reference_until_the_kernel_exists():
    backend = CuteBackend()
    assert cute_backend.decode_kernel() is None and "torch reference decode" in backend.describe()
    batch = AttentionBatch(torch.zeros(1, dtype=torch.int64), 4, 16, num_decode_tokens=1,
                           decode_block_tables=torch.zeros(1, 1, dtype=torch.int32),
                           decode_context_lens=torch.ones(1, dtype=torch.int32))
    backend.plan(batch)
    assert batch.decode_plan is not None, "the reference's gather plan"


def test_the_decode_kernel_is_picked_up_from_its_host_module(monkeypatch):
    calls = []
    module = types.ModuleType(cute_backend.DECODE_HOST)
    module.decode_attention = lambda args: calls.append(args) or args.q
    module.__spec__ = types.SimpleNamespace(name=cute_backend.DECODE_HOST)  # what find_spec reads
    monkeypatch.setitem(sys.modules, cute_backend.DECODE_HOST, module)
    backend = CuteBackend()
    assert backend.describe().endswith("; decode")
    batch = AttentionBatch(torch.zeros(1, dtype=torch.int64), 4, 16, num_decode_tokens=1)
    backend.plan(batch)
    assert batch.decode_plan is None, "the kernel reads the block tables itself: no gather plan"
    q = torch.randn(1, 4, 64)
    assert backend.decode(DecodeArgs(q, None, None, None, None, 0.125)) is q and len(calls) == 1


def test_inputs_no_kernel_takes_run_the_references():
    """fp32 and CPU tensors never reach a kernel (the kernels' host code would refuse them)."""
    backend = CuteBackend()
    x, w = torch.randn(3, 64), torch.rand(64)
    h, res = backend.add_rms_norm(x, None, w, 1e-5)
    torch.testing.assert_close(h, reference.add_rms_norm_ref(x, None, w, 1e-5)[0])
    gate_up = torch.randn(2, 32, dtype=torch.bfloat16)
    torch.testing.assert_close(backend.silu_and_mul(gate_up), reference.silu_and_mul_ref(gate_up))
