"""The block-diffusion checkpoint families: SDAR (TraDo, LightningRL), Fast-dLLM v2, and the Dream format
of DiffuCoder / Dream-Coder. Loading in the published layout, logits against numbers computed by each
family's own modeling code (tests/fixtures/<family>/README.md), the exact block cache, padding, the
saved layout, and what ``dllm info`` reports."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import dllm
from dllm.errors import CheckpointError
from dllm.modeling import FastDLLMQwenConfig, SDARConfig, family_of
from dllm.testing import save_tiny_block_checkpoint, tiny_block_model

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAMILY_DIR = {"sdar": "sdar", "fast-dllm-v2": "fast_dllm_v2", "diffucoder": "diffucoder"}
RECIPE = {"sdar": dict(seed=0, scale=8.0, silent=(2, 3)), "fast-dllm-v2": dict(seed=0, scale=8.0, silent=(2, 3)),
          "diffucoder": dict(seed=1, scale=8.0, silent=(2, 3))}
TOL = 1e-4  # fp32 logits


def weights_sha256(model) -> str:
    h = hashlib.sha256()
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def _expected_sha(family: str) -> str:
    d = FIXTURES / FAMILY_DIR[family]
    meta = json.loads((d / ("model.json" if family == "diffucoder" else "generate.json")).read_text())
    return meta["model"]["sha256"]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each family's tiny checkpoint written in its published layout, loaded back with dllm.load_model."""
    out = {}
    for family, recipe in RECIPE.items():
        d = tmp_path_factory.mktemp(family)
        save_tiny_block_checkpoint(d, family, **recipe)
        model = dllm.load_model(d)
        if weights_sha256(model) != _expected_sha(family):
            pytest.fail(f"the {family} checkpoint is not the one the reference numbers were computed on; "
                        "recompute them (tests/fixtures/<family>/README.md)")
        out[family] = (d, model)
    return out


def _shift(ref: torch.Tensor) -> torch.Tensor:
    """The references return unshifted logits; dllm's forward reads token i at position i - 1."""
    return torch.cat([ref[:1], ref[:-1]])


@pytest.mark.parametrize("family", list(RECIPE))
def test_logits_equal_the_reference(checkpoints, family):
    _, model = checkpoints[family]
    d = FIXTURES / FAMILY_DIR[family]
    ref = load_file(str(d / "logits.safetensors"))
    prompts = json.loads((d / "prompts.json").read_text())
    for n in (13, 16):
        x = torch.tensor([prompts[str(n)]])
        with torch.no_grad():
            ours = model(x, prompt_length=None).logits[0] if model.is_block_causal else model(x).logits[0]
        want = _shift(ref[f"full_{n}"]) if model.spec.logit_shift else ref[f"full_{n}"]
        assert (ours - want).abs().max().item() <= TOL
        if f"cached_{n}" in ref:  # the reference's own block-by-block cached forward, same numbers
            want = _shift(ref[f"cached_{n}"]) if model.spec.logit_shift else ref[f"cached_{n}"]
            assert (ours - want).abs().max().item() <= TOL


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
def test_block_by_block_cache_equals_the_full_forward(checkpoints, family):
    _, model = checkpoints[family]
    B = model.spec.block_size
    x = torch.randint(4, 400, (2, 3 * B + 3), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(x, prompt_length=None).logits
        cache = model.allocate_cache(torch.ones_like(x, dtype=torch.bool), prompt_length=None)
        parts = [model(x[:, s:s + B], kv_cache=cache, cache_mode="prefix", cache_start=s).logits
                 for s in range(0, x.shape[1], B)]
    for i, s in enumerate(range(0, x.shape[1], B)):
        e = min(x.shape[1], s + B)
        # shifted logits: a block's first slot is read at the previous block's last position, which
        # this block-only input does not hold (the decoders feed from one slot earlier)
        skip = 1 if model.spec.logit_shift and s > 0 else 0
        assert (parts[i][:, skip:] - full[:, s + skip:e]).abs().max().item() <= TOL


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
def test_left_padding_keeps_each_row_on_its_own_position_grid(checkpoints, family):
    _, model = checkpoints[family]
    rows = [list(range(10, 15)), list(range(20, 31))]
    ids = torch.zeros(2, 11, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, 11 - len(r):] = torch.tensor(r)
        mask[i, 11 - len(r):] = 1
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, prompt_length=None).logits
        for i, r in enumerate(rows):
            alone = model(torch.tensor([r]), prompt_length=None).logits[0]
            skip = 1 if model.spec.logit_shift else 0  # a first token has no position before it to be read at
            assert (batch[i, 11 - len(r) + skip:] - alone[skip:]).abs().max().item() <= TOL
    # the eager backend (CPU training in 16-bit) keeps padding rows finite, as SDPA does
    eager = model(ids, attention_mask=mask, prompt_length=None, attn_backend="eager").logits
    assert torch.isfinite(eager).all() and (eager - batch).abs().max().item() <= TOL


