"""Atomic, resumable checkpoints in ``<run_dir>/checkpoints/step-XXXXXXX``.

A checkpoint is written into a hidden temp dir and renamed into place with ``os.replace``, so a
directory named ``step-*`` is always complete: a crash or a kill mid-write leaves only a temp dir,
which is ignored and removed when the next run starts. A write that fails (a full disk) removes its
temp dir at once and stops the run with one message (``training.write_faults``); the checkpoints
already there are pruned only after a new one is complete, so the last good one stays. The content is accelerate's ``save_state`` (model, optimizer, RNG
states of every process, registered objects: scheduler and trainer state), which also covers
DeepSpeed/FSDP sharding.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .write_faults import removed_on_failure

STEP_RE = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-"


def checkpoint_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def remove_partial_checkpoints(run_dir: str | Path) -> list[Path]:
    """Remove the temp dirs of checkpoint writes that never finished (a kill -9 mid-write); returns them.
    Only for the run that holds the run folder's lock: another run's write in progress looks the same."""
    root = checkpoint_root(run_dir)
    found = [p for p in root.iterdir() if p.name.startswith(TMP_PREFIX)] if root.is_dir() else []
    for p in found:
        shutil.rmtree(p, ignore_errors=True)
    return found


def save_checkpoint(accelerator, run_dir: str | Path, step: int, keep: int) -> Path:
    """Save the accelerator state for ``step`` atomically; prune all but the newest ``keep``. A failed
    write raises WriteFailed, its temp dir removed and the existing checkpoints untouched."""
    root = checkpoint_root(run_dir)
    final = root / f"step-{step:07d}"
    tmp = root / f"{TMP_PREFIX}step-{step:07d}"
    previous = latest_checkpoint(run_dir)
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
    accelerator.wait_for_everyone()
    with removed_on_failure(tmp, f"checkpoint {final.name}", final, previous):
        accelerator.save_state(str(tmp), safe_serialization=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if final.exists():  # re-saving a step (e.g. a signal right after a periodic save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        for _, old in list_checkpoints(run_dir)[: -max(1, keep)]:
            shutil.rmtree(old, ignore_errors=True)
        for p in root.iterdir():  # leftovers of interrupted saves
            if p.name.startswith(TMP_PREFIX):
                shutil.rmtree(p, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
