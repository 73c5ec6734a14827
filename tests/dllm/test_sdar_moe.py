"""SDAR-MoE (SDAR-30B-A3B format): its modeling file is transformers' Qwen3-MoE with SDAR's block mask, so the
reference here is transformers' own ``Qwen3MoeForCausalLM`` loading the same folder under that mask."""

from __future__ import annotations

import json

import pytest
import torch

import dllm
from dllm.modeling import CheckpointConfigError, SDARMoeConfig, SDARMoeForCausalLM, family_of
from dllm.testing import save_tiny_moe_checkpoint, tiny_moe_model

TOL = 1e-4  # fp32 logits


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("sdar-moe")
    save_tiny_moe_checkpoint(d, "sdar-moe", seed=0, scale=2.0)
    return d


def _reference(folder, **overrides):
    """transformers' Qwen3-MoE with the folder's weights and sizes (eager attention, so a 4D mask is added as is)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    c = json.loads((folder / "config.json").read_text())
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "max_position_embeddings",
            "decoder_sparse_step", "moe_intermediate_size", "num_experts_per_tok", "num_experts", "norm_topk_prob",
            "mlp_only_layers", "tie_word_embeddings")
    config = Qwen3MoeConfig(**{**{k: c[k] for k in keys}, **overrides})
    model, info = Qwen3MoeForCausalLM.from_pretrained(str(folder), config=config, attn_implementation="eager",
                                                      output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]  # the published Qwen3-MoE tensor names
    return model.eval()


def _block_mask(length: int, block: int) -> torch.Tensor:
    """SDAR's mask: blocks from position 0, each sees itself and every block before it (additive 0 / -inf)."""
    blocks = torch.arange(length) // block
    allowed = blocks[None, :] <= blocks[:, None]
    return torch.zeros(1, 1, length, length).masked_fill(~allowed, float("-inf"))


def test_folder_loads_as_sdar_moe_with_both_kinds_of_layer(folder):
    model = dllm.load_model(folder)
    assert type(model) is SDARMoeForCausalLM and model.is_block_causal and model.spec.block_size == 4
    assert family_of(json.loads((folder / "config.json").read_text())).name == "SDAR-MoE"
    names = set(model.state_dict())
    assert "model.layers.0.mlp.experts.15.down_proj.weight" in names and "model.layers.0.mlp.gate.weight" in names
    assert "model.layers.1.mlp.gate_proj.weight" in names  # mlp_only_layers: [1]
    assert not any(n.startswith("model.layers.1.mlp.experts") for n in names)


def test_auto_classes_load_the_folder_without_remote_code(folder):
    from transformers import AutoConfig, AutoModelForCausalLM

    assert type(AutoConfig.from_pretrained(folder)) is SDARMoeConfig
    assert type(AutoModelForCausalLM.from_pretrained(folder)) is SDARMoeForCausalLM


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_logits_equal_qwen3_moe_under_the_block_mask(folder, norm_topk_prob):
    model = dllm.load_model(folder)
    for m in model.modules():  # the router flag, as a checkpoint with the other setting would give it
        if hasattr(m, "norm_topk_prob"):
            m.norm_topk_prob = norm_topk_prob
    ref = _reference(folder, norm_topk_prob=norm_topk_prob)
    gen = torch.Generator().manual_seed(1)
    for n in (13, 16):
        x = torch.randint(4, 400, (2, n), generator=gen)
        with torch.no_grad():
            want = ref(x, attention_mask=_block_mask(n, 4)).logits
            got = model(x, prompt_length=None).logits
        assert (got - want).abs().max().item() <= TOL
    with torch.no_grad():  # the mask matters: full attention gives other numbers
        assert (ref(x, attention_mask=torch.zeros(1, 1, n, n)).logits - want).abs().max().item() > 1e-2


