"""Shared command-line plumbing: one-line errors instead of tracebacks, logging set-up."""
from __future__ import annotations

import logging
import sys
from typing import Callable

from runtime.errors import UserError


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format="%(levelname)s %(message)s", stream=sys.stderr)


def run_main(main: Callable[[], int | None], prog: str) -> None:
    """Run main(); a UserError (or a broken pipe / Ctrl-C) exits non-zero with one line, no traceback."""
    try:
        code = main()
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(code or 0)
