"""The three trainers by name (``sft``, ``distill``, ``grpo``): their config classes, config loaders and
trainer classes, for ``dllm train KIND`` and for rebuilding a run from its ``config.yaml``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .config import ConfigError, DistillConfig, SFTConfig, load_config

KINDS = ("sft", "distill", "grpo")


def config_class(kind: str) -> type:
    if kind == "grpo":
        from .grpo_config import GRPOConfig

        return GRPOConfig
    return SFTConfig if kind == "sft" else DistillConfig


def load_kind_config(kind: str, path: str | Path | None, overrides: list[str]):
    """The recipe at ``path`` with ``overrides``, checked as ``kind``'s trainer checks it."""
    if kind == "grpo":
        from .grpo_config import load_grpo_config

        return load_grpo_config(path, overrides)
    return load_config(config_class(kind), path, overrides)


def trainer_class(kind: str) -> type:
    if kind == "sft":
        from .sft import SFTTrainer

        return SFTTrainer
    if kind == "distill":
        from .distill import DistillTrainer

        return DistillTrainer
    from .grpo import GRPOTrainer

    return GRPOTrainer


def trainer_kind(config: dict) -> str:
    """The trainer whose config ``config`` (a run's config.yaml) is: the one kind whose fields hold all its
    top-level keys. A run written before a field was added lacks that key (it resumes with the field's
    default), so the keys need not be all of the fields; each kind has keys of its own that tell it."""
    keys = set(config)
    kinds = [kind for kind in KINDS if keys <= {f.name for f in dataclasses.fields(config_class(kind))}]
    if len(kinds) != 1:
        raise ConfigError("the run's config.yaml is not the config of an sft, distill or grpo run "
                          f"(top-level keys {sorted(keys)})")
    return kinds[0]
