"""Loading checkpoints (bundled names, local directories, LoRA adapters) with errors a user can act on."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from .errors import CheckpointError
from .modeling import DiffusionLM, family_of
from .modeling.configuration import ATTENTION_POLICIES

BUNDLED_DIR = Path(__file__).parent / "bundled"
BUNDLED_MODELS = {"tiny": "tiny", "tiny-d2f": "tiny-d2f", "tiny-long": "tiny-long", "tiny-long-d2f": "tiny-long-d2f"}
DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def resolve_model_path(name_or_path: str | Path) -> Path:
    """``tiny`` / ``tiny-d2f`` / ``tiny-long`` / ``tiny-long-d2f`` -> the bundled directory; anything else must be a local directory."""
    name = str(name_or_path)
    if name in BUNDLED_MODELS:
        path = BUNDLED_DIR / BUNDLED_MODELS[name]
        if not (path / "config.json").exists():
            raise CheckpointError(
                f"the bundled model {name!r} is not in this installation ({path} is missing); "
                "reinstall dllm, or train it by the recipes in the repository's recipes/ (docs/training.md)"
            )
        return path
    path = Path(name).expanduser()
    if not path.exists() and (cached := _from_hub_cache(name)) is not None:
        return cached
    if not path.exists():
        hub = " or a Hugging Face repo id in the local cache" if _looks_like_repo_id(name) else ""
        raise CheckpointError(
            f"model {name!r} is neither a bundled name ({', '.join(BUNDLED_MODELS)}) nor an existing directory{hub}; "
            "dllm loads checkpoints offline from local directories or the Hugging Face cache (download them "
            "beforehand, e.g. `huggingface-cli download ORG/NAME`)"
        )
    if not path.is_dir():
        raise CheckpointError(f"{path} is a file; pass the checkpoint directory that holds config.json")
    return path


def _looks_like_repo_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def _from_hub_cache(name: str) -> Path | None:
    """``ORG/NAME`` already in the Hugging Face cache (``huggingface-cli download``): its snapshot
    directory, found without any network access; None if it is not there."""
    if not _looks_like_repo_id(name):
        return None
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:
        return None
    try:
        return Path(snapshot_download(repo_id=name, local_files_only=True))
    except (HFValidationError, LocalEntryNotFoundError, OSError, ValueError):
        return None


def exported_model_of(run: Path) -> Path | None:
    """The model folder a training run exported, if it holds a model: the ``export_dir`` of the run's
    ``config.yaml`` (a relative one as the run was started, from the current folder), else ``run/final``."""
    import yaml

    try:
        export_dir = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("export_dir")
    except (OSError, yaml.YAMLError, AttributeError):  # no config, or not a run's: only the default is known
        export_dir = None
    model = Path(export_dir) if export_dir else run / "final"
    return model if (model / "config.json").is_file() else None


def _not_a_model_folder(path: Path) -> str:
    """Why ``path`` (no config.json) is no model folder, and what to load instead when it is a training run's
    folder or one of its checkpoints."""
    run = path.parent.parent if path.parent.name == "checkpoints" else path
    has_checkpoints = any((run / "checkpoints").glob("step-*"))
    is_run = (run / "config.yaml").is_file()
    final = exported_model_of(run) if is_run else None
    if not (is_run and (has_checkpoints or final)):
        return f"{path} has no config.json; is this a model directory?"
    ways = ([f"its exported model is {final}"] if final else []) + (
        [f"`dllm train export-model {path} OUT` writes a checkpoint's model folder"] if has_checkpoints else [])
    kind = "a checkpoint of a training run" if run != path else "a training run's folder"
    return f"{path} is {kind}, not a model folder: {'; '.join(ways)}"


def check_checkpoint_dir(path: Path, allow_pickle: bool = False) -> dict:
    """Validate a checkpoint directory before handing it to transformers; returns its config dict."""
    cfg_file = path / "config.json"
    if not cfg_file.exists():
        raise CheckpointError(_not_a_model_folder(path))
    try:
        config = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{cfg_file} is not valid JSON ({err})") from None
    family_of(config, where=str(cfg_file))  # a format dllm loads, or a CheckpointError naming the supported ones
    has_st = (path / "model.safetensors").exists() or (path / "model.safetensors.index.json").exists()
    has_bin = (path / "pytorch_model.bin").exists() or (path / "pytorch_model.bin.index.json").exists()
    if not has_st:
        if has_bin and not allow_pickle:
            raise CheckpointError(
                f"{path} holds only pickled PyTorch weights (pytorch_model.bin); dllm loads safetensors by default. "
                "Convert them, or pass allow_pickle=True if you trust the file"
            )
        if not has_bin:
            raise CheckpointError(f"{path} has a config.json but no weights (model.safetensors or an index)")
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        missing = sorted(s for s in shards if not (path / s).exists())
        if missing:
            raise CheckpointError(f"{path}: shards listed in the index are missing: {', '.join(missing)}")
    return config


def stored_parameter_count(path: Path) -> int | None:
    """Parameters stored in a checkpoint's safetensors files, read from their headers (no tensor is
    loaded, so this is instant for an 8B model); None for pickled weights."""
    from safetensors import safe_open

    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text()).get("weight_map", {}).values()))
    elif (path / "model.safetensors").exists():
        files = ["model.safetensors"]
    else:
        return None
    total = 0
    for name in files:
        with safe_open(str(path / name), framework="pt") as f:
            for key in f.keys():
                total += math.prod(f.get_slice(key).get_shape())
    return total


def check_device(device: str | torch.device) -> torch.device:
    """``device`` as a torch.device that exists here; CheckpointError (one clear line) if it does not."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise CheckpointError(f"device={str(device)!r} is not a torch device; e.g. cpu, cuda, cuda:1, mps") from None
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise CheckpointError(f"device={str(device)!r}: {build}; use device='cpu'")
        if dev.index is not None and dev.index >= count:
            raise CheckpointError(f"device={str(device)!r}: only {count} CUDA device(s) here (cuda:0..cuda:{count - 1})")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise CheckpointError(f"device={str(device)!r}: MPS is not available here; use device='cpu'")
    return dev


