"""--kv-cache-dtype fp8_e4m3 on CUDA, the parts a CPU can check: which compute dtypes and backends read it
(one-line UserErrors for the rest), the ledger and the allocation (on the meta device), and the calibration
pass in the compute dtype. The same engine on a GPU, graphs and eager:
tests/runtime/accel/test_cuda_graphs.py::test_graph_replay_equals_eager_gpu; the backend's argument
plumbing: tests/runtime/accel/test_cute_backend.py."""
from __future__ import annotations

import pytest
import torch

from runtime.accel import kv_scales
from runtime.accel.cute_backend import CuteBackend
from runtime.device import resolve_kv_dtype
from runtime.errors import UserError
from runtime.kv.cache import allocate_kv_cache, plan_kv_cache
from runtime.model.torch_backend import TorchBackend
from tests.tiny_engine import tiny_engine, tiny_weights

CUDA = torch.device("cuda")


@pytest.mark.parametrize("compute", [torch.bfloat16, torch.float16])
def test_cuda_reads_an_e4m3_cache_under_16bit_compute(compute):
    assert resolve_kv_dtype("fp8_e4m3", compute, CUDA) == torch.float8_e4m3fn
    assert resolve_kv_dtype("auto", compute, CUDA) == compute


@pytest.mark.parametrize("name,compute", [("int8", torch.bfloat16), ("fp8_e4m3", torch.float32),
                                          ("float32", torch.bfloat16)])
def test_caches_no_cuda_kernel_reads_are_refused(name, compute):
    with pytest.raises(UserError, match=f"--kv-cache-dtype {name} differs .*on CUDA only fp8_e4m3") as e:
        resolve_kv_dtype(name, compute, CUDA)
    assert "\n" not in str(e.value)


def test_only_the_cute_backend_reads_an_e4m3_cache_on_cuda():
    kv_scales.check_reader(CuteBackend(), torch.float8_e4m3fn, CUDA)
    with pytest.raises(UserError, match="the cute backend does not read a int8 KV cache"):
        kv_scales.check_reader(CuteBackend(), torch.int8, CUDA)
    with pytest.raises(UserError, match="read by the cute backend's kernels only, not by the torch backend") as e:
        kv_scales.check_reader(TorchBackend(), torch.float8_e4m3fn, CUDA)  # the reference: far slower, refused
    assert "\n" not in str(e.value)


def test_an_e4m3_cache_holds_twice_bf16s_tokens_allocated_as_e4m3():
    cfg, _ = tiny_weights()
    budget = 1 << 20
    e4m3, bf16 = (plan_kv_cache(cfg, budget, 16, dtype) for dtype in (torch.float8_e4m3fn, torch.bfloat16))
    assert e4m3.num_blocks == 2 * bf16.num_blocks and e4m3.bytes_per_token * 2 == bf16.bytes_per_token
    caches = allocate_kv_cache(cfg, e4m3, "meta", torch.float8_e4m3fn)
    assert len(caches) == cfg.num_layers
    for cache in (c for pair in caches for c in pair):
        assert cache.dtype == torch.float8_e4m3fn and cache.device.type == "meta"
        assert cache.shape == (e4m3.num_blocks, 16, cfg.num_kv_heads, cfg.head_dim)


def test_calibration_runs_in_the_compute_dtype(monkeypatch):
    """A GPU's kernels read no float32 cache: the pass's cache is the model's compute dtype (bf16 here)."""
    from runtime.build import make_runner

    cfg, tensors = tiny_weights()
    runner, _ = make_runner(cfg, tensors, 1 << 20, dtype=torch.bfloat16, backend="torch")
    seen = []
    real = kv_scales.ModelRunner

    def recording(model, caches, *args):
        seen.extend(c.dtype for pair in caches for c in pair)
        return real(model, caches, *args)

    monkeypatch.setattr(kv_scales, "ModelRunner", recording)
    scales = kv_scales.calibrate(runner.model, list(range(3, 200)), torch.float8_e4m3fn, torch.device("cpu"))
    assert seen and set(seen) == {torch.bfloat16}
    assert all(s.k.dtype == torch.float32 and bool((s.k > 0).all() and (s.v > 0).all()) for s in scales)


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3"])
def test_pipeline_stages_with_a_quantized_cache_are_one_line_errors(name):
    with pytest.raises(UserError, match="pipeline stages do not shard an 8-bit cache") as e:
        tiny_engine(kv_cache_dtype=name, pipeline_parallel_size=2)
    assert "\n" not in str(e.value)
