"""``generate``: one :class:`~dllm.decoding.decode_session.DecodeSession` stepped until it finishes."""

from __future__ import annotations

import torch

from .config import DiffusionGenerationConfig
from .decode_session import DecodeSession, resolve_special_ids
from .output import DiffusionGenerateOutput

__all__ = ["generate", "resolve_special_ids"]


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
    batch = DecodeSession(model, cfg, tokenizer=tokenizer, streamer=streamer, branch_executor=branch_executor)
    batch.add_rows(input_ids, attention_mask)
    return batch.run()
