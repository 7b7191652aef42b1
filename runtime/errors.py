"""User-facing errors: each carries a one-line message meant for a person, never a traceback.

UserError and ModelLoadError are defined by the checkpoint package (weights.errors) and re-exported:
one class each, so `except UserError` catches a load error whichever module raised it."""
from weights.errors import ModelLoadError, UserError

__all__ = ["EngineDeadError", "ModelLoadError", "RequestError", "UserError"]


class RequestError(UserError):
    """A request that cannot be served as given (too long, invalid sampling parameters).

    param: the request field at fault, when it is one; code: a machine-readable kind, if any."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    @classmethod
    def invalid(cls, param: str, why: str) -> "RequestError":
        return cls(f"invalid {param}: {why}", param=param)


class EngineDeadError(RuntimeError):
    """The engine can run no more steps (e.g. a tensor-parallel worker process died); the server stops
    serving (HTTP 503) rather than retrying."""
