"""The CPU kernel builder's cache key covers the headers beside a source, so editing a shared header
(csrc/quant_dot.h) rebuilds every library that includes it instead of loading a stale one."""
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
