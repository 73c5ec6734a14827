"""Shared fixtures: the bundled tokenizer and micro configs that train in a second or two."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dllm.tokenization import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
TOKENIZER_DIR = REPO / "dllm" / "bundled" / "tiny"
# the padded-digit tokenizer the bundled models shipped with before number tags (see its README)
PADDED_TOKENIZER_DIR = REPO / "tests" / "fixtures" / "padded-digit-tokenizer"
MICRO_MODEL = {"d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 2, "mlp_hidden_size": 64}


@pytest.fixture(autouse=True)
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(TOKENIZER_DIR)


@pytest.fixture(scope="session")
def padded_digit_tokenizer():
    return load_tokenizer(PADDED_TOKENIZER_DIR)


def micro_overrides(run_dir, **extra) -> list[str]:
    """key=value overrides for a from-scratch micro SFT run on arith."""
    base = {
        "run_dir": str(run_dir), "max_steps": 6, "batch_size": 4, "num_threads": 1, "log_every": 1,
        "save_every": 0, "progress": "false", "model.tokenizer": str(TOKENIZER_DIR),
        "model.config": "{d_model: 32, n_layers: 1, n_heads: 2, n_kv_heads: 2, mlp_hidden_size: 64}",
        "data.tasks": "{arith: 1}", "data.max_new_tokens": 8, "data.chunk_size": 64, "data.eos_pad": "random",
        "optim.lr": "1e-3", "optim.warmup_steps": 2,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]
