"""LLaDA2.1's token-to-token (editing) objective: random replacements of visible answer tokens and the loss on them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dllm.training.objectives import sft_noise, t2t_corrupt, t2t_loss

MASK = 3


def _batch():
    ids = torch.randint(4, 60, (64, 20), generator=torch.Generator().manual_seed(0))
    answer = torch.zeros_like(ids, dtype=torch.bool)
    answer[:, 6:] = True
    return ids, answer


def test_corruption_touches_only_visible_answer_slots():
    ids, answer = _batch()
    noisy, masked, _ = sft_noise(ids, answer, MASK, torch.Generator().manual_seed(1))
    out, visible = t2t_corrupt(noisy, masked, answer, 0.3, vocab_size=60, mask_id=MASK,
                               generator=torch.Generator().manual_seed(2))
    changed = out != noisy
    assert not changed[~visible].any()  # prompt and masked slots untouched
    assert torch.equal(visible, answer & ~masked)
    assert not (out[changed] == MASK).any() and int(out.max()) < 60
    assert 0.2 < changed.sum().item() / visible.sum().item() < 0.35  # ~0.3, less the draws of the same token
    again, _ = t2t_corrupt(noisy, masked, answer, 0.3, 60, MASK, torch.Generator().manual_seed(2))
    assert torch.equal(out, again)
    none, _ = t2t_corrupt(noisy, masked, answer, 0.0, 60, MASK, torch.Generator().manual_seed(2))
    assert torch.equal(none, noisy)


def test_t2t_loss_is_per_row_normalised_cross_entropy():
    logits = torch.randn(2, 5, 7)
    targets = torch.randint(0, 7, (2, 5))
    visible = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)
    lengths = torch.tensor([5, 4])
    ce = F.cross_entropy(logits.reshape(-1, 7), targets.reshape(-1), reduction="none").view(2, 5)
    want = ((ce[0] * visible[0]).sum() / 5 + (ce[1] * visible[1]).sum() / 4) / 2
    assert t2t_loss(logits, targets, visible, lengths).item() == pytest.approx(want.item(), rel=1e-6)


def test_sft_runs_with_the_editing_objective(tmp_path):
    from dllm.testing import save_tiny_checkpoint
    from dllm.training import SFTConfig, SFTTrainer

    save_tiny_checkpoint(tmp_path / "bc", block_causal=True, block_size=8)
    losses = {}
    for prob in (0.0, 0.2):
        cfg = SFTConfig(run_dir=str(tmp_path / f"run{prob}"), max_steps=2, batch_size=4, num_threads=1,
                        save_every=0, progress=False, model={"path": str(tmp_path / "bc")},
                        data={"tasks": {"arith": 1}, "max_new_tokens": 16}, t2t_corrupt_prob=prob)
        trainer = SFTTrainer(cfg)
        trainer.setup_models()
        from dllm.training.data import TaskStream

        batch = TaskStream(trainer.tokenizer, cfg.data, 4, seed=0, pad_multiple=8).next_batch()
        losses[prob] = trainer.compute_loss(trainer.model, batch, torch.Generator().manual_seed(0)).item()
    assert losses[0.2] > losses[0.0] > 0  # the T2T term adds to the masked-token loss


def test_the_editing_recipe_loads():
    from pathlib import Path

    from dllm.training.config import SFTConfig, load_config

    cfg = load_config(SFTConfig, Path(__file__).resolve().parents[2] / "recipes" / "tiny-d2f-editing.yaml")
    assert cfg.model.path == "tiny-d2f" and cfg.t2t_corrupt_prob == 0.1 and cfg.max_steps == 1000