def load_model(
    name_or_path: str | Path,
    *,
    dtype: str | torch.dtype | None = None,
    device: str | torch.device | None = None,
    device_map: str | dict | None = None,
    adapter: str | Path | None = None,
    merge_adapter: bool = True,
    attention_policy: str | None = None,
    block_size: int | None = None,
    allow_pickle: bool = False,
) -> DiffusionLM:
    """Load a dllm model offline.

    ``attention_policy``/``block_size`` override the checkpoint's (a D2F LoRA ships for the
    unmodified bidirectional base and runs block-causal). ``adapter`` is a PEFT LoRA directory,
    merged into the weights unless ``merge_adapter=False``.
    """
    path = resolve_model_path(name_or_path)
    family = family_of(check_checkpoint_dir(path, allow_pickle=allow_pickle))
    if device is not None:
        check_device(device)
    kwargs: dict = {"use_safetensors": not allow_pickle or None}
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise CheckpointError(f"dtype={dtype!r}; valid: {', '.join(DTYPES)}")
        dtype = DTYPES[dtype]
    if dtype is not None:
        kwargs["dtype"] = dtype
    if device_map is not None:
        kwargs["device_map"] = device_map
    if attention_policy is not None:
        if attention_policy not in ATTENTION_POLICIES:
            raise CheckpointError(f"attention_policy={attention_policy!r}; valid: {', '.join(ATTENTION_POLICIES)}")
        kwargs["attention_policy"] = attention_policy
    if block_size is not None:
        kwargs["block_size"] = block_size
    model = family.model_class.from_pretrained(str(path), **kwargs)  # dispatched on architectures[0]
    if adapter is not None:
        model = attach_adapter(model, adapter, merge=merge_adapter)
    if device is not None and device_map is None:
        model = model.to(device)
    return model.eval()


def attach_adapter(model: DiffusionLM, adapter: str | Path, merge: bool = True):
    """Load a PEFT LoRA adapter on ``model``; merged into the base weights by default."""
    from peft import PeftModel

    adapter = Path(adapter).expanduser()
    if not adapter.exists() and (cached := _from_hub_cache(str(adapter))) is not None:
        adapter = cached  # a repo id already in the Hugging Face cache
    if not (adapter / "adapter_config.json").exists():
        raise CheckpointError(f"{adapter} is not a PEFT adapter directory (no adapter_config.json)")
    peft_model = PeftModel.from_pretrained(model, str(adapter))
    return peft_model.merge_and_unload() if merge else peft_model
