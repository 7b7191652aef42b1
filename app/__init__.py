"""The browser chat UI, mounted at / by `python -m runtime.serve` (or alone: `python -m app`)."""
