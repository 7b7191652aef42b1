"""Fixtures shared across the suite: the CPU kernels' SIMD routes, a tiny-model server and its openai
client, the CUDA toolkit the ahead-of-time kernel builds need.

A test that takes `cpu_route` runs once per route of cute_kernels/cpu/build.py (AVX-512 VNNI, AVX2,
portable C) that this machine can execute, with every C library it loads built for that route; a
route the CPU lacks skips with its reason. CUTE_SERVE_TEST_ROUTES=a,b narrows the list (the sanitizer
job uses it). The run ends with a line per test file saying which routes passed there.
"""
from __future__ import annotations

import os
from collections import defaultdict

import pytest

from cute_kernels.cpu import build


def _routes() -> list[str]:
    names = os.environ.get("CUTE_SERVE_TEST_ROUTES")
    return names.split(",") if names else list(build.ROUTES)


_ROUTES_RUN: dict[str, set[str]] = defaultdict(set)
_ROUTES_SKIPPED: dict[str, dict[str, str]] = defaultdict(dict)


@pytest.fixture(params=_routes())
def cpu_route(request: pytest.FixtureRequest):
    """The route name; C libraries loaded during the test are built for it."""
    name, where = request.param, request.node.nodeid.split("::")[0]
    if reason := build.route_unavailable(name):
        _ROUTES_SKIPPED[where][name] = reason
        pytest.skip(f"CPU route {name}: {reason}")
    request.node.user_properties.append(("cpu_route", name))
    with build.using_route(name):
        yield name


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:  # `-m cpu_kernel` selects the tests of the C kernels themselves
        if "cpu_route" in getattr(item, "fixturenames", ()):
            item.add_marker("cpu_kernel")


def pytest_collection_finish(session: pytest.Session) -> None:
    """A run over many kernel test files builds every library for every route up front, all cores
    compiling (else one at a time, on first load); a run of a file or two builds only what it loads."""
    files = {item.path for item in session.items if "cpu_route" in getattr(item, "fixturenames", ())}
    if len(files) > 3:
        build.prebuild([r for r in _routes() if build.route_unavailable(r) is None])


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call" and report.passed:
        for key, value in report.user_properties:
            if key == "cpu_route":
                _ROUTES_RUN[report.nodeid.split("::")[0]].add(value)


def pytest_terminal_summary(terminalreporter) -> None:
    files = sorted(set(_ROUTES_RUN) | set(_ROUTES_SKIPPED))
    if not files:
        return
    terminalreporter.write_sep("-", "CPU kernel routes run per test file")
    for where in files:
        ran = [r for r in build.ROUTES if r in _ROUTES_RUN[where]]
        skipped = "".join(f"; {r} skipped: {why}" for r, why in _ROUTES_SKIPPED[where].items())
        terminalreporter.write_line(f"{where}: {', '.join(ran) or 'none'}{skipped}")


@pytest.fixture(scope="module")
def server():
    """A real uvicorn server over the tiny engine, one per test module."""
    from tests.server_utils import live_server  # the server stack: not on the GPU image, which runs this conftest
    from tests.tiny_engine import tiny_engine

    with live_server(tiny_engine()) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    from tests.server_utils import openai_client

    return openai_client(server.url)


@pytest.fixture(scope="module")
def toolkit():
    """The CUDA 13 toolkit the AOT kernel builds link against, or a skip."""
    from cute_kernels.toolchain.aot_link import find_cuda_toolkit

    kit = find_cuda_toolkit()
    if kit is None:
        pytest.skip("no CUDA 13 headers + cudart (CUDA_HOME, /usr/local/cuda or pip nvidia-cuda-runtime)")
    return kit
