"""Ranks torchrun started, on this machine as two "nodes" (two `torchrun --nnodes 2 --node-rank N`
invocations, one rank each, meeting at 127.0.0.1): rank 0 serves the same tokens as one process, the
launcher's faults are one-line errors, and a peer killed mid-step gives 503s, no hang, no orphans."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

import httpx
import pytest
import torch

from profiling.benchmarks.bench_serving import free_port
from runtime.build import build_engine, parallel_layout
from runtime.engine_config import EngineConfig
from runtime.errors import UserError
from runtime.llm import LLM
from runtime.load import load_model
from runtime.parallel.group import GroupSpec, ParallelGroup
from runtime.parallel.plan import Layout
from runtime.sampling_params import SamplingParams
from tests.runtime.parallel.test_tensor_parallel import _children
from tests.server_utils import REPO, TINY_MODEL, write_tiny_model

START_S, STOP_S = 180.0, 20.0
SERVE = ["--served-model-name", TINY_MODEL, "--kv-cache-memory", "8MiB", "--log-level", "warning"]
PROMPTS = [[104, 105], list(range(40, 60)), [112, 105, 112, 101] * 8]  # token ids (the byte tokenizer's)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}


def _sessions(sid: int) -> list[int]:
    """Live processes of session sid (each torchrun starts one: its agent and its rank)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid and fields[0] != "Z":
                found.append(int(entry))
    return found


class Node:
    """One `torchrun --nnodes 2 --node-rank N` in a session of its own, its output in a file."""

    def __init__(self, rank: int, master_port: int, args: list[str]) -> None:
        self.log = tempfile.TemporaryFile("w+")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank),
               "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(master_port),
               "--rdzv-conf", "timeout=60", "-m", "runtime.serve", *args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def output(self) -> str:
        fd = self.log.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")

    def rank_pid(self) -> int:
        """The rank torchrun started (its agent's child)."""
        deadline = time.monotonic() + 30
        while not (kids := _children(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return kids[0]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the agent stops its rank
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(STOP_S)
        self.log.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return write_tiny_model(str(tmp_path_factory.mktemp("torchrun")))


@pytest.fixture(scope="module")
def two_nodes(model_dir):
    """PP 2 over two "nodes": rank 0 (node 0) serves on url, rank 1 (node 1) runs headless."""
    with deployment(["--model", model_dir, "--pipeline-parallel-size", "2", *SERVE]) as running:
        yield running


@contextlib.contextmanager
def deployment(args: list[str]):
    """(url, nodes) once rank 0 answers /health; on exit every node stopped and none of their processes left."""
    port, master = free_port(), free_port()
    nodes = [Node(n, master, ["--port", str(port), *args]) for n in (0, 1)]
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S
        while not _healthy(url):
            dead = [n for n in nodes if n.proc.poll() is not None]
            assert not dead and time.monotonic() < deadline, "\n".join(n.output()[-3000:] for n in nodes)
            time.sleep(0.25)
        yield url, nodes
    finally:
        sessions = [n.proc.pid for n in nodes]
        for n in nodes:
            n.stop()
        deadline = time.monotonic() + STOP_S
        while any(_sessions(s) for s in sessions) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p for s in sessions for p in _sessions(s)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not left, f"processes outlived the deployment: {left}"


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url + "/health", timeout=1).status_code == 200
    return False


def _complete(url: str) -> list[str]:
    body = {"model": TINY_MODEL, "prompt": PROMPTS, "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return [c["text"] for c in sorted(r.json()["choices"], key=lambda c: c["index"])]


def test_two_torchrun_nodes_serve_the_tokens_of_one_process(two_nodes, model_dir):
    url, _ = two_nodes
    cfg, tensors, tok, _ = load_model(model_dir)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    with build_engine(EngineConfig(device="cpu", kv_cache_memory=8 << 20, log_ledger=False), cfg, tensors, tok) as one:
        want = [o.outputs[0].text for o in LLM.from_engine(one).generate(PROMPTS, params, use_tqdm=False)]
    assert _complete(url) == want and len(set(want)) == len(want)


def test_a_peer_killed_mid_step_gives_503_and_leaves_no_process(two_nodes):
    """Last: it ends the deployment (the fixture's teardown checks that no process is left)."""
    url, (node0, node1) = two_nodes
    got: dict[str, str] = {}

    def stream() -> None:
        body = {"model": TINY_MODEL, "prompt": "x", "max_tokens": 500, "ignore_eos": True, "stream": True}  # context 512
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
            got["text"] = "".join(r.iter_lines())

    client = threading.Thread(target=stream)
    client.start()
    time.sleep(1.0)  # tokens flow
    t0 = time.monotonic()
    os.kill(node1.rank_pid(), signal.SIGKILL)
    client.join(30)
    assert not client.is_alive(), "the stream hung after a peer died"
    assert time.monotonic() - t0 < 15
    assert "engine_unavailable" in got["text"] and "TP 1 x PP 2" in got["text"], got["text"][-500:]
    r = httpx.post(url + "/v1/completions", json={"model": TINY_MODEL, "prompt": "hi", "max_tokens": 2}, timeout=10)
    assert r.status_code == 503 and "Connection" in r.json()["error"]["message"]
    assert httpx.get(url + "/health", timeout=10).status_code == 503
    node1.proc.wait(STOP_S)  # its agent saw its rank die
    assert node1.proc.returncode != 0
    assert node0.proc.poll() is None  # rank 0 still answers (503s) until it is stopped


@pytest.mark.parametrize("rank", [0, 1])
def test_a_missing_peer_is_a_bounded_wait_and_a_one_line_error(rank):
    """Rank 0 hosts the store and waits for a rank that never comes; rank 1 finds no store to join."""
    port = free_port()
    spec = GroupSpec(Layout(pp=2), "gloo", address=("127.0.0.1", port), key="test", join_timeout_s=1.0)
    t0 = time.monotonic()
    want = (f"rank 0: only 1 of 2 ranks joined at 127.0.0.1:{port} within 1 s (is every node's launcher started?)"
            if rank == 0 else f"rank 1 of 2 cannot reach the store at 127.0.0.1:{port} within 1 s: ")
    with pytest.raises(UserError) as exc:
        ParallelGroup(spec, rank, torch.device("cpu"))
    assert str(exc.value).startswith(want) and "\n" not in str(exc.value)
    assert time.monotonic() - t0 < 10
    # the server turns it into `runtime.serve: error: <that line>` and exit code 2 (runtime/cli.py)


def test_a_launcher_world_the_flags_disagree_with_fails_before_the_weights_load(monkeypatch):
    from runtime.serve import parse_args, start_engine

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    args = parse_args(["--model", "/nonexistent/model", "--tensor-parallel-size", "2"])
    with pytest.raises(UserError, match=r"^the launcher started 3 ranks \(WORLD_SIZE\), but --tensor-parallel-size "
                                        r"2 x --pipeline-parallel-size 1 needs 2$"):
        start_engine(args)  # the world is checked first: the missing model is never read
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(UserError, match="external_launcher needs MASTER_PORT in the environment"):
        parallel_layout(EngineConfig(tensor_parallel_size=3))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(UserError, match=r"RANK 3 is not in 0\.\.WORLD_SIZE-1 \(3\)"):
        parallel_layout(EngineConfig(tensor_parallel_size=3))
    assert parallel_layout(EngineConfig(tensor_parallel_size=3, distributed_executor_backend="mp"))[1] is None
