"""LLaDA2.x and LLaDA-MoE: loading offline, exact logits against the reference modeling code, MoE dispatch.

The reference numbers are in tests/fixtures/moe/ (README there: which upstream code, how it was run).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import dllm
from dllm.modeling import (
    CheckpointConfigError,
    LLaDA2MoeModelLM,
    LLaDAConfig,
    LLaDAModelLM,
    LLaDAMoEConfig,
    LLaDAMoEModelLM,
    family_of,
)
from dllm.modeling.moe import Experts, route_sigmoid_grouped, route_softmax
from dllm.testing import tiny_llada, tiny_moe_config, tiny_moe_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "moe"
TOL = 1e-4  # fp32, max abs logit difference


def test_llada2_logits_equal_the_reference(moe_checkpoints):
    model = dllm.load_model(moe_checkpoints["llada2"])
    assert isinstance(model, LLaDA2MoeModelLM) and model.is_block_causal and model.spec.block_alignment == "position"
    ref = load_file(FIXTURES / "llada2_logits.safetensors")
    with torch.no_grad():
        # the reference's generate: blocks of 8 from position 0 (prompt_length 0 puts the grid there)
        block = model(ref["input_ids"], prompt_length=0, block_size=8).logits
        full = model(ref["input_ids"], attention_policy="bidirectional").logits
    assert (block - ref["logits_block8"]).abs().max().item() <= TOL
    assert (full - ref["logits_bidirectional"]).abs().max().item() <= TOL


def test_llada_moe_logits_equal_the_reference(moe_checkpoints):
    model = dllm.load_model(moe_checkpoints["llada-moe"])
    assert isinstance(model, LLaDAMoEModelLM) and not model.is_block_causal
    ref = load_file(FIXTURES / "llada_moe_logits.safetensors")
    with torch.no_grad():
        logits = model(ref["input_ids"]).logits
    assert (logits - ref["logits"]).abs().max().item() <= TOL


@pytest.mark.parametrize("family", ["llada2", "llada-moe"])
def test_tensor_names_are_the_published_ones(moe_checkpoints, family):
    names = json.loads((FIXTURES / "reference_tensor_names.json").read_text())[family]
    index = json.loads((moe_checkpoints[family] / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == sorted(names)
    assert len(set(index["weight_map"].values())) == 2  # sharded, as the published checkpoints are


def test_dispatch_on_architecture(moe_checkpoints, tmp_path):
    moe_cfg = json.loads((moe_checkpoints["llada-moe"] / "config.json").read_text())
    assert moe_cfg["model_type"] == "llada" and moe_cfg["architectures"] == ["LLaDAMoEModelLM"]
    assert family_of(moe_cfg).model_class is LLaDAMoEModelLM
    assert family_of({"model_type": "llada"}).model_class is LLaDAModelLM  # no architecture: the dense original
    tiny_llada().save_pretrained(tmp_path / "dense")
    assert isinstance(dllm.load_model(tmp_path / "dense"), LLaDAModelLM)


def test_auto_classes_load_both_llada_formats(moe_checkpoints, tmp_path):
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    assert isinstance(AutoConfig.from_pretrained(moe_checkpoints["llada-moe"]), LLaDAMoEConfig)
    assert isinstance(AutoModel.from_pretrained(moe_checkpoints["llada-moe"]), LLaDAMoEModelLM)
    assert isinstance(AutoModelForCausalLM.from_pretrained(moe_checkpoints["llada2"]), LLaDA2MoeModelLM)
    tiny_llada().save_pretrained(tmp_path / "dense")
    assert type(AutoConfig.from_pretrained(tmp_path / "dense")) is LLaDAConfig
    assert isinstance(AutoModel.from_pretrained(tmp_path / "dense"), LLaDAModelLM)


@pytest.mark.parametrize("pad", [0, 3])
def test_llada2_block_by_block_cache_equals_the_full_forward(moe_checkpoints, pad):
    """Finished blocks cached and each next block fed alone give the full forward's logits (the grid
    starts at the first valid slot: left padding moves it)."""
    model = dllm.load_model(moe_checkpoints["llada2"])
    ids = torch.randint(4, 402, (1, pad + 29), generator=torch.Generator().manual_seed(0))
    valid = torch.ones_like(ids, dtype=torch.bool)
    valid[:, :pad] = False
    anchor = torch.tensor([pad])
    with torch.no_grad():
        full = model(ids, attention_mask=valid.long(), prompt_length=anchor, block_size=8).logits
        cache = model.allocate_cache(valid, prompt_length=anchor)
        parts, start = [], 0
        for end in (pad + 8, pad + 16, pad + 24, pad + 29):
            parts.append(model(ids[:, start:end], kv_cache=cache, cache_mode="prefix", cache_start=start,
                               block_size=8).logits)
            start = end
    cached = torch.cat(parts, 1)
    assert (cached[:, pad:] - full[:, pad:]).abs().max().item() <= TOL


def test_sigmoid_router_bias_selects_only_and_groups_limit():
    logits = torch.tensor([[2.0, 1.9, -3.0, -3.0, 0.0, 0.1, -1.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 5.0, 0.0])
    ids, w = route_sigmoid_grouped(logits, bias, top_k=2, n_group=4, topk_group=2, routed_scaling_factor=2.5)
    # groups {0,1} {2,3} {4,5} {6,7}: biased group scores pick {6,7} and {0,1}; experts 6 and 0 win
    assert sorted(ids[0].tolist()) == [0, 6]
    s = torch.sigmoid(logits[0, [0, 6]])  # weights from the unbiased scores, renormalised, scaled
    expected = 2.5 * s / s.sum()
    got = dict(zip(ids[0].tolist(), w[0].tolist()))
    assert got[0] == pytest.approx(expected[0].item()) and got[6] == pytest.approx(expected[1].item())
    ids, _ = route_sigmoid_grouped(logits, None, top_k=2, n_group=4, topk_group=1, routed_scaling_factor=1.0)
    assert sorted(ids[0].tolist()) == [0, 1]  # one group only: its two experts


def test_softmax_router_keeps_the_bias_in_the_weights():
    logits = torch.tensor([[1.0, 0.0, 0.5, -1.0]])
    bias = torch.tensor([0.0, 0.3, 0.0, 0.0])
    ids, w = route_softmax(logits, bias, top_k=2)
    p = torch.softmax(logits[0], -1) + bias
    assert ids[0].tolist() == p.topk(2).indices.tolist()
    assert torch.allclose(w[0], p.topk(2).values)  # not renormalised


@pytest.mark.parametrize("accumulate", [torch.float32, None])
def test_expert_dispatch_paths_agree(accumulate):
    torch.manual_seed(0)
    experts = Experts(8, 16, 12)
    x = torch.randn(40, 16)
    ids = torch.stack([torch.randperm(8)[:3] for _ in range(40)])
    ids[:5] = torch.tensor([0, 1, 2])  # experts 3..7 get fewer tokens; some may get none
    w = torch.rand(40, 3)
    with torch.no_grad():
        loop = experts(x, ids, w, path="loop", accumulate=accumulate)
        for path in ("sorted", "grouped"):
            assert (experts(x, ids, w, path=path, accumulate=accumulate) - loop).abs().max().item() <= 1e-5


def test_expert_dispatch_path_is_validated():
    with pytest.raises(ValueError, match="valid: auto, loop, sorted, grouped"):
        Experts(2, 4, 4)(torch.randn(3, 4), torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1), path="fused")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_grouped_paths_equal_the_loop(dtype):
    torch.manual_seed(0)
    experts = Experts(64, 256, 128).cuda().to(dtype)
    x = torch.randn(512, 256, device="cuda", dtype=dtype)
    ids = torch.stack([torch.randperm(64, device="cuda")[:8] for _ in range(512)])
    w = torch.rand(512, 8, device="cuda")
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    with torch.no_grad():
        loop = experts(x, ids, w, path="loop").float()
        for path in ("auto", "sorted", "grouped"):
            assert (experts(x, ids, w, path=path).float() - loop).abs().max().item() <= tol


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_llada2_forward_matches_cpu(moe_checkpoints):
    model = dllm.load_model(moe_checkpoints["llada2"])
    ref = load_file(FIXTURES / "llada2_logits.safetensors")
    with torch.no_grad():
        gpu = model.cuda()(ref["input_ids"].cuda(), prompt_length=0, block_size=8).logits.cpu()
    assert (gpu - ref["logits_block8"]).abs().max().item() <= 1e-3  # TF32/cuBLAS reorderings


def test_config_errors_name_the_field():
    with pytest.raises(CheckpointConfigError, match="lacks .*num_experts"):
        LLaDAMoEConfig(vocab_size=10, hidden_size=8, num_hidden_layers=1, num_attention_heads=2).core_spec()
    with pytest.raises(CheckpointConfigError, match="use_bias"):
        tiny_moe_config("llada2", use_bias=True).core_spec()
    with pytest.raises(CheckpointConfigError, match="moe_layer_freq"):
        tiny_moe_config("llada-moe", moe_layer_freq=[1]).core_spec()


def test_save_and_reload_keep_logits_and_config_keys(moe_checkpoints, tmp_path):
    for family, path in moe_checkpoints.items():
        model = dllm.load_model(path)
        model.save_pretrained(tmp_path / family)
        again = dllm.load_model(tmp_path / family)
        ids = torch.randint(4, 402, (1, 16))
        kw = {"prompt_length": 0} if family == "llada2" else {}
        with torch.no_grad():
            assert torch.equal(model(ids, **kw).logits, again(ids, **kw).logits)
        before = json.loads((path / "config.json").read_text())
        after = json.loads((tmp_path / family / "config.json").read_text())
        assert set(before) <= set(after)
        assert {k: after[k] for k in before if k != "transformers_version"} == {
            k: v for k, v in before.items() if k != "transformers_version"}


@pytest.mark.slow  # 15,000 expert projections are built (on the meta device): ~10 s
def test_published_defaults_instantiate_at_real_size():
    """LLaDA2.0-mini's published shape (meta device: no memory): 16.3B parameters, 256 experts."""
    from accelerate import init_empty_weights

    with init_empty_weights():
        model = LLaDA2MoeModelLM(dllm.modeling.LLaDA2MoeConfig())
    total = sum(p.numel() for p in model.parameters())
    assert 16.0e9 < total < 16.5e9
    assert len(model.model.layers[1].mlp.experts) == 256
    # LLaDA2.0-mini's card: 16B parameters, 1.4B active per token (8 of 256 routed experts, one shared)
    active = total - model.config.expert_layout().idle_parameters
    assert 1.3e9 < active < 1.5e9


@pytest.mark.parametrize("family,moe_layers", [("llada2", 2), ("llada-moe", 2)])
def test_dllm_info_reports_the_experts_and_the_active_parameters(moe_checkpoints, family, moe_layers):
    import json

    from typer.testing import CliRunner

    from dllm.cli import app

    facts = json.loads(CliRunner().invoke(app, ["info", str(moe_checkpoints[family]), "--json"]).stdout)
    layout = facts["experts"]
    assert (layout["routed"], layout["top_k"], layout["moe_layers"], layout["layers"]) == (16, 4, moe_layers, 3)
    idle = layout["moe_layers"] * (16 - 4) * layout["expert_parameters"]
    assert facts["active_parameters"] == facts["parameters"] - idle


def test_tiny_moe_models_are_deterministic():
    a, b = tiny_moe_model("llada2", seed=3), tiny_moe_model("llada2", seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
