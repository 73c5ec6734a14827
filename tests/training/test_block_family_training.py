"""Training the block-diffusion families: SDAR's two-stream SFT objective (exact against per-block
forwards), LoRA on their projection names, a start from another format's weights, GRPO with the
families' own decoders (the trajectory replay is exact), and the exported folder's layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import dllm
from dllm.testing import tiny_block_model
from dllm.training import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer
from dllm.training.models import init_from_checkpoint, lora_targets
from dllm.training.rl_objectives import loss_mask, scatter_views, trajectory_views, view_logprobs
from dllm.training.rollouts import stop_point
from dllm.training.sft import two_stream_logits

TOL = 2e-5
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.mark.parametrize("family", ["sdar", "fast-dllm-v2"])
def test_two_stream_logits_equal_per_block_forwards(family):
    """Each noised block's logits in the [noisy | clean] forward are those of a canvas holding the clean
    earlier blocks and that noised block: the two-stream forward is SDAR's objective, exactly."""
    model = tiny_block_model(family, seed=3, scale=2.0)
    B = model.spec.block_size
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(4, 400, (2, 3 * B + 2), generator=g)
    noisy = torch.where(torch.rand(clean.shape, generator=g) < 0.5, torch.full_like(clean, 3), clean)
    am = torch.ones_like(clean)
    am[1, :3] = 0  # a left-padded row: its blocks follow its own positions
    p = 5
    with torch.no_grad():
        two = two_stream_logits(model, noisy, clean, am, p)
        for r in range(2):
            first = int(am[r].argmax())
            for s in range(first, clean.shape[1], B):  # the row's blocks, from its position 0
                e = min(clean.shape[1], s + B)
                canvas = torch.cat([clean[r, first:s], noisy[r, s:e]])[None]
                ref = model(canvas, prompt_length=None).logits[0, s - first:]
                lo = max(s, p)
                skip = 1 if model.spec.logit_shift and s > first else 0  # read at the clean previous slot
                if lo + skip < e:
                    got = two[r, lo + skip - p:e - p]
                    want = ref[lo + skip - s:]
                    if model.spec.logit_shift and skip:
                        want = model(torch.cat([clean[r, first:s], noisy[r, s:e]])[None],
                                     prompt_length=None).logits[0, lo + skip - first:e - first]
                    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def test_init_from_another_format_copies_roles_and_calibrates_qk_norms():
    tiny = dllm.load_model("tiny")
    from dllm import load_tokenizer
    from dllm.training.config import ModelSection
    from dllm.training.models import scratch_config

    tok = load_tokenizer("tiny")
    section = ModelSection(config={"model_type": "sdar", "hidden_size": 128, "intermediate_size": 1152,
                                   "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 4,
                                   "head_dim": 32, "block_size": 8})
    cls, config = scratch_config(section, tok)
    model = cls(config)
    counts = init_from_checkpoint(model, tiny, tok, calibration_texts=10)
    assert counts == {"copied": 3 + 6 * 9, "kept": 0}
    layer, src = model._blocks()[2], tiny._blocks()[2]
    assert torch.equal(layer._m("o").weight, src._m("o").weight) and torch.equal(model.lm_head.weight,
                                                                                    tiny._head().weight)
    w = layer._m("q_norm").weight
    w = w.detach()
    assert bool((w == w[0]).all()) and 0.1 < float(w[0]) < 100  # one scale per layer: the mean per-head RMS
    assert config.auto_map["AutoModelForCausalLM"] == "modeling_sdar.SDARForCausalLM"


def test_lora_targets_use_the_models_own_names():
    sdar, llada = tiny_block_model("sdar"), dllm.load_model("tiny")
    assert lora_targets(sdar, ["q_proj", "k_proj", "v_proj", "attn_out"]) == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert lora_targets(llada, ["q_proj", "attn_out"]) == ["q_proj", "attn_out"]


def _sdar_section(**extra):
    return {"tokenizer": "tiny", "config": {"model_type": "sdar", "hidden_size": 32, "intermediate_size": 48,
                                            "num_hidden_layers": 2, "num_attention_heads": 4,
                                            "num_key_value_heads": 2, "head_dim": 16, "block_size": 4}, **extra}


