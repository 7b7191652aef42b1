"""The CPU kernel builder: its cache key covers the headers beside a source, so editing a shared header
(csrc/quant_dot.h) rebuilds every library that includes it instead of loading a stale one; every
library builds for every SIMD route; routes the CPU lacks are refused with the reason."""
import shutil

import pytest

from cute_kernels.cpu import build


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler")
def test_editing_an_included_header_builds_a_new_library(tmp_path, monkeypatch):
    monkeypatch.setenv("CUTE_SERVE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.c").write_text('#include "b.h"\nint a(void) { return B; }\n')
    (src / "b.h").write_text("#define B 1\n")
    compiler = shutil.which("cc") or shutil.which("gcc")
    first = build._build(src / "a.c", compiler)
    assert build._build(src / "a.c", compiler) == first  # cached
    (src / "b.h").write_text("#define B 2\n")
    assert build._build(src / "a.c", compiler) != first


LIBRARIES = sorted(p.stem for d in build.SOURCE_DIRS for p in d.glob("cpu_*.c"))
# What makes a compiler target each route on any x86 machine, whatever -march=native found here.
TARGET_FLAGS = {"avx512-vnni": ("-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512vl", "-mavx512vnni"),
                "avx2": ("-mavx2", "-mfma", "-mf16c", *build.ROUTES["avx2"].flags),
                "portable-c": build.ROUTES["portable-c"].flags}


@pytest.mark.skipif(build.route_unavailable("avx2") is not None, reason="not an x86 machine with AVX2")
@pytest.mark.parametrize("route", list(TARGET_FLAGS))
def test_every_library_builds_for_every_x86_route(route):
    """Built (and asked which route it holds: no other code runs), also for routes this CPU cannot run,
    so the AVX-512 code at least compiles on an AVX2-only machine."""
    assert set(TARGET_FLAGS) == set(build.ROUTES)
    for name in LIBRARIES:
        lib, reason = build._load(name, TARGET_FLAGS[route], ())
        assert reason is None and build.isa(lib) == route, (name, reason)


def test_routes_a_cpu_lacks_are_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(build, "cpu_flags", lambda: frozenset({"sse2", "avx2", "fma", "f16c"}))
    assert "avx512_vnni" in build.route_unavailable("avx512-vnni")
    assert build.route_unavailable("portable-c") is None
    with pytest.raises(ValueError, match="lacks"):
        with build.using_route("avx512-vnni"):
            pass
    assert "unknown" in build.route_unavailable("sse9")
