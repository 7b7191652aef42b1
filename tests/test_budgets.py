"""Size and shape budgets, held by CI: the runtime core stays readable in an afternoon, its wings plug in
at one composition point, no file or folder grows into a hall.

The sets, by path (a new module counts as core unless it is put in a wing, the server or the front):
- WINGS: runtime/accel/ (CPU and CuTe backends, backend selection, CUDA graphs, quantized/FP8/packed
  linears), runtime/parallel/ (tensor parallelism), runtime/spec/ (proposers), runtime/tiers/ (KV
  tiers below the pool), runtime/kv_events/ (vLLM's KV events over ZMQ);
- SERVER: runtime/server/ (above the engine);
- FRONT: the entry points and the composition point (runtime/build.py, serve.py, llm.py, generate.py,
  cli.py, load.py) and the package's face (runtime/__init__.py: `from runtime import LLM`);
- CORE: every other module of runtime/ (engine, scheduler, KV blocks, sampling, records, the model over
  its seams, tokenizer, config, errors).

The core's budget went from 3,500 to 3,700 lines with the seams of replicas, parallelism and KV dtypes:
the block pool's listeners (KV events), a request's transfer params through the connector (P/D),
pipeline stages in the ledger, KV scales at the attention seam, keyed draws (--deterministic), and
their flags; then to 3,720 with the step's decode rows (model/step_rows.py: a linear that routes by row
count keeps a sampled row's bits whatever shares its step). Each plugs a wing in; none branches on one.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.sampling_params import SamplingParams
from tests.test_import_graph import module_edges, modules
from tests.tiny_engine import tiny_engine

REPO = Path(__file__).resolve().parents[1]
WINGS = ("runtime.accel", "runtime.parallel", "runtime.spec", "runtime.tiers", "runtime.kv_events")
SERVER = "runtime.server"
FRONT = ("runtime.build", "runtime.serve", "runtime.llm", "runtime.generate", "runtime.cli", "runtime.load")
CORE_LINES, ENGINE_LINES, FILE_LINES, FOLDER_FILES = 3720, 200, 400, 20
SOURCE_ROOTS = ("app", "cute_kernels", "profiling", "runtime", "structured", "weights", "tests")


def _under(module: str, packages: tuple[str, ...] | str) -> bool:
    packages = (packages,) if isinstance(packages, str) else packages
    return any(module == p or module.startswith(p + ".") for p in packages)


def core_modules() -> dict[str, str]:
    return {name: path for name, path in modules().items() if name.startswith("runtime.")
            and not _under(name, (*WINGS, SERVER, *FRONT))}


def _lines(path: str | Path) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def test_the_core_and_the_engine_stay_small():
    core = core_modules()
    total = sum(_lines(p) for p in core.values())
    assert total <= CORE_LINES, f"the runtime core is {total} lines in {len(core)} modules (budget {CORE_LINES})"
    assert _lines(REPO / "runtime" / "engine.py") <= ENGINE_LINES


def test_no_source_file_over_400_lines():
    long = [f"{p.relative_to(REPO)} ({n})" for root in SOURCE_ROOTS for p in (REPO / root).rglob("*.py")
            if (n := _lines(p)) > FILE_LINES]
    assert not long, f"files over {FILE_LINES} lines: {long}"


def test_no_folder_over_20_files():
    crowded = []
    for root in SOURCE_ROOTS:
        for folder, dirs, files in os.walk(REPO / root):
            dirs[:] = [d for d in dirs if d not in ("__pycache__", "out")]
            names = [f for f in files if not f.endswith(".pyc")]
            if len(names) > FOLDER_FILES:
                crowded.append(f"{Path(folder).relative_to(REPO)} ({len(names)})")
    assert not crowded, f"folders over {FOLDER_FILES} files: {crowded}"


def _edges_into(sources: dict[str, str], targets) -> list[str]:
    known = set(modules())
    return sorted(f"{a} -> {b}" for a, path in sources.items() for b in module_edges(a, path, known) if targets(b))


def test_the_core_imports_no_wing_and_not_the_server():
    bad = _edges_into(core_modules(), lambda b: _under(b, (*WINGS, SERVER, *FRONT)))
    assert not bad, f"core modules reaching above the core: {bad}"


def test_wings_come_in_at_the_composition_point_only():
    """Within runtime/, a wing is imported by runtime.build and by its own modules, nothing else."""
    runtime = {n: p for n, p in modules().items() if n.startswith("runtime")}
    bad = [e for e in _edges_into(runtime, lambda b: _under(b, WINGS))
           if not e.startswith("runtime.build ->") and not any(
               _under(e.split(" -> ")[0], w) and _under(e.split(" -> ")[1], w) for w in WINGS)]
    assert not bad, f"wing imports outside runtime/build.py: {bad}"


def test_the_toolchain_imports_no_kernel():
    toolchain = {n: p for n, p in modules().items() if n.startswith("cute_kernels.toolchain")}
    bad = _edges_into(toolchain, lambda b: _under(b, "cute_kernels.hopper"))
    assert not bad, f"cute_kernels/toolchain reaching into hopper/: {bad}"


@pytest.fixture
def validations(monkeypatch) -> list[SamplingParams]:
    """Grows by every SamplingParams.validate() call."""
    calls, validate = [], SamplingParams.validate
    monkeypatch.setattr(SamplingParams, "validate", lambda self, vocab: calls.append(self) or validate(self, vocab))
    return calls


def test_a_request_is_validated_once(validations):
    from runtime.llm import LLM

    engine = tiny_engine()
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=2))
    assert len(validations) == 1
    LLM.from_engine(engine).generate([[4, 5], [6], [7, 8, 9]], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(validations) == 4


def test_a_served_chat_request_is_validated_once(validations):
    from tests.server_utils import live_server, openai_client

    with live_server(tiny_engine()) as server:
        openai_client(server.url).chat.completions.create(model="tiny", max_tokens=2,
                                                          messages=[{"role": "user", "content": "hi"}])
    assert len(validations) == 1
