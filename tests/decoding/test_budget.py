"""A call that cannot fit in memory is refused before anything is allocated, with the estimate."""

import pytest
import torch

from dllm import DiffusionGenerationConfig
from dllm.decoding import budget
from dllm.decoding.errors import GenerationConfigError
from dllm.testing import tiny_llada


def test_the_estimate_counts_rows_branches_and_slots():
    model = tiny_llada()
    cfg = DiffusionGenerationConfig(strategy="lopa", lopa_branches=3, max_new_tokens=20, block_length=8)
    est = budget.estimate(model, rows=2, prompt_length=7, cfg=cfg)
    spec = model.spec
    assert est.rows == 2 * 4 and est.slots == 7 + 24  # 20 tokens round up to three blocks of 8
    assert est.kv_bytes == est.rows * est.slots * 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 4
    single = budget.estimate(model, rows=2, prompt_length=7, cfg=cfg.replace(strategy="threshold"))
    assert single.rows == 2 and single.total < est.total


def test_a_call_too_large_for_memory_is_refused_before_any_forward(monkeypatch):
    model = tiny_llada()
    calls = []
    monkeypatch.setattr(budget, "available_bytes", lambda device: 50 * 2**20)  # 50 MiB free
    monkeypatch.setattr(type(model), "forward", lambda *a, **k: calls.append(1))
    ids = torch.randint(0, 60, (64, 12))
    with pytest.raises(GenerationConfigError, match=r"needs about .*\(64 rows x 33 LoPA branches .* 50 MiB free"):
        model.generate(ids, strategy="lopa", lopa_branches=32, max_new_tokens=512, block_length=8)
    assert not calls
    monkeypatch.undo()
    out = model.generate(ids[:2], strategy="threshold", max_new_tokens=8, block_length=8)  # a small call still runs
    assert out.shape == (2, 20)
