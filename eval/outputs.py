"""Output files of long runs, checked before the run: a report that cannot be written at the end
is lost with the hours that produced it."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path

IMAGE_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")


class OutputPathError(ValueError):
    """An output path that cannot take the file (message names the path and the reason)."""


def prepare_output_file(path: str | Path, suffixes: Iterable[str] | None = None) -> Path:
    """Create ``path``'s folder and check that ``path`` can become a file with one of ``suffixes``
    (lower case, no dot; None = any). Nothing is written to ``path`` itself."""
    path = Path(path)
    if suffixes is not None:
        allowed = tuple(suffixes)
        if path.suffix.lstrip(".").lower() not in allowed:
            raise OutputPathError(f"{path}: unknown file format {path.suffix or '(none)'!r}; "
                                  f"use one of: {', '.join(allowed)}")
    if path.is_dir():
        raise OutputPathError(f"{path} is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OutputPathError(f"cannot create the folder of {path}: {err.strerror or err}") from None
    if path.exists() and not path.is_file():
        raise OutputPathError(f"{path} exists and is not a regular file")
    return path


def check_output_args(parser: argparse.ArgumentParser, *paths: str | Path | None,
                      suffixes: Iterable[str] | None = None) -> None:
    """``prepare_output_file`` for each given path of a script's arguments; a bad one ends the
    script through ``parser.error`` (usage line, message, exit 2) before any work starts."""
    for path in paths:
        if path is None:
            continue
        try:
            prepare_output_file(path, suffixes)
        except OutputPathError as err:
            parser.error(str(err))
