"""``generate``: validate inputs, build the canvas, run the strategy's loop, assemble the output."""

from __future__ import annotations

import time
import warnings

import torch

from dllm.special_ids import check_in_vocabulary, require_mask_token

from .budget import check_memory
from .config import DiffusionGenerationConfig
from .errors import GenerationConfigError
from .registry import check_compatible, get_strategy
from .state import DecodeState, DiffusionGenerateOutput


def resolve_special_ids(model, cfg: DiffusionGenerationConfig, tokenizer=None) -> tuple[int, int | None]:
    if cfg.mask_token_id is not None:
        check_in_vocabulary(model, "mask_token_id", cfg.mask_token_id)
        mask_id = cfg.mask_token_id
    else:
        mask_id = require_mask_token(model, tokenizer)
    eos_id = cfg.eos_token_id
    if eos_id is None:
        eos_id = getattr(model.config, "eos_token_id", None)
        if isinstance(eos_id, (list, tuple)):
            eos_id = eos_id[0] if eos_id else None
    if eos_id is None and tokenizer is not None:
        eos_id = tokenizer.eos_token_id
    return int(mask_id), (None if eos_id is None else int(eos_id))


def generate(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    cfg: DiffusionGenerationConfig,
    *,
    streamer=None,
    tokenizer=None,
    branch_executor=None,
) -> DiffusionGenerateOutput:
    if not torch.is_tensor(input_ids) or input_ids.dim() != 2 or 0 in input_ids.shape \
            or input_ids.dtype not in (torch.int64, torch.int32):
        got = f"{input_ids.dtype} of shape {tuple(input_ids.shape)}" if torch.is_tensor(input_ids) else type(input_ids).__name__
        raise GenerationConfigError(f"input_ids must be a non-empty LongTensor of shape [batch, prompt_length]; got {got}")
    vocab = model.get_input_embeddings().num_embeddings
    lo, hi = (int(v) for v in torch.aminmax(input_ids))  # one reduction, once per call
    if lo < 0 or hi >= vocab:
        raise GenerationConfigError(f"input_ids hold ids outside the model's vocabulary [0, {vocab}): "
                                    f"min {lo}, max {hi} (another model's tokenizer?)")
    limit = getattr(model.config, "max_sequence_length", None) or getattr(model.config, "max_position_embeddings", None)
    if limit and input_ids.shape[1] + cfg.max_new_tokens > limit:
        warnings.warn(f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                      f"model's context length ({limit}); answers past it are unreliable", stacklevel=3)
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise GenerationConfigError(
                f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape {tuple(input_ids.shape)}"
            )
        if bool((attention_mask[:, -1] == 0).any()):
            raise GenerationConfigError("prompts must be left-padded (attention_mask ends with 1 on every row)")
    strategy = get_strategy(cfg.strategy)
    check_compatible(strategy, model, cfg)
    mask_id, eos_id = resolve_special_ids(model, cfg, tokenizer)
    if cfg.stop_strings and tokenizer is None:
        raise GenerationConfigError("stop_strings need the tokenizer: pass tokenizer= to generate")
    if bool((input_ids == mask_id).any()):
        raise GenerationConfigError(f"the prompt contains the mask token id {mask_id}; masks are for the canvas only")
    check_memory(model, input_ids.shape[0], input_ids.shape[1], cfg)  # refuse, not fail mid-allocation
    device = model.get_input_embeddings().weight.device
    input_ids = input_ids.to(device)
    attention_mask = attention_mask.to(device) if attention_mask is not None else None
    gen = None
    if cfg.seed is not None:
        gen = torch.Generator(device=device).manual_seed(cfg.seed)
    t0 = time.perf_counter()
    state = DecodeState(input_ids, attention_mask, cfg, mask_id=mask_id, eos_id=eos_id, tokenizer=tokenizer,
                        streamer=streamer)
    extra = {"executor": branch_executor} if strategy.name == "lopa" else {}
    stats = strategy.load()(model, state, gen, **extra)
    total = time.perf_counter() - t0
    return state.finish(total_seconds=total, forward_seconds=stats.pop("forward_seconds", 0.0), stats=stats)
