"""python -m app: the chat UI for development (the same server `python -m runtime.serve` starts).

The server is run as a program, not imported: runtime.serve imports app.ui to mount this UI, so an
import back from app would tie the two packages in a circle. The UI reaches the engine only through
runtime's engine face (AsyncEngine)."""
import runpy

if __name__ == "__main__":
    runpy.run_module("runtime.serve", run_name="__main__", alter_sys=True)
