"""vLLM's CPU build as a peer in our benchmarks: a script run in vLLM's own Python and environment (it pins its
own torch, so it usually lives in a separate virtual environment) on an HF folder exported from the same
weights, with vLLM's own CPU recipe (tcmalloc and Intel OpenMP preloaded) where present."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile


def vllm_python(given: str | None) -> str | None:
    """The Python to run vLLM with: the one given, else this one when it imports vllm."""
    return given or (sys.executable if importlib.util.find_spec("vllm") else None)


def run_vllm_script(python: str, model_path: str, script: str, spec: dict) -> dict:
    """Runs `script` (argv: a spec JSON holding spec plus "model", the folder; an output JSON path) and returns
    the JSON it wrote, its "engine" marked +preload when the recipe's libraries were preloaded."""
    from profiling.common.hf_export import export_hf_folder
    from weights.load import load_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        folder = os.path.join(tmp, "hf")
        export_hf_folder(load_checkpoint(model_path), None, folder)
        _write_tokenizer(model_path, folder)
        spec_file, out, script_file = (os.path.join(tmp, n) for n in ("spec.json", "out.json", "run_vllm.py"))
        json.dump({**spec, "model": folder}, open(spec_file, "w"))
        open(script_file, "w").write(script)
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
        preload = vllm_preload(python)
        if preload:  # vLLM's own CPU recipe: tcmalloc and Intel OpenMP, worth +4-13% (PEERS.md)
            env["LD_PRELOAD"] = ":".join([*preload, *filter(None, [os.environ.get("LD_PRELOAD")])])
        print(f"  vLLM LD_PRELOAD: {env.get('LD_PRELOAD', 'none (apt-get install libtcmalloc-minimal4)')}", flush=True)
        subprocess.run([python, script_file, spec_file, out], check=True, env=env)
        result = json.load(open(out))
        result["engine"] += "+preload" if preload else ""
        return result


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
