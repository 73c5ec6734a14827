"""The arguments a transformers user passes to ``generate``, in dllm's terms.

``model.generate`` takes dllm's :class:`~dllm.decoding.config.DiffusionGenerationConfig` fields, and also
what ``transformers`` users write: ``do_sample``, ``temperature``, ``top_p``, ``top_k``, ``max_new_tokens``,
``max_length``, ``num_return_sequences``, ``eos_token_id`` (one id or a list: every id stops a row),
``min_new_tokens`` (dllm's ``min_tokens``), ``pad_token_id``, ``stop_strings``, ``guidance_scale`` and a
``transformers.GenerationConfig`` as ``generation_config=``. Fields with no meaning for a diffusion
canvas (beam search, repetition penalties, per-step scores) are named in one warning when they ask for
something; ones that ask for nothing (``use_cache=False``, ``output_scores=False``) pass silently.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from dllm.decoding.config import DiffusionGenerationConfig, check_option_names
from dllm.decoding.errors import GenerationConfigError

# transformers names dllm maps (the rest of a GenerationConfig is checked by _inert)
MAPPED = {"max_new_tokens", "max_length", "do_sample", "temperature", "top_p", "top_k", "num_return_sequences",
          "eos_token_id", "pad_token_id", "return_dict_in_generate", "stop_strings", "guidance_scale",
          "min_new_tokens"}
# transformers fields that ask for nothing at these values (and bookkeeping keys of a saved GenerationConfig)
_INERT = {"num_beams": (1,), "num_beam_groups": (1,), "repetition_penalty": (1.0,), "length_penalty": (1.0,),
          "use_cache": (True, False), "output_attentions": (False,), "output_hidden_states": (False,),
          "output_scores": (False,), "output_logits": (False,), "bos_token_id": None, "decoder_start_token_id": None,
          "_from_model_config": None, "transformers_version": None, "cache_implementation": None,
          "renormalize_logits": (False,), "remove_invalid_values": (False,), "low_memory": (False, None)}


@dataclasses.dataclass
class Request:
    """What one ``generate`` call asks for, in dllm's terms."""

    overrides: dict[str, Any]  # DiffusionGenerationConfig fields
    num_return_sequences: int = 1


def translate(prompt_length: int, hf_config=None, **kwargs: Any) -> Request:
    """dllm config overrides from a ``transformers.GenerationConfig`` (its set fields) and keyword
    arguments (they win), for prompts of ``prompt_length`` tokens (``max_length`` counts them)."""
    hf = {}
    if hf_config is not None:
        hf = {k: v for k, v in hf_config.to_dict().items() if v is not None}
    ours = {f.name for f in dataclasses.fields(DiffusionGenerationConfig)}
    unknown = [k for k in kwargs if k not in ours and k not in MAPPED and k not in _INERT and not _is_transformers_field(k)]
    if unknown:
        check_option_names(unknown)  # raises, naming them and the valid fields
    merged = {**hf, **kwargs}
    ignored = []
    for name, value in list(merged.items()):
        if name in ours or name in MAPPED:
            continue
        allowed = _INERT.get(name, ())
        if allowed is None or value in allowed:
            merged.pop(name)
        elif name in hf or _is_transformers_field(name):
            merged.pop(name)
            ignored.append(f"{name}={value!r}")
    if ignored:
        _warn(f"generate ignores {', '.join(ignored)}: a diffusion canvas has no beams, repetition "
              "penalties or per-step scores (dllm decodes with the given strategy)")
    out: dict[str, Any] = {k: v for k, v in merged.items() if k in ours and k not in MAPPED}
    _sampling(merged, out)
    _lengths(merged, out, prompt_length)
    if merged.get("eos_token_id") is not None:  # one id or a list: every id stops (the config checks them)
        eos = merged["eos_token_id"]
        out["eos_token_id"] = list(eos) if isinstance(eos, (list, tuple)) else eos
    if merged.get("min_new_tokens") is not None:  # no EOS id before that many answer tokens
        out["min_tokens"] = merged["min_new_tokens"]
    if merged.get("pad_token_id") is not None:
        out["pad_token_id"] = _one_id("pad_token_id", merged["pad_token_id"])
    if merged.get("return_dict_in_generate") is not None:
        out["return_dict_in_generate"] = bool(merged["return_dict_in_generate"])
    if merged.get("stop_strings") is not None:
        out["stop_strings"] = merged["stop_strings"]
    if merged.get("guidance_scale") not in (None, 1.0):  # transformers: uncond + g (cond - uncond); LLaDA: w = g - 1
        out["cfg_scale"] = float(merged["guidance_scale"]) - 1.0
    n = merged.get("num_return_sequences")
    n = 1 if n is None else n
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise GenerationConfigError(f"num_return_sequences must be a positive integer, got {n!r}")
    return Request(out, n)


def _sampling(merged: dict, out: dict) -> None:
    """``do_sample=False`` is greedy whatever the temperature (as in transformers); ``do_sample=True``
    samples at ``temperature`` (default 1.0). dllm itself reads only ``temperature`` (0: greedy)."""
    if merged.get("temperature") is not None:
        out["temperature"] = float(merged["temperature"])
    if merged.get("do_sample") is False:
        out["temperature"] = 0.0
    elif merged.get("do_sample") is True and not out.get("temperature"):
        out["temperature"] = 1.0
    if merged.get("top_p") is not None:
        out["top_p"] = None if merged["top_p"] >= 1.0 else float(merged["top_p"])
    if merged.get("top_k") is not None:
        out["top_k"] = None if merged["top_k"] == 0 else int(merged["top_k"])


def _lengths(merged: dict, out: dict, prompt_length: int) -> None:
    if merged.get("max_new_tokens") is not None:
        out["max_new_tokens"] = merged["max_new_tokens"]
    elif merged.get("max_length") is not None:
        new = int(merged["max_length"]) - prompt_length
        if new < 1:
            raise GenerationConfigError(f"max_length={merged['max_length']} leaves no room after the "
                                        f"{prompt_length}-token prompt; use max_new_tokens")
        out["max_new_tokens"] = new


def _one_id(name: str, value) -> int:
    if isinstance(value, (list, tuple)):
        if not value:
            raise GenerationConfigError(f"{name} is an empty list")
        if len(value) > 1:
            _warn(f"{name}={list(value)}: dllm pads with one id, the first ({value[0]})")
        value = value[0]
    return int(value)


def _warn(message: str) -> None:
    """A warning attributed to the caller's line, past dllm's and torch's own frames."""
    import sys

    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").split(".")[0] in ("dllm", "torch"):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, stacklevel=level + 1)


def _is_transformers_field(name: str) -> bool:
    from transformers import GenerationConfig

    return name in GenerationConfig().to_dict()
