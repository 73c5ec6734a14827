"""Portable checkpoints: a run's resume point as safetensors + JSON, without pickles.

A checkpoint under ``<run_dir>/checkpoints/step-N`` is accelerate's ``save_state``: the model in
safetensors, but the optimizer, scheduler, RNG states and trainer state as ``torch.save`` pickles. A pickle
runs code when it is loaded, so such a folder is not something to put in a repository, mail to a colleague
or load from an untrusted place. :func:`export_checkpoint` rewrites one into a folder that holds only

- ``*.safetensors``: the model files as saved, plus one file per pickled part holding its tensors
  (optimizer moments, RNG states, the mask generator's state), and
- ``checkpoint.json``: the format version, the step, and for every pickled part the structure around those
  tensors (dicts, lists, tuples, numbers, strings; NumPy arrays and scalars by dtype), plus the run's own
  text files (``config.yaml``, ``metrics.csv``, ``eval.csv``) so the resumed run's curves continue.

:func:`import_checkpoint` writes it back as ``<run_dir>/checkpoints/step-N`` in accelerate's layout, so
``--resume`` continues it exactly as it would the original (bit-identical: ``tests/training/
test_portable_checkpoint.py``). Loading reads JSON and safetensors only; the pickles are written by this
module from those, never read from the portable folder.

Plain runs only (one or several processes with the same layout per process); DeepSpeed and FSDP
checkpoints keep sharded optimizer files of their own and are refused with the reason.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from dllm.errors import CheckpointError
from dllm.loading import exported_model_of

from .checkpointing import STEP_RE, TMP_PREFIX, _fsync_dir, checkpoint_root, latest_checkpoint, list_checkpoints

FORMAT = "dllm-portable-checkpoint"
VERSION = 1
INDEX = "checkpoint.json"
RUN_FILES = ("config.yaml", "metrics.csv", "eval.csv")
# accelerate's names for the parts it pickles (optimizer.bin, scheduler.bin, random_states_0.pkl,
# custom_checkpoint_0.pkl, their _1, _2 ... for further objects or processes)
PICKLED_SUFFIXES = (".bin", ".pkl")


# -- the object tree <-> JSON + named tensors --------------------------------------------------------------
def _encode(obj, tensors: dict[str, torch.Tensor], where: str):
    """JSON for ``obj``; each tensor goes into ``tensors`` under a fresh name and is referenced by it."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, (int, float)) and not isinstance(obj, (np.generic,)):
        return obj
    if isinstance(obj, torch.Tensor):
        name = f"t{len(tensors)}"
        tensors[name] = obj.detach().cpu().contiguous().clone()
        return {"tensor": name}
    if isinstance(obj, np.ndarray):
        name = f"t{len(tensors)}"
        # through int64/float64 so every NumPy dtype of an RNG state (uint32 keys) is a safetensors dtype
        wide = obj.astype(np.float64 if obj.dtype.kind == "f" else np.int64)
        tensors[name] = torch.from_numpy(np.ascontiguousarray(wide))
        return {"ndarray": name, "dtype": obj.dtype.str}
    if isinstance(obj, np.generic):
        return {"numpy": obj.item(), "dtype": obj.dtype.str}
    if isinstance(obj, dict):
        return {"dict": [[_encode(k, tensors, where), _encode(v, tensors, where)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"tuple": [_encode(v, tensors, where) for v in obj]}
    if isinstance(obj, list):
        return {"list": [_encode(v, tensors, where) for v in obj]}
    raise CheckpointError(f"{where}: a {type(obj).__module__}.{type(obj).__name__} cannot be written as "
                          "safetensors + JSON; only tensors, arrays, numbers, strings and containers of them can")


def _decode(node, tensors: dict[str, torch.Tensor]):
    if not isinstance(node, dict):
        return node
    if "tensor" in node:
        return tensors[node["tensor"]]
    if "ndarray" in node:
        return tensors[node["ndarray"]].numpy().astype(np.dtype(node["dtype"]))
    if "numpy" in node:
        return np.dtype(node["dtype"]).type(node["numpy"])
    if "dict" in node:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in node["dict"]}
    if "tuple" in node:
        return tuple(_decode(v, tensors) for v in node["tuple"])
    return [_decode(v, tensors) for v in node["list"]]


# -- export / import ---------------------------------------------------------------------------------------
def _source(run_or_checkpoint: Path, step: int | None) -> Path:
    path = Path(run_or_checkpoint)
    if STEP_RE.match(path.name) and path.is_dir():
        return path
    found = dict(list_checkpoints(path))
    if step is not None:
        if step not in found:
            have = ", ".join(str(s) for s in found) or "none"
            raise CheckpointError(f"{path} has no checkpoint of step {step} (checkpoints: {have})")
        return found[step]
    latest = latest_checkpoint(path)
    if latest is None:
        if (path / "config.yaml").is_file():  # a run folder whose checkpoints were removed (or never written)
            final = exported_model_of(path)
            kept = f"; its exported model is {final}" if final else ""
            raise CheckpointError(f"{path} is a run folder with no checkpoint left (removed, or the run stopped "
                                  f"before its first){kept}")
        raise CheckpointError(f"{path} is neither a run folder with checkpoints nor a checkpoints/step-N folder")
    return latest


def export_checkpoint(run_or_checkpoint: str | Path, out: str | Path, step: int | None = None) -> Path:
    """Write the checkpoint (a ``step-N`` folder, or a run folder's latest / ``step``) to ``out`` as
    safetensors + JSON. ``out`` is replaced as a whole, and only once it is complete."""
    src = _source(Path(run_or_checkpoint), step)
    if any(p.name.startswith(("pytorch_model_fsdp", "global_step", "zero_")) or p.is_dir() for p in src.iterdir()):
        raise CheckpointError(f"{src} is a DeepSpeed or FSDP checkpoint (sharded optimizer folders); portable "
                              "checkpoints cover plain single- and multi-process runs")
    out = Path(out)
    tmp = out.parent / f"{TMP_PREFIX}{out.name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        parts = {}
        for f in sorted(src.iterdir()):
            if f.suffix == ".safetensors":
                shutil.copy2(f, tmp / f.name)
            elif f.suffix in PICKLED_SUFFIXES:
                # our own checkpoint, written by this trainer's accelerate: the one place a pickle is read
                obj = torch.load(f, map_location="cpu", weights_only=False)
                tensors: dict[str, torch.Tensor] = {}
                parts[f.name] = _encode(obj, tensors, str(f))
                save_file(tensors, str(tmp / f"{f.name.replace('.', '_')}.safetensors"))
            else:
                raise CheckpointError(f"{f}: not a file of accelerate's save_state; nothing was exported")
        run_dir = src.parent.parent
        run_files = {name: (run_dir / name).read_text() for name in RUN_FILES if (run_dir / name).is_file()}
        index = {"format": FORMAT, "version": VERSION, "step": int(STEP_RE.match(src.name).group(1)),
                 "parts": parts, "run_files": run_files}
        (tmp / INDEX).write_text(json.dumps(index, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.replace(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def read_index(point: str | Path) -> dict:
    path = Path(point) / INDEX
    try:
        index = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{point} is not a portable checkpoint ({INDEX}: {err})") from None
    if index.get("format") != FORMAT or index.get("version") != VERSION:
        raise CheckpointError(f"{path}: format {index.get('format')!r} version {index.get('version')!r}; this "
                              f"dllm reads {FORMAT!r} version {VERSION}")
    return index


def import_checkpoint(point: str | Path, run_dir: str | Path) -> Path:
    """Write the portable checkpoint ``point`` into ``run_dir`` as ``checkpoints/step-N`` (and the run's
    text files where the run folder has none), so that ``--resume`` continues it. Refuses a run folder
    that already has checkpoints: resuming those is what ``--resume`` alone does."""
    point, run_dir = Path(point), Path(run_dir)
    index = read_index(point)
    if (existing := latest_checkpoint(run_dir)) is not None:
        raise CheckpointError(f"{run_dir} already has checkpoints (latest {existing.name}); import into a new "
                              "run folder, or continue that one with --resume")
    root = checkpoint_root(run_dir)
    final = root / f"step-{index['step']:07d}"
    tmp = root / f"{TMP_PREFIX}{final.name}"
    root.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        stores = {f"{name.replace('.', '_')}.safetensors" for name in index["parts"]}
        for f in sorted(point.iterdir()):
            if f.suffix == ".safetensors" and f.name not in stores:
                shutil.copy2(f, tmp / f.name)
        for name, tree in index["parts"].items():
            tensors = load_file(str(point / f"{name.replace('.', '_')}.safetensors"))
            torch.save(_decode(tree, tensors), tmp / name)
        tmp.replace(final)
        _fsync_dir(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for name, text in index["run_files"].items():
        if not (run_dir / name).exists():
            (run_dir / name).write_text(text)
    return final
