"""A model folder from any checkpoint of a run, while the run goes on.

A run exports its model once, at the end (``<run_dir>/final``). To score a checkpoint along the way, or to
keep an earlier one that scored better, :func:`export_checkpoint_model` writes the folder the run would have exported
had it stopped at that checkpoint: the same trainer, built from the run's ``config.yaml``, resumes a copy of
the checkpoint in a temporary run folder with ``max_steps`` at the checkpoint's step, so it takes no step
and goes straight to its export (weights, tokenizer, generation defaults, ``training_info.json``). The run
itself is not touched, and its lock does not matter: nothing is written into its folder.

Plain checkpoints only (one or several processes, as ``--resume`` reads them in one process); DeepSpeed and
FSDP checkpoints keep sharded folders and are refused with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import yaml

from dllm.errors import CheckpointError

from .checkpointing import STEP_RE
from .config import ConfigError
from .engine import export_target_error
from .kinds import load_kind_config, trainer_class, trainer_kind


def _link_or_copy(src: str, dst: str) -> None:
    try:  # a checkpoint's files are written once and never changed in place, so a hard link is a copy
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def export_checkpoint_model(run_or_checkpoint: str | Path, out: str | Path, step: int | None = None,
                            progress: bool = False) -> Path:
    """Write the model of a checkpoint (a ``step-N`` folder, or a run folder's latest / ``step``) to ``out``,
    as the run's own export would be; ``training_info.json`` keeps the run's config and names the checkpoint.
    ``out`` is replaced only once the new folder is complete."""
    from .portable_checkpoint import _source

    src = _source(Path(run_or_checkpoint), step)
    if any(p.is_dir() for p in src.iterdir()):
        raise CheckpointError(f"{src} is a DeepSpeed or FSDP checkpoint (sharded folders); export-model reads "
                              "plain single- and multi-process checkpoints")
    run_dir = src.parent.parent
    config_file = run_dir / "config.yaml"
    if not config_file.is_file():
        raise CheckpointError(f"{run_dir} has no config.yaml, so the run that wrote {src.name} is unknown")
    raw = yaml.safe_load(config_file.read_text()) or {}
    kind = trainer_kind(raw)
    n = int(STEP_RE.match(src.name).group(1))
    out = Path(out).resolve()
    if err := export_target_error(out, run_dir):
        raise ConfigError(err)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".export-model-", dir=out.parent) as tmp:
        scratch = Path(tmp) / "run"
        shutil.copytree(src, scratch / "checkpoints" / src.name, copy_function=_link_or_copy)
        # max_steps at the checkpoint: the resumed trainer takes no step and exports (a warm-up longer than
        # that would be refused by the config check, and no step is taken under it)
        warmup = min(int((raw.get("optim") or {}).get("warmup_steps", 0)), n)
        overrides = [f"run_dir={scratch}", "resume=true", f"max_steps={n}", f"export_dir={out}",
                     f"progress={str(progress).lower()}", "eval_every=0", f"optim.warmup_steps={warmup}"]
        result = trainer_class(kind)(load_kind_config(kind, config_file, overrides)).run()
        if result.step != n or result.status != "finished":
            raise CheckpointError(f"resuming {src} to export it stopped at step {result.step} ({result.status})")
    info_file = out / "training_info.json"
    info = json.loads(info_file.read_text())
    info.update(config=raw, steps=n, checkpoint=str(src.resolve()))
    info_file.write_text(json.dumps(info, indent=2, default=str) + "\n")
    return out
