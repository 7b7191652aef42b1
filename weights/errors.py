"""User-facing errors: each carries a one-line message meant for a person, never a traceback.

They live here, at the bottom of the import graph, so the checkpoint readers can raise them without
importing the runtime; runtime.errors re-exports both, and CLIs catch UserError to print one line.
"""


class UserError(Exception):
    """A problem with what the user asked for (bad path, bad file, bad parameter)."""


class ModelLoadError(UserError):
    """The model path is missing, unreadable, corrupt, or uses something we do not support."""
