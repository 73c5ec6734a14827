"""Whether a run's models fit in memory, decided before any of them is built.

A model is counted, not built: a checkpoint's parameters come from its safetensors headers, a fresh
model's from its config instantiated on the ``meta`` device (no storage). Training keeps, per
trainable parameter, the weight, its gradient and AdamW's two moment estimates, all in the weights'
dtype: 4 x 4 = 16 bytes in float32, 8 in bfloat16; a frozen model (a distillation teacher, GRPO's
reference model, a LoRA base) keeps only its weights. Activations come on top, so the estimate is a
lower bound: a run it refuses could not have run.

Where the memory is: on a CPU run, all of it in RAM (``psutil``'s available memory), once per process
of the machine. On a GPU, every model is built in RAM first (its weights), then moved; the full
estimate is compared with the GPU's free memory, except under DeepSpeed, whose ZeRO stage and offload
settings decide what each GPU holds (not checked).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ConfigError

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
GB = 1e9


class ModelTooLarge(ConfigError):
    """The run's models would not fit in the free memory (``allow_large_model=true`` skips the check)."""


@dataclass
class ModelCost:
    """One model of a run, as the memory check counts it."""

    label: str  # "the model", "the teacher", ...
    params: int
    dtype: str  # the weights' dtype (a DTYPE_BYTES key)
    trainable: bool  # gets gradients and AdamW states

    @property
    def weight_bytes(self) -> int:
        return self.params * DTYPE_BYTES.get(self.dtype, 4)

    @property
    def training_bytes(self) -> int:
        # weights + gradients + AdamW exp_avg + exp_avg_sq, all in the weights' dtype
        return self.weight_bytes * (4 if self.trainable else 1)


def checkpoint_parameters(path: str | Path) -> int | None:
    """Parameters stored in a checkpoint directory's ``*.safetensors`` files, read from their headers
    (8 bytes of length, then JSON; no tensor is read). None when it holds no safetensors file."""
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                n = 1
                for dim in entry["shape"]:
                    n *= int(dim)
                total += n
    return total


def module_parameters(model_class, config) -> int:
    """Parameters of ``model_class(config)``, built on the ``meta`` device (shapes only, no memory)."""
    with torch.device("meta"):
        model = model_class(config)
    return sum(p.numel() for p in model.parameters())


def free_bytes(device: torch.device) -> tuple[int, str]:
    """Free memory where ``device``'s tensors live, and its name in a message."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free), f"free on {device} ({torch.cuda.get_device_name(device)})"
    import psutil  # an accelerate dependency

    return int(psutil.virtual_memory().available), "available RAM"


def local_processes() -> int:
    """Training processes on this host (each holds its own copy of the models)."""
    return max(1, int(os.environ.get("LOCAL_WORLD_SIZE") or 1))


def describe(models: list[ModelCost], processes: int = 1) -> str:
    """``8.02B parameters x 16 bytes (float32 weights, gradients, 2 AdamW states) = 128.2 GB``, model by model."""
    parts = []
    for m in models:
        per = DTYPE_BYTES.get(m.dtype, 4) * (4 if m.trainable else 1)
        what = f"{m.dtype} weights, gradients, 2 AdamW states" if m.trainable else f"{m.dtype} weights, frozen"
        parts.append(f"{m.label}: {_count(m.params)} parameters x {per} bytes ({what}) = "
                     f"{m.training_bytes / GB:.2f} GB")
    text = "; ".join(parts)
    return f"{text}; x {processes} processes on this host" if processes > 1 else text


def check_fits(models: list[ModelCost], device: torch.device, deepspeed: bool = False,
               free: tuple[int, str] | None = None, ram: tuple[int, str] | None = None,
               processes: int | None = None) -> None:
    """ModelTooLarge when ``models`` cannot fit where the run would put them (see the module text).
    ``free``/``ram``: the free memory to compare with (default: measured now)."""
    processes = local_processes() if processes is None else processes
    hint = ("use a smaller model (model.config), model.dtype=bfloat16, LoRA (lora.enabled=true where the trainer "
            "has it) or more processes with DeepSpeed, or set allow_large_model=true to try anyway")
    if device.type == "cpu":
        need = sum(m.training_bytes for m in models) * processes
        avail, where = free if free is not None else free_bytes(device)
        if need > avail:
            raise ModelTooLarge(f"the run needs at least {need / GB:.2f} GB ({describe(models, processes)}) and "
                                f"{avail / GB:.2f} GB is {where}: {hint}")
        return
    # on an accelerator, every model is first built in RAM, then moved
    need_ram = sum(m.weight_bytes for m in models) * processes
    avail, where = ram if ram is not None else free_bytes(torch.device("cpu"))
    if need_ram > avail:
        raise ModelTooLarge(f"building the models needs at least {need_ram / GB:.2f} GB of RAM (their weights, "
                            f"x {processes} processes) and {avail / GB:.2f} GB is {where}: {hint}")
    if deepspeed:  # ZeRO partitions and may offload: what one GPU holds depends on its JSON
        return
    need = sum(m.training_bytes for m in models)
    avail, where = free if free is not None else free_bytes(device)
    if need > avail:
        raise ModelTooLarge(f"the run needs at least {need / GB:.2f} GB per device ({describe(models)}) and "
                            f"{avail / GB:.2f} GB is {where}: {hint}")


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"