@pytest.mark.parametrize("lora", [False, True])
def test_sft_on_an_sdar_format_model_exports_the_published_layout(tmp_path, lora):
    args = SFTConfig(run_dir=str(tmp_path / "run"), max_steps=3, batch_size=4, progress=False, eval_every=0,
                     save_every=0, model=_sdar_section(), data={"tasks": {"arith": 1.0}, "max_new_tokens": 8},
                     lora={"enabled": lora, "r": 4, "alpha": 8})
    result = SFTTrainer(args=args).train()
    out = tmp_path / "run" / "final"
    assert result.step == 3
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["SDARForCausalLM"] and config["block_size"] == 4
    published = json.loads((FIXTURES / "sdar" / "published_layout.json").read_text())["config_keys"]
    assert set(published) <= set(config) and set(config) - set(published) <= {"pad_token_id"}
    assert (out / "adapter" / "adapter_config.json").exists() == lora
    if lora:
        assert "o_proj" in json.loads((out / "adapter" / "adapter_config.json").read_text())["target_modules"]
    model = dllm.load_model(out)
    assert model.diffusion_generation_config.strategy == "sdar"
    assert any(k.endswith("self_attn.q_norm.weight") for k in model.state_dict())


def _capture(model):
    calls = []

    def hook(module, args, kwargs, output):
        calls.append({"logits": output.logits.detach().float().clone(), "logits_range": kwargs.get("logits_range"),
                      "cache_start": kwargs.get("cache_start", 0)})

    return calls, model.register_forward_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("family,strategy", [("sdar", "sdar"), ("fast-dllm-v2", "fast_dllm_v2")])
def test_trajectory_replays_the_family_decoders(family, strategy):
    """The decoder's own forwards (cached, on the model's grid) and the trajectory estimator's replay on
    the block-causal view (prompt_length=None) give the same log-probs."""
    model = tiny_block_model(family, seed=2, scale=4.0)
    torch.set_num_threads(1)
    m, B = 3, model.spec.block_size
    cfg = model.diffusion_generation_config.replace(strategy=strategy, max_new_tokens=2 * B, block_length=B,
                                                   temperature=1.0, threshold=0.3, stop_at_eos=False,
                                                   mask_token_id=m, eos_token_id=2, return_dict_in_generate=True)
    checked = 0
    for i, prompt in enumerate([[5, 6, 7], [9, 10, 11, 12, 13, 14]]):
        ids = torch.tensor([prompt])
        calls, handle = _capture(model)
        try:
            out = model.generate(ids, generation_config=cfg.replace(seed=5 + i))
        finally:
            handle.remove()
        p = ids.shape[1]
        gen, smap = out.sequences[0, p:], out.step_map[0]
        lengths, _ = stop_point(gen[None], smap[None], out.num_forwards, 2)
        mask = loss_mask(lengths, gen.shape[0]) & (smap >= 1)[None]
        views = trajectory_views(gen[None], smap[None], mask, m)
        got = scatter_views(view_logprobs(model, views, ids, torch.ones_like(ids), gen[None], mask_id=m,
                                          suppress_mask=True, block_causal_size=B,
                                          forward_kwargs={"prompt_length": None, "block_size": B}), views, 1)[0]
        for k, call in enumerate(calls, start=1):
            now = (smap == k) & mask[0]
            if not bool(now.any()):
                continue
            a = call["logits_range"][0] if call["logits_range"] else 0
            slots = torch.nonzero(now).flatten() + p - (call["cache_start"] + a)
            logits = call["logits"][0, slots].clone()
            logits[..., m] = float("-inf")
            want = torch.log_softmax(logits, -1).gather(-1, gen[now][:, None]).squeeze(-1)
            torch.testing.assert_close(got[now], want, atol=TOL, rtol=0)
            checked += 1
    assert checked > 3


@pytest.mark.parametrize("strategy,estimator", [("sdar", "block_masked"), ("threshold", "block_masked"),
                                                ("sdar", "trajectory")])
def test_grpo_runs_on_an_sdar_format_model(tmp_path, strategy, estimator):
    from dllm.testing import save_tiny_block_checkpoint

    save_tiny_block_checkpoint(tmp_path / "base", "sdar", seed=0, scale=2.0)
    args = GRPOConfig(run_dir=str(tmp_path / "run"), max_steps=2, progress=False, eval_every=0, save_every=0,
                      batch_size=64, model={"path": str(tmp_path / "base")},
                      data={"tasks": {"arith": 1.0}, "max_new_tokens": 8},
                      rollout={"group_size": 4, "prompts_per_step": 2, "strategy": strategy, "threshold": 0.5},
                      loss={"estimator": estimator}, filter={"enabled": False})
    result = GRPOTrainer(args=args).train()
    assert result.step == 2
    model = dllm.load_model(tmp_path / "run" / "final")
    assert type(model).__name__ == "SDARForCausalLM"
