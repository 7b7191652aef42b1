"""Shared command-line plumbing: one-line errors instead of tracebacks, logging set-up."""
from __future__ import annotations

import logging
import sys
from typing import Callable

from runtime.errors import UserError

LOG_FORMAT = "%(levelname)s %(message)s"


def setup_logging(level: int = logging.INFO) -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)


def show_engine_logs() -> None:
    """INFO lines (the memory ledger) on stderr, as vLLM's offline API shows them, unless the
    application has set up logging itself."""
    log = logging.getLogger("cute_serve")
    if log.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # our handler prints it; a root handler added later would print it twice


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
