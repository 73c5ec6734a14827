"""A write that fails (a full disk, a quota, an I/O error) while a run saves a checkpoint, its export or its
logs: one message that says what was being written and what is left, the partial files removed.

A full disk does not always surface as ``OSError(ENOSPC)``: ``torch.save`` reports it as a RuntimeError
from its zip writer ("unexpected pos ... vs ...") and safetensors as a ``SafetensorError`` ("No space
left on device (os error 28)"). :func:`disk_full` therefore also reads the error text and, last, the
free space left on the file system, measured before the partial files are removed.
"""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
DISK_FULL_TEXT = ("no space left on device", "os error 28", "disk quota exceeded", "os error 122")
# a write that failed on a full file system leaves less than this free: its partial files took the rest
LOW_SPACE_BYTES = 4 * 2**20


class WriteFailed(RuntimeError):
    """A checkpoint, the export or a run file could not be written. Its partial files are removed, the last
    complete checkpoint (``last_good``) is untouched, and the run stopped."""

    def __init__(self, message: str, *, what: str, path: Path, disk_full: bool, last_good: Path | None) -> None:
        super().__init__(message)
        self.what, self.path, self.disk_full, self.last_good = what, path, disk_full, last_good


def disk_full(err: BaseException, path: Path | None = None) -> bool:
    """Whether ``err`` (or an error it was raised from) means the file system of ``path`` is full."""
    seen: BaseException | None = err
    while seen is not None:
        if getattr(seen, "errno", None) in DISK_FULL_ERRNOS:
            return True
        if any(text in str(seen).lower() for text in DISK_FULL_TEXT):
            return True
        seen = seen.__cause__ or seen.__context__
    return path is not None and free_space(path) < LOW_SPACE_BYTES


def free_space(path: Path) -> int:
    """Bytes an unprivileged writer may still use on ``path``'s file system (its nearest existing folder)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 1 << 62  # cannot tell: not "full"


def failure(err: Exception, what: str, path: Path, last_good: Path | None, full: bool | None = None) -> WriteFailed:
    """The WriteFailed for ``err``, raised while writing ``what`` to ``path``."""
    full = disk_full(err, path) if full is None else full
    text = str(err).strip()
    cause = getattr(err, "strerror", None) or (text.splitlines()[0] if text else type(err).__name__)
    if full and getattr(err, "errno", None) not in DISK_FULL_ERRNOS:
        cause = os.strerror(errno.ENOSPC)  # torch.save says "unexpected pos 54848 vs 54736": the space ran out
    kept = f"the last complete checkpoint, {last_good}, is untouched" if last_good else "there is no checkpoint yet"
    if full:
        message = (f"disk full while writing {what} to {path} ({cause}; {free_space(path) / 2**20:.0f} MiB free "
                   f"now). The partial files were removed and {kept}. Free some space, or move run_dir to a "
                   "larger disk, then resume.")
    else:
        message = (f"cannot write {what} to {path}: {cause}. The partial files were removed and {kept}. "
                   "Fix the cause, then resume.")
    return WriteFailed(message, what=what, path=Path(path), disk_full=full, last_good=last_good)


@contextmanager
def removed_on_failure(partial: Path, what: str, dest: Path, last_good: Path | None):
    """Run a write of ``what`` into ``partial`` (a temporary file or folder, renamed to ``dest`` once
    complete); if it fails, remove ``partial`` and raise WriteFailed for an OSError or a full disk (other
    errors, e.g. a bug, propagate as they are, after the removal). A kill -9 leaves ``partial`` behind:
    the next run removes it when it starts."""
    try:
        yield
    except BaseException as err:
        full = isinstance(err, Exception) and not isinstance(err, WriteFailed) and disk_full(err, partial)
        _remove(Path(partial))
        if isinstance(err, WriteFailed) or not isinstance(err, Exception):
            raise
        if full or isinstance(err, OSError):
            raise failure(err, what, Path(dest), last_good, full) from err
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except OSError:  # already gone, or not ours to remove: nothing more to do
            pass
