"""An argparse type for flags naming a peer's program (--llama-bench, --vllm-python): a path that is not an
executable is refused while the arguments are parsed, before the model load and our own runs, rather than
minutes later as a traceback when the peer's turn comes."""
from __future__ import annotations

import argparse
import shutil


def executable(value: str) -> str:
    """`value` as given when it names an executable file (a path, or a name on PATH); else an argparse error."""
    if shutil.which(value) is None:
        raise argparse.ArgumentTypeError(f"{value}: not an executable file")
    return value
