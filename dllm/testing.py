"""Tiny random models for tests and examples (a few thousand parameters, CPU-fast)."""

from __future__ import annotations

import torch

from .modeling import DreamConfig, DreamModel, LLaDAConfig, LLaDAModelLM

VOCAB = 64
MASK = 63
EOS = 62
PAD = 61


def tiny_llada(seed: int = 0, **overrides) -> LLaDAModelLM:
    cfg = dict(
        d_model=48, n_layers=2, n_heads=4, n_kv_heads=4, mlp_hidden_size=96, vocab_size=VOCAB,
        embedding_size=VOCAB, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, rope_theta=10000.0,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    return LLaDAModelLM(LLaDAConfig(**cfg)).eval()


def tiny_dream(seed: int = 0, **overrides) -> DreamModel:
    cfg = dict(
        vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, mask_token_id=MASK, eos_token_id=EOS, pad_token_id=PAD, bos_token_id=EOS,
        rope_theta=10000.0,
    )
    cfg.update(overrides)
    torch.manual_seed(seed)
    return DreamModel(DreamConfig(**cfg)).eval()
