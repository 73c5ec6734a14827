"""Growth (model.grow_from): a deeper and/or MLP-wider model that starts with exactly the checkpoint's function."""

from __future__ import annotations

import pytest
import torch

from dllm.testing import tiny_dream, tiny_llada
from dllm.training.config import ConfigError, SFTConfig, load_config
from dllm.training.models import grow_depth
from dllm.training.sft import SFTTrainer

from .conftest import micro_overrides


def _logits(model, ids):
    with torch.no_grad():
        return model.eval()(ids).logits


@pytest.mark.parametrize("n_tgt", [2, 3, 5])
def test_grown_llada_computes_the_same_function(n_tgt):
    source = tiny_llada(seed=1, initializer_range=0.5)
    target = tiny_llada(seed=2, n_layers=n_tgt, initializer_range=0.5)
    ids = torch.randint(0, 60, (2, 11), generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(_logits(source, ids), _logits(target, ids))
    mapping = grow_depth(target, source)
    assert mapping == {i: i * 2 // n_tgt for i in range(n_tgt)}
    torch.testing.assert_close(_logits(target, ids), _logits(source, ids), rtol=1e-5, atol=1e-5)
    blocks = target.model.transformer.blocks
    for i in range(n_tgt):
        first = min(k for k, v in mapping.items() if v == mapping[i]) == i
        assert bool(blocks[i].attn_out.weight.abs().sum() > 0) == first
        assert bool(blocks[i].ff_out.weight.abs().sum() > 0) == first
        assert torch.equal(blocks[i].q_proj.weight, source.model.transformer.blocks[mapping[i]].q_proj.weight)


@pytest.mark.parametrize("grown", [{"num_hidden_layers": 4}, {"intermediate_size": 160},
                                   {"num_hidden_layers": 3, "intermediate_size": 160}])
def test_grown_dream_computes_the_same_function(grown):
    source = tiny_dream(seed=1, initializer_range=0.5)
    target = tiny_dream(seed=2, initializer_range=0.5, **grown)
    ids = torch.randint(0, 60, (1, 9), generator=torch.Generator().manual_seed(1))
    assert not torch.allclose(_logits(source, ids), _logits(target, ids))
    grow_depth(target, source)
    torch.testing.assert_close(_logits(target, ids), _logits(source, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_tgt", [2, 3])
def test_wider_mlp_llada_computes_the_same_function(n_tgt):
    source = tiny_llada(seed=1, initializer_range=0.5)
    target = tiny_llada(seed=2, n_layers=n_tgt, mlp_hidden_size=240, initializer_range=0.5)
    fresh = {k: v.clone() for k, v in target.state_dict().items()}
    ids = torch.randint(0, 60, (2, 11), generator=torch.Generator().manual_seed(0))
    mapping = grow_depth(target, source)
    torch.testing.assert_close(_logits(target, ids), _logits(source, ids), rtol=1e-5, atol=1e-5)
    for i in range(n_tgt):
        block, src = target.model.transformer.blocks[i], source.model.transformer.blocks[mapping[i]]
        assert torch.equal(block.ff_proj.weight[:96], src.ff_proj.weight)
        assert torch.equal(block.up_proj.weight[:96], src.up_proj.weight)
        # new units: fresh input weights (they learn), zero output weights (they add nothing yet)
        key = f"model.transformer.blocks.{i}.ff_proj.weight"
        assert torch.equal(block.ff_proj.weight[96:], fresh[key][96:]) and block.ff_proj.weight[96:].abs().sum() > 0
        assert block.ff_out.weight.shape == (48, 240) and not block.ff_out.weight[:, 96:].any()
    # the new units can train: their zero output weights get a gradient
    target.train()
    loss = target(ids).logits.logsumexp(-1).mean()
    loss.backward()
    assert target.model.transformer.blocks[0].ff_out.weight.grad[:, 96:].abs().sum() > 0


def test_grow_refuses_other_widths_and_fewer_layers():
    source = tiny_llada(n_layers=2)
    with pytest.raises(ValueError, match="only the number of layers and the MLP hidden size may grow"):
        grow_depth(tiny_llada(n_layers=4, d_model=64), source)
    with pytest.raises(ValueError, match="only the number of layers and the MLP hidden size may grow"):
        grow_depth(tiny_llada(mlp_hidden_size=64), source)  # narrower
    with pytest.raises(ValueError, match="at least as many layers"):
        grow_depth(tiny_llada(n_layers=1), source)


def test_sft_run_grows_a_checkpoint(tmp_path):
    base = load_config(SFTConfig, None, micro_overrides(tmp_path / "base", max_steps=2))
    SFTTrainer(base).run()
    src = tmp_path / "base" / "final"
    grown = load_config(SFTConfig, None, micro_overrides(
        tmp_path / "grown", max_steps=1, **{"model.grow_from": str(src),
                                             "model.config": "{d_model: 32, n_layers: 2, n_heads: 2, n_kv_heads: 2, "
                                                             "mlp_hidden_size: 64}"}))
    trainer = SFTTrainer(grown)
    trainer.setup_models()
    from dllm.loading import load_model

    source = load_model(str(src))
    ids = torch.tensor([trainer.tokenizer("What is 1 + 2 ?")["input_ids"]])
    assert trainer.model.spec.num_layers == 2 and source.spec.num_layers == 1
    torch.testing.assert_close(_logits(trainer.model, ids), _logits(source, ids), rtol=1e-5, atol=1e-5)
    result = SFTTrainer(grown).run()
    assert result.status == "finished" and result.step == 1


def test_path_and_grow_from_are_exclusive(tmp_path):
    # caught when the config is read, before any checkpoint is resolved
    with pytest.raises(ConfigError, match="exclusive.*model.path=null"):
        load_config(SFTConfig, None, micro_overrides(tmp_path / "x", **{"model.grow_from": "tiny",
                                                                        "model.path": "tiny"}))
    cfg = load_config(SFTConfig, None, micro_overrides(tmp_path / "x", **{"model.grow_from": "tiny",
                                                                          "model.path": "null"}))
    assert cfg.model.path is None and cfg.model.grow_from == "tiny"
