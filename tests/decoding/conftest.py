"""Tiny LLaDA-format models the decoding tests share (random weights, blocks of 4)."""

from __future__ import annotations

import pytest
import torch

from dllm.testing import EOS, tiny_llada

BLOCK = 4


@pytest.fixture(scope="module")
def bc_model():
    """Block-causal, blocks of 4 from the prompt end (a D2F student's layout)."""
    return tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=BLOCK)


@pytest.fixture(scope="module")
def eos_bc_model():
    """Block-causal, and EOS is likely: rows stop at different times (some leave before others join)."""
    m = tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=BLOCK, seed=1)
    with torch.no_grad():
        head = m.model.transformer["ff_out"].weight
        head[EOS] = head[EOS] * 0 + m.model.transformer["ln_f"].weight.sign() * 1.5
    return m