def test_renormalising_the_top_k_changes_the_output(folder):
    a = tiny_moe_model("sdar-moe", seed=0, scale=2.0)
    b = tiny_moe_model("sdar-moe", seed=0, scale=2.0, norm_topk_prob=False)
    x = torch.randint(4, 400, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert (a(x, prompt_length=None).logits - b(x, prompt_length=None).logits).abs().max().item() > 1e-3


def test_block_by_block_cache_equals_the_full_forward(folder):
    model = dllm.load_model(folder)
    B = model.spec.block_size
    x = torch.randint(4, 400, (2, 3 * B + 3), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(x, prompt_length=None).logits
        cache = model.allocate_cache(torch.ones_like(x, dtype=torch.bool), prompt_length=None)
        for s in range(0, x.shape[1], B):
            part = model(x[:, s:s + B], kv_cache=cache, cache_mode="prefix", cache_start=s).logits
            assert (part - full[:, s:s + B]).abs().max().item() <= TOL


def test_layer_rule_and_bad_configs():
    cfg = SDARMoeConfig(num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    assert [cfg.is_moe_layer(i) for i in range(6)] == [False, True, False, False, False, True]
    assert not SDARMoeConfig(num_experts=0).is_moe_layer(0)
    assert SDARMoeConfig(num_experts=0).expert_layout() is None  # dllm info then shows no experts line
    assert str(cfg.expert_layout()) == "128 routed, top 8, in 2 of 6 layers"
    for bad, said in (({"num_experts_per_tok": 9, "num_experts": 8}, "num_experts_per_tok=9"),
                      ({"decoder_sparse_step": 0}, "decoder_sparse_step=0"),
                      ({"attention_bias": True}, "attention_bias=true")):
        with pytest.raises(CheckpointConfigError, match=said):
            SDARMoeConfig(**bad).core_spec()


def test_generate_uses_the_family_decoder_and_the_cache_changes_nothing(folder):
    model = dllm.load_model(folder)
    cfg = model.diffusion_generation_config
    assert cfg.strategy == "sdar" and cfg.block_length == 4
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    out = model.generate(ids, max_new_tokens=8, return_dict_in_generate=True)
    with pytest.warns(UserWarning, match="strategy 'sdar' does not read cache"):  # its blocks' cache is exact
        plain = model.generate(ids, max_new_tokens=8, cache="none", return_dict_in_generate=True)
    assert out.sequences.shape == (1, 14) and torch.equal(out.sequences, plain.sequences)
    assert not (out.sequences[0, 6:] == 3).any()  # every [MASK] was filled


def test_dllm_info_reports_the_family(folder):
    from typer.testing import CliRunner

    from dllm.cli import app

    facts = json.loads(CliRunner().invoke(app, ["info", str(folder), "--json"]).stdout)
    want = {"family": "SDAR-MoE", "attention": "block_causal", "block_size": 4, "logits": "aligned",
            "blocks_from": "position 0",
            "experts": {"routed": 16, "top_k": 4, "moe_layers": 2, "layers": 3, "expert_parameters": 3 * 32 * 16}}
    assert {k: facts[k] for k in want} == want
    # a token runs 4 of the 16 experts in each of the 2 MoE layers: the other 12 are idle
    assert facts["active_parameters"] == facts["parameters"] - 2 * 12 * 3 * 32 * 16
    text = CliRunner().invoke(app, ["info", str(folder)]).stdout
    assert "16 routed, top 4, in 2 of 3 layers" in text


def test_the_30b_a3b_shape_has_its_published_parameter_count():
    """Qwen3-30B-A3B's shape, which SDAR-30B-A3B is trained from: 30.5B parameters, 3.3B active per token.
    Built on the meta device with 1 and 2 layers (48 layers of 128 experts would be 18,432 modules), the
    rest counted from the difference."""
    from accelerate import init_empty_weights

    shape = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_attention_heads=32,
                 num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                 vocab_size=151936, tie_word_embeddings=False)
    counts = []
    for layers in (1, 2):
        with init_empty_weights():
            model = SDARMoeForCausalLM(SDARMoeConfig(num_hidden_layers=layers, **shape))
        counts.append(sum(p.numel() for p in model.parameters()))
    per_layer = counts[1] - counts[0]
    total = counts[0] + 47 * per_layer
    layout = SDARMoeConfig(num_hidden_layers=48, **shape).expert_layout()  # what dllm info reports
    assert (layout.moe_layers, layout.expert_parameters) == (48, 3 * 2048 * 768)
    active = total - layout.idle_parameters
    assert 30.4e9 < total < 30.6e9 and 3.2e9 < active < 3.4e9
    assert len(model.model.layers[1].mlp.experts) == 128


def test_a_config_without_head_dim_writes_the_derived_one(tmp_path):
    """Qwen3-MoE's default head size is hidden / heads; it is written out, since the family's own code reads
    ``getattr(config, "head_dim", ...)`` and a null would win over its default."""
    config = SDARMoeConfig(hidden_size=64, num_attention_heads=4)
    config.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["head_dim"] == 16 == config.core_spec().head_dim
