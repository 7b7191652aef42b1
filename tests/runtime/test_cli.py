"""The generate CLI: a real run, and every kind of bad input gives one line and a non-zero exit."""
import json
import os
import subprocess
import sys

import pytest

from tests.model_files import write_tiny_gguf, write_tiny_hf
from tests.paths import REPO


def generate(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "runtime.generate", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout)


def assert_one_line_error(res, *needles):
    assert res.returncode != 0
    err_lines = [l for l in res.stderr.splitlines() if l.strip() and not l.startswith("INFO")]
    assert len(err_lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    for n in needles:
        assert n in err_lines[0], err_lines[0]


def test_chat_run_streams_and_reports_metrics():
    # float weights: on this prompt the first token is a near-tie that int8 activation rounding (the
    # quantized default) tips to a French reply; test_real_model checks the quantized path's quality
    res = generate("--chat", "--prompt", "What is the capital of France?", "--max-tokens", "24",
                   "--kv-cache-memory", "64MiB", "--quantization", "none")
    assert res.returncode == 0, res.stderr
    assert "Paris" in res.stdout
    assert "TTFT" in res.stderr and "TPOT" in res.stderr and "tokens/s" in res.stderr


def test_help_documents_every_flag():
    res = generate("--help")
    assert res.returncode == 0
    for flag in ("--prompt", "--chat", "--system", "--max-tokens", "--temperature", "--top-p", "--seed", "--model"):
        assert flag in res.stdout


def test_missing_model_path():
    assert_one_line_error(generate("--prompt", "hi", "--model", "/nonexistent/model.gguf"), "/nonexistent/model.gguf")


def test_corrupt_and_truncated_gguf(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(os.urandom(4096))
    assert_one_line_error(generate("--prompt", "hi", "--model", str(junk)), "junk.gguf")
    good = tmp_path / "tiny.gguf"
    write_tiny_gguf(str(good))
    data = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    assert_one_line_error(generate("--prompt", "hi", "--model", str(cut)), "cut.gguf")


def test_corrupt_safetensors(tmp_path):
    write_tiny_hf(str(tmp_path))
    st = next(p for p in tmp_path.iterdir() if p.suffix == ".safetensors")
    st.write_bytes(st.read_bytes()[:100])
    assert_one_line_error(generate("--prompt", "hi", "--model", str(tmp_path)))


def test_unsupported_architecture(tmp_path):
    write_tiny_hf(str(tmp_path))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    cfg["model_type"] = "gpt_neox"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert_one_line_error(generate("--prompt", "hi", "--model", str(tmp_path)), "GPTNeoXForCausalLM")


def test_unsupported_quantization(tmp_path):
    path = tmp_path / "mxfp4.gguf"
    write_tiny_gguf(str(path), qtype="MXFP4")
    assert_one_line_error(generate("--prompt", "hi", "--model", str(path)), "MXFP4")


def test_prompt_longer_than_context():
    res = generate("--prompt", "word " * 200, "--max-model-len", "64", "--kv-cache-memory", "64MiB")
    assert_one_line_error(res, "context length of 64")


@pytest.mark.parametrize("args,needle", [(["--temperature", "-1"], "temperature"), (["--top-p", "0"], "top_p"),
                                         (["--max-tokens", "0"], "max_tokens"), (["--kv-cache-memory", "lots"], "lots"),
                                         (["--tensor-parallel-size", "0"], "tensor_parallel_size")])
def test_bad_flags(args, needle):
    res = generate("--prompt", "hi", "--kv-cache-memory", "64MiB", *args) if "--kv-cache-memory" not in args \
        else generate("--prompt", "hi", *args)
    assert res.returncode != 0 and "Traceback" not in res.stderr and needle in res.stderr
