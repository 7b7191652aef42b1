"""One step of profiling/gpu/gpu_suite.sh, run under the suite's `timeout`: a script (its command line and
its __main__) or pytest on the GPU tests, with Python's tracebacks dumped to the log shortly before
the timeout strikes, so that a hang says where it hung.

    python3 profiling/gpu/gpu_suite_step.py SECONDS SCRIPT [ARGS...]
    python3 profiling/gpu/gpu_suite_step.py SECONDS pytest TEST_FILE...
"""
from __future__ import annotations

import faulthandler
import os
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# How the suite runs pytest on the GPU image: only the gpu tests; without tests/conftest.py, which
# imports the server stack (openai, uvicorn, fastapi) that the image lacks and no GPU test needs.
PYTEST_ARGS = ("-m", "gpu", "--noconftest", "-p", "no:cacheprovider")
# No third-party plugins either: one a test dependency brings here (langsmith's, with langchain) imports
# what the image lacks, and no GPU test needs one.
PLUGIN_AUTOLOAD_OFF = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
PER_TEST_DUMP_S = 30  # pytest's faulthandler_timeout: a test running longer dumps its stack (and goes on)


def main(argv: list[str]) -> int:
    seconds, target, *args = argv
    sys.path.insert(0, str(ROOT))
    if target == "pytest":
        import pytest

        os.environ.update(PLUGIN_AUTOLOAD_OFF)
        return int(pytest.main([*PYTEST_ARGS, "-x", "-q", "-o", f"faulthandler_timeout={PER_TEST_DUMP_S}",
                                "--rootdir", str(ROOT), *args]))
    faulthandler.dump_traceback_later(max(1.0, float(seconds) - 3), exit=False)
    sys.argv = [target, *args]
    try:
        runpy.run_path(target, run_name="__main__")
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
