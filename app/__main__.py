"""python -m app: the chat UI for development (the same server `python -m runtime.serve` starts)."""
from runtime.cli import run_main
from runtime.serve import main

if __name__ == "__main__":
    run_main(main, "python -m app")
