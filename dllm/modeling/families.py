"""The checkpoint families dllm loads, and which one a ``config.json`` belongs to.

A family is found by the checkpoint's ``architectures[0]``, with ``model_type`` as the fallback:
two families may share a ``model_type`` (LLaDA-MoE ships ``"llada"``, as dense LLaDA does), never an
architecture. Each family records what a loader needs when a checkpoint leaves it out: the known
mask id, and the attention and logit conventions its models are trained with.
"""

from __future__ import annotations

from dataclasses import dataclass

from dllm.errors import CheckpointError
from dllm.special_ids import KNOWN_MASK_IDS

from .configuration import _FAMILY_LOOKUP, DreamConfig, LLaDAConfig
from .core import DreamModel, LLaDAModelLM


@dataclass(frozen=True)
class Family:
    name: str  # what users call it ("LLaDA", "Dream", ...)
    architecture: str  # architectures[0] of its config.json
    model_type: str
    config_class: type
    model_class: type
    mask_token_id: int | None  # the published mask id, for a config.json without one
    attention: str  # "bidirectional" | "block_causal": how the published checkpoints attend
    logits: str  # "aligned" (token i from position i) | "shifted" (token i from position i - 1)


FAMILIES: list[Family] = [
    Family("LLaDA", "LLaDAModelLM", "llada", LLaDAConfig, LLaDAModelLM, 126336, "bidirectional", "aligned"),
    Family("Dream", "DreamModel", "Dream", DreamConfig, DreamModel, 151666, "bidirectional", "shifted"),
]


KNOWN_MASK_IDS.update({f.name: f.mask_token_id for f in FAMILIES if f.mask_token_id is not None})

# architectures[0] -> why dllm does not load it yet and what to use instead (a format module fills it in)
UNSUPPORTED: dict[str, str] = {}


def register(family: Family) -> None:
    """Add a family (a format module calls this once, next to its config and model classes)."""
    if any(f.architecture == family.architecture for f in FAMILIES):
        raise ValueError(f"architecture {family.architecture!r} is registered already")
    FAMILIES.append(family)
    if family.mask_token_id is not None:
        KNOWN_MASK_IDS[family.name] = family.mask_token_id  # named by require_mask_token's error


def family_of(config: dict, where: str = "config.json") -> Family:
    """The family of a checkpoint's config dict: by ``architectures[0]``, else by ``model_type``.

    CheckpointError naming what the config says and what dllm loads when no family matches.
    """
    architectures = config.get("architectures") or []
    if architectures:
        for f in FAMILIES:
            if f.architecture == architectures[0]:
                return f
    model_type = config.get("model_type")
    matches = [f for f in FAMILIES if f.model_type == model_type]
    if matches and not architectures:
        return matches[0]  # the first registered family of that model_type (its dense original)
    if architectures and architectures[0] in UNSUPPORTED:
        raise CheckpointError(f"{where} has architectures={architectures!r}: {UNSUPPORTED[architectures[0]]}")
    known = ", ".join(f"{f.architecture} ({f.model_type})" for f in FAMILIES)
    said = f"architectures={architectures!r}, model_type={model_type!r}"
    raise CheckpointError(f"{where} has {said}; dllm loads: {known}")


_FAMILY_LOOKUP[:] = [family_of]