def test_published_configs_load_unchanged_at_full_size():
    """The published config.json files build the released sizes (meta device, no weights): the
    parameter counts match the safetensors index's total size (bf16)."""
    for family, cls in (("sdar", SDARConfig), ("fast_dllm_v2", FastDLLMQwenConfig)):
        layout = json.loads((FIXTURES / family / "published_layout.json").read_text())
        config = layout["config"]
        fam = family_of(config)
        assert fam.config_class is cls and fam.attention == "block_causal"
        with torch.device("meta"):
            model = fam.model_class(cls(**{k: v for k, v in config.items() if k != "torch_dtype"}))
        assert 2 * sum(p.numel() for p in model.parameters()) == layout["total_size_bytes"]
        spec = model.spec
        assert spec.block_alignment == "position"
        if family == "sdar":
            assert (spec.head_dim, spec.block_size, spec.qk_norm, spec.logit_shift) == (128, 4, True, False)
            assert model.config.mask_token_id == 151669
        else:
            assert (spec.block_size, spec.qkv_bias, spec.logit_shift) == (32, True, True)
            assert model.config.mask_token_id == 151665  # not in its config.json: the family's known id


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
def test_saved_folder_has_the_published_layout(checkpoints, family, tmp_path):
    """Interchange: a model saved here has the published config keys, generation config keys and
    tensor names (per layer and top level), in sharded safetensors with an index."""
    src, model = checkpoints[family]
    layout = json.loads((FIXTURES / FAMILY_DIR[family] / "published_layout.json").read_text())
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    saved = json.loads((tmp_path / "config.json").read_text())
    ours = {"pad_token_id", "mask_token_id"}  # the tiny checkpoint's ids (the bundled tokenizer's)
    assert set(layout["config_keys"]) - {"torch_dtype"} <= set(saved)
    assert set(saved) - set(layout["config_keys"]) <= ours
    assert saved["architectures"] == layout["config"]["architectures"]
    assert saved["auto_map"] == layout["config"]["auto_map"]
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert set(layout["generation_config_keys"]) - {"do_sample", "temperature", "top_k", "top_p",
                                                    "repetition_penalty"} <= set(gen)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert len(set(index.values())) > 1
    n = saved["num_hidden_layers"]
    want = set(layout["tensors_top"]) | {t.replace(".N.", f".{i}.") for t in layout["tensors_per_layer"] for i in range(n)}
    assert set(index) == want
    again = dllm.load_model(tmp_path)
    assert weights_sha256(again) == weights_sha256(model)


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
def test_loading_a_published_folder_warns_of_nothing(checkpoints, family, monkeypatch):
    """The published ``torch_dtype`` key is read back without transformers' deprecation warning for the name."""
    import transformers.configuration_utils as configuration_utils

    said = []
    monkeypatch.setattr(configuration_utils.logger, "warning_once", lambda msg, *a, **k: said.append(str(msg)))
    d, model = checkpoints[family]
    config = type(model.config).from_pretrained(d)
    assert "torch_dtype" in json.loads(config.to_json_string()) and config.torch_dtype == config.dtype
    assert not [m for m in said if "torch_dtype" in m]


def test_auto_classes_load_the_folders_without_remote_code(checkpoints):
    from transformers import AutoConfig, AutoModelForCausalLM

    for family in ("sdar", "fast-dllm-v2"):
        d, model = checkpoints[family]
        assert type(AutoConfig.from_pretrained(d)).__name__ in ("SDARConfig", "FastDLLMQwenConfig")
        auto = AutoModelForCausalLM.from_pretrained(d)  # trust_remote_code is not needed
        assert type(auto) is type(model) and weights_sha256(auto) == weights_sha256(model)


def test_generation_config_eos_list_and_family_defaults(checkpoints):
    d, model = checkpoints["sdar"]
    g = model.diffusion_generation_config
    assert (g.strategy, g.block_length, g.threshold, g.eos_token_id) == ("sdar", 4, 0.85, 2)
    _, fast = checkpoints["fast-dllm-v2"]
    g = fast.diffusion_generation_config
    assert (g.strategy, g.block_length, g.sub_block_length) == ("fast_dllm_v2", 8, 8)


def test_unsupported_and_broken_checkpoints_say_what_to_do(tmp_path):
    with pytest.raises(CheckpointError, match=r"dllm loads: .*SDARForCausalLM \(sdar\).*SDARMoeForCausalLM"):
        family_of({"architectures": ["SDARNextForCausalLM"], "model_type": "sdar_next"})
    assert family_of({"model_type": "sdar"}).name == "SDAR"  # model_type is the fallback
    model = tiny_block_model("sdar", mask_token_id=None)
    with pytest.raises(CheckpointError, match='set "mask_token_id" in its config.json'):
        model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=4)
    config = json.loads((FIXTURES / "sdar" / "published_layout.json").read_text())["config"]
    with pytest.raises(Exception, match="attention_bias=true"):
        SDARConfig(**{**config, "attention_bias": True}).core_spec()


def test_dllm_info_reports_the_family(checkpoints):
    from typer.testing import CliRunner

    from dllm.cli import app

    for family, want in (("sdar", {"family": "SDAR", "attention": "block_causal", "block_size": 4, "logits": "aligned",
                                   "blocks_from": "position 0"}),
                         ("fast-dllm-v2", {"family": "Fast-dLLM v2", "block_size": 8, "logits": "shifted"}),
                         ("diffucoder", {"family": "Dream", "attention": "bidirectional", "logits": "shifted"})):
        d, _ = checkpoints[family]
        result = CliRunner().invoke(app, ["info", str(d), "--json"])
        facts = json.loads(result.stdout)
        assert {k: facts[k] for k in want} == want
        assert facts["mask_token_id"] == 3 and facts["eos_token_id"] == [2] and facts["parameters"] > 0
