"""Errors a user can act on when a checkpoint cannot be used (one line, no traceback in the CLI)."""


class CheckpointError(ValueError):
    """A checkpoint directory cannot be loaded or used; the message says why and what to do."""
