"""User-facing errors: each carries a one-line message meant for a person, never a traceback."""


class UserError(Exception):
    """A problem with what the user asked for (bad path, bad file, bad parameter)."""


class ModelLoadError(UserError):
    """The model path is missing, unreadable, corrupt, or uses something we do not support."""


class RequestError(UserError):
    """A request that cannot be served as given (too long, invalid sampling parameters)."""
