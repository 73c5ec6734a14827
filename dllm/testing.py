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


def tiny_tokenizer():
    """A word-level tokenizer over the task suites' texts (built, not downloaded)."""
    from dllm.eval.tasks import get_suite, suite_names

    from .tokenization import build_tokenizer

    texts = []
    for name in suite_names():
        for ex in get_suite(name).examples("train", 200, seed=0) + get_suite(name).examples("test", 50, seed=0):
            texts += [ex.prompt, ex.answer]
    return build_tokenizer(texts)


def save_tiny_checkpoint(directory, *, block_causal: bool = False, block_size: int = 8, seed: int = 0,
                         initializer_range: float = 0.5, generation_config=None):
    """A random LLaDA-format checkpoint + tokenizer in ``directory``; returns (model, tokenizer)."""
    from .tokenization import special_token_ids

    tok = tiny_tokenizer()
    ids = special_token_ids(tok)
    extra = {"attention_policy": "block_causal", "block_size": block_size} if block_causal else {}
    model = tiny_llada(seed=seed, vocab_size=len(tok), embedding_size=len(tok), initializer_range=initializer_range,
                       **ids, **extra)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    if generation_config is not None:
        generation_config.save_pretrained(directory)
    return model, tok
