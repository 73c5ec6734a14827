"""What every ``dllm`` subcommand shares: one-line user errors and quiet library logging."""

from __future__ import annotations

import typer

from dllm.decoding.errors import GenerationConfigError, StrategyError
from dllm.errors import CheckpointError

#: Mistakes a user can fix from the message alone: printed as one ``error:`` line, exit code 2.
USER_ERRORS: tuple[type[Exception], ...] = (CheckpointError, GenerationConfigError, StrategyError, ValueError)


def fail(message: str, code: int = 2) -> None:
    """Print ``error: message`` on stderr and exit with ``code`` (2: bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def quiet_transformers() -> None:
    """No weight-loading progress bars or advisory warnings in command output (JSON must stay parseable)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
