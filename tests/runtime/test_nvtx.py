"""NVTX ranges: named, balanced and nested as nsys will show them; on the CPU they are never entered."""
import runtime.nvtx as nvtx
from runtime.sampling_params import SamplingParams
from tests.tiny_engine import tiny_engine


def test_a_step_pushes_balanced_named_ranges(monkeypatch):
    events: list[str] = []
    monkeypatch.setattr(nvtx, "ON", True)  # as on a CUDA machine, with the calls recorded instead
    monkeypatch.setattr(nvtx, "push", lambda name: events.append(name))
    monkeypatch.setattr(nvtx, "pop", lambda: events.append("/"))
    engine = tiny_engine()
    engine.add_request("r", list(range(3, 40)), SamplingParams(max_tokens=2, ignore_eos=True))
    engine.step()
    layer = ["attention", "/", "mlp", "/"]
    assert events == ["propose", "/", "schedule", "/", "prepare", "/", "forward",
                      *layer * engine.model_config.num_layers, "/", "sample", "/", "output", "/"]


def test_ranges_are_off_without_cuda():
    import torch

    assert nvtx.ON == torch.cuda.is_available()
