"""Settings the engine refuses only once it knows the device: each a one-line error and exit code 2
through the CLI plumbing (runtime.cli.run_main), checked on the CPU by faking the device check."""
import pytest
import torch

import runtime.build as build_module
from runtime.cli import run_main
from tests.tiny_engine import tiny_engine


def one_line_exit(capsys, build) -> str:
    with pytest.raises(SystemExit) as exit_:
        run_main(build, "runtime.generate")
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err and "Traceback" not in err, err
    return err


def test_cpu_only_quantization_on_cuda_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setattr(build_module, "resolve_device", lambda _: torch.device("cuda"))
    for mode in ("int8", "q4"):
        err = one_line_exit(capsys, lambda: tiny_engine(quantization=mode))
        assert err.startswith("runtime.generate: error:") and mode in err


def test_one_kv_block_with_cuda_graphs_is_a_one_line_error(capsys, monkeypatch):
    monkeypatch.setattr(build_module, "uses_graphs", lambda device, enforce_eager: True)
    err = one_line_exit(capsys, lambda: tiny_engine(num_blocks=1))
    assert "one block" in err and "--enforce-eager" in err
