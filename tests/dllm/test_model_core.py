"""Model core: formats, Auto-class round trips, masks, caches, padding, shift, LoRA, errors."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel

import dllm
from dllm.loading import CheckpointError, check_device, load_model
from dllm.modeling import block_ids, build_attention_mask
from dllm.special_ids import require_mask_token
from dllm.testing import EOS, MASK, PAD, tiny_dream, tiny_llada

TOL = 1e-5


def _ids(b=2, t=12, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 60, (b, t), generator=g)


@pytest.mark.parametrize("factory", [tiny_llada, tiny_dream])
@pytest.mark.parametrize("shard", [None, "20KB"])
def test_auto_roundtrip_bit_exact(tmp_path, factory, shard):
    model = factory()
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(tmp_path, **kwargs)
    if shard:
        assert (tmp_path / "model.safetensors.index.json").exists()
    loaded = AutoModel.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    ids = _ids()
    assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_tensor_names_match_reference_formats():
    llada = set(tiny_llada().state_dict())
    assert "model.transformer.wte.weight" in llada
    assert "model.transformer.ff_out.weight" in llada
    assert {f"model.transformer.blocks.0.{n}.weight" for n in
            ["attn_norm", "q_proj", "k_proj", "v_proj", "attn_out", "ff_norm", "ff_proj", "up_proj", "ff_out"]} <= llada
    assert len(llada) == 9 * 2 + 3
    dream = set(tiny_dream().state_dict())
    assert {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
            "model.layers.1.self_attn.q_proj.bias", "model.layers.1.self_attn.o_proj.weight",
            "model.layers.1.mlp.gate_proj.weight", "model.layers.1.post_attention_layernorm.weight"} <= dream
    assert "model.layers.0.self_attn.o_proj.bias" not in dream


def test_tied_head_has_no_head_tensor(tmp_path):
    model = tiny_llada(weight_tying=True)
    assert "model.transformer.ff_out.weight" not in model.state_dict()
    model.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path)
    ids = _ids()
    assert torch.equal(model(ids).logits, loaded(ids).logits)


def test_real_size_configs_on_meta_device():
    with torch.device("meta"):
        llada = dllm.LLaDAModelLM(dllm.LLaDAConfig())
        dream = dllm.DreamModel(dllm.DreamConfig())
    n_llada = sum(p.numel() for p in llada.parameters())
    n_dream = sum(p.numel() for p in dream.parameters())
    assert 7.95e9 < n_llada < 8.05e9, n_llada
    assert 7.55e9 < n_dream < 7.65e9, n_dream


def test_reference_llada_config_json_loads_without_remote_code(tmp_path):
    # A config.json shaped like GSAI-ML/LLaDA-8B-Instruct's (auto_map, OLMo leftovers), shrunk.
    cfg = {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0, "architectures": ["LLaDAModelLM"],
        "attention_dropout": 0.0, "attention_layer_norm": False, "attention_layer_norm_with_affine": True,
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModel": "modeling_llada.LLaDAModelLM",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama", "d_model": 32,
        "embedding_dropout": 0.0, "embedding_size": 64, "eos_token_id": EOS, "flash_attention": False,
        "include_bias": False, "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
        "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
        "layer_norm_with_affine": True, "mask_token_id": MASK, "max_sequence_length": 4096, "mlp_hidden_size": 64,
        "mlp_ratio": 4, "model_type": "llada", "multi_query_attention": None, "n_heads": 4, "n_kv_heads": 4,
        "n_layers": 2, "pad_token_id": EOS, "precision": "amp_bf16", "residual_dropout": 0.0, "rms_norm_eps": 1e-05,
        "rope": True, "rope_full_precision": True, "rope_theta": 500000.0, "scale_logits": False,
        "transformers_version": "4.46.3", "use_cache": False, "vocab_size": 64, "weight_tying": False,
    }
    src = tiny_llada(d_model=32, mlp_hidden_size=64, rope_theta=500000.0, pad_token_id=EOS)
    src.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    config = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(config, dllm.LLaDAConfig) and config.core_spec().intermediate_size == 64
    model = load_model(tmp_path)
    ids = _ids()
    assert torch.allclose(model(ids).logits, src(ids).logits, atol=TOL)


def test_unsupported_config_fields_fail_clearly():
    with pytest.raises(dllm.CheckpointConfigError, match="alibi"):
        dllm.LLaDAModelLM(dllm.LLaDAConfig(d_model=32, n_layers=1, n_heads=2, mlp_hidden_size=32,
                                           vocab_size=64, embedding_size=64, alibi=True))
    with pytest.raises(dllm.CheckpointConfigError, match="block_size"):
        dllm.LLaDAConfig(attention_policy="block_causal")
    with pytest.raises(dllm.CheckpointConfigError, match="valid"):
        dllm.LLaDAConfig(attention_policy="causal")


def test_rmsnorm_and_rope_numerics():
    from dllm.modeling.layers import RMSNorm, RotaryEmbedding, apply_rope

    norm = RMSNorm(8, 1e-5)
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    assert torch.equal(norm(x), ref)
    rope = RotaryEmbedding(4, 10000.0)
    cos, sin = rope(torch.tensor([[0, 1]]), torch.float32)
    q = torch.tensor([1.0, 0.0, 0.0, 0.0]).view(1, 1, 1, 4).expand(1, 1, 2, 4)
    out = apply_rope(q, cos, sin)
    # position 0 is the identity; position 1 rotates pair (x0, x2) by 1 radian
    assert torch.allclose(out[0, 0, 0], torch.tensor([1.0, 0, 0, 0]))
    assert torch.allclose(out[0, 0, 1], torch.tensor([torch.cos(torch.tensor(1.0)), 0, torch.sin(torch.tensor(1.0)), 0]))


def test_block_causal_mask_rule():
    slots = torch.arange(10)
    assert block_ids(slots, 4, 3).tolist() == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    m = build_attention_mask(query_slots=slots, key_end=10, key_valid=None, policy="block_causal",
                             block_size=3, prompt_length=4)[0, 0]
    for i in range(10):
        for j in range(10):
            allowed = j < 4 if i < 4 else (j < 4 or (j - 4) // 3 <= (i - 4) // 3)
            assert bool(m[i, j]) == allowed, (i, j)


@pytest.mark.parametrize("factory", [tiny_llada, tiny_dream])
def test_prefix_and_dual_cache_equal_full_forward(factory):
    model = factory()
    ids = _ids(2, 16)
    full = model(ids).logits
    valid = torch.ones_like(ids, dtype=torch.bool)
    cache = model.allocate_cache(valid, prompt_length=6)
    fill = model(ids, kv_cache=cache, cache_mode="fill").logits
    assert (fill - full).abs().max() <= TOL and cache.length == 16
    # prefix: slots [8, 16) attend to cached [0, 8) + themselves == full forward (nothing changed)
    pref = model(ids[:, 8:], kv_cache=cache, cache_mode="prefix", cache_start=8).logits
    if model.spec.logit_shift:
        assert (pref[:, 1:] - full[:, 9:]).abs().max() <= TOL
    else:
        assert (pref - full[:, 8:]).abs().max() <= TOL
    # dual: replace span [4, 8) in place, attend to the whole canvas
    rep = model(ids[:, 4:8], kv_cache=cache, cache_mode="replace", cache_start=4).logits
    ref = full[:, 5:8] if model.spec.logit_shift else full[:, 4:8]
    got = rep[:, 1:] if model.spec.logit_shift else rep
    assert (got - ref).abs().max() <= TOL
    assert cache.length == 16


def test_dual_cache_replace_sees_new_tokens_in_place(llada):
    ids = _ids(1, 12)
    cache = llada.allocate_cache(torch.ones_like(ids, dtype=torch.bool), prompt_length=4)
    llada(ids, kv_cache=cache, cache_mode="fill")
    new = ids.clone()
    new[:, 4:8] = MASK
    rep = llada(new[:, 4:8], kv_cache=cache, cache_mode="replace", cache_start=4).logits
    # a full forward of the modified canvas differs only through the stale suffix/prefix K/V
    k_before = cache.keys[0][:, :, 4:8].clone()
    llada(ids[:, 4:8], kv_cache=cache, cache_mode="replace", cache_start=4)
    assert not torch.equal(k_before, cache.keys[0][:, :, 4:8])  # written in place
    assert rep.shape == (1, 4, 64)


def test_block_causal_incremental_cache_equals_uncached():
    model = tiny_llada(attention_policy="block_causal", block_size=4)
    P = 5
    ids = _ids(2, P + 12)
    full = model(ids, prompt_length=P).logits
    cache = model.allocate_cache(torch.ones_like(ids, dtype=torch.bool), prompt_length=P)
    # prompt + block 1 in one forward, commit the prompt; then blocks appended one at a time
    out = model(ids[:, : P + 4], kv_cache=cache, cache_mode="prefix", cache_start=0).logits
    assert (out - full[:, : P + 4]).abs().max() <= TOL
    cache.length = P
    for start in (P, P + 4, P + 8):
        out = model(ids[:, start:], kv_cache=cache, cache_mode="prefix", cache_start=start).logits
        assert (out - full[:, start:]).abs().max() <= TOL, start
        cache.length = start + 4  # the block at `start` is final: its K/V from this forward are exact


def test_block_causal_view_override(llada):
    ids = _ids(1, 10)
    bi = llada(ids).logits
    bc = llada(ids, attention_policy="block_causal", block_size=4, prompt_length=10).logits  # one prompt block = bidirectional
    assert (bi - bc).abs().max() <= TOL


@pytest.mark.parametrize("factory", [tiny_llada, tiny_dream])
def test_left_padded_batch_equals_single_rows(factory):
    model = factory()
    a = _ids(1, 10, seed=3)
    b = _ids(1, 6, seed=4)
    batch = torch.full((2, 10), PAD)
    batch[0] = a[0]
    batch[1, 4:] = b[0]
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :4] = 0
    out = model(batch, attention_mask=mask).logits
    assert (out[0] - model(a).logits[0]).abs().max() <= TOL
    start = 5 if model.spec.logit_shift else 4  # Dream's first real slot borrows a pad's hidden state
    ref = model(b).logits[0]
    assert (out[1, start:] - ref[start - 4:]).abs().max() <= TOL
    # and with a cache: padding lives in the cache's key_valid
    cache = model.allocate_cache(mask.bool(), prompt_length=10)
    cached = model(batch, kv_cache=cache, cache_mode="fill").logits
    assert (cached - out).abs().max() <= TOL


def test_padding_changes_results_when_ignored(llada):
    # Guard against the LLaDA reference's bug: without the pad mask the padded row differs.
    b = _ids(1, 6, seed=4)
    batch = torch.cat([torch.full((1, 4), PAD), b], dim=1)
    ignored = llada(batch, position_ids=torch.cat([torch.zeros(4), torch.arange(6)]).long()[None]).logits
    assert (ignored[0, 4:] - llada(b).logits[0]).abs().max() > 1e-3


def test_dream_logit_shift(dream):
    ids = _ids(1, 8)
    out = dream(ids, output_hidden_states=True)
    unshifted = dream.lm_head(dream.model.norm(_hidden(dream, ids)))
    assert torch.allclose(out.logits[:, 1:], unshifted[:, :-1], atol=TOL)
    assert torch.allclose(out.logits[:, 0], unshifted[:, 0], atol=TOL)


def _hidden(model, ids):
    from dllm.modeling.layers import make_context

    h = model.model.embed_tokens(ids)
    ctx = make_context(spec=model.spec, rope=model.rotary, dtype=h.dtype, seq_len=ids.shape[1], device=h.device,
                       attention_mask=None, position_ids=None, prompt_length=None, cache=None, cache_start=0,
                       cache_mode=None, attention_policy=None)
    for layer in model.model.layers:
        h = layer(h, ctx)
    return h


def test_cache_row_selection_and_repeat(llada):
    ids = _ids(3, 8)
    cache = llada.allocate_cache(torch.ones_like(ids, dtype=torch.bool), prompt_length=4)
    llada(ids, kv_cache=cache, cache_mode="fill")
    sub = cache.select_rows([2, 0])
    assert torch.equal(sub.keys[1][0], cache.keys[1][2]) and torch.equal(sub.values[0][1], cache.values[0][0])
    rep = cache.repeat_rows(2)
    assert rep.batch_size == 6 and torch.equal(rep.keys[0][3], cache.keys[0][1])
    rep.keys[0][3].zero_()
    assert cache.keys[0][1].abs().sum() > 0  # a fork owns its buffers


def test_lora_adapter_load_and_merge(tmp_path):
    from peft import LoraConfig, get_peft_model

    base = tiny_llada()
    base.save_pretrained(tmp_path / "base")
    peft_model = get_peft_model(tiny_llada(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "attn_out"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    ids = _ids()
    expected = peft_model(ids).logits
    merged = load_model(tmp_path / "base", adapter=tmp_path / "adapter")
    assert isinstance(merged, dllm.LLaDAModelLM)
    assert (merged(ids).logits - expected).abs().max() <= 1e-4
    assert (merged(ids).logits - base(ids).logits).abs().max() > 1e-3
    unmerged = load_model(tmp_path / "base", adapter=tmp_path / "adapter", merge_adapter=False)
    assert (unmerged(ids).logits - expected).abs().max() <= 1e-4
    # a D2F-style adapter on an unmodified base, run block-causal
    bc = load_model(tmp_path / "base", adapter=tmp_path / "adapter", attention_policy="block_causal", block_size=4)
    assert bc.is_block_causal and bc.config.block_size == 4


def test_load_dtypes(tmp_path):
    tiny_dream().save_pretrained(tmp_path)
    m = load_model(tmp_path, dtype="bf16")
    assert m.model.embed_tokens.weight.dtype == torch.bfloat16
    assert m(_ids()).logits.dtype == torch.bfloat16


def test_broken_checkpoint_dirs_fail_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="neither a bundled name"):
        load_model(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="no config.json"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match=r"model_type='bert'; dllm loads: LLaDAModelLM \(llada\), DreamModel"):
        load_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llada"}))
    with pytest.raises(CheckpointError, match="no weights"):
        load_model(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="safetensors"):
        load_model(tmp_path)
    sharded = tmp_path / "sharded"
    tiny_llada().save_pretrained(sharded, max_shard_size="20KB")
    next(sharded.glob("model-0000*-of-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="shards listed in the index are missing"):
        load_model(sharded)


def test_unusable_devices_fail_before_loading(tmp_path):
    tiny_llada().save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="'tpu' is not a torch device"):
        load_model(tmp_path, device="tpu")
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(CheckpointError, match="cuda:7" if n_cuda else "no CUDA"):
        load_model(tmp_path, device="cuda:7" if n_cuda else "cuda")
    assert check_device("cpu") == torch.device("cpu")
    assert next(load_model(tmp_path, device="cpu").parameters()).device.type == "cpu"


def test_missing_mask_token_error_names_the_fix():
    model = tiny_llada(mask_token_id=None)
    with pytest.raises(CheckpointError, match="mask_token_id") as err:
        require_mask_token(model)
    # every family's published id, the block-diffusion ones included (SDAR's config says 151669; Fast-dLLM v2's
    # decoders hard-code 151665)
    for family, mask in (("LLaDA", 126336), ("Dream", 151666), ("SDAR", 151669), ("Fast-dLLM v2", 151665),
                         ("LLaDA2", 156895), ("LLaDA-MoE", 156895)):
        assert f"{family}: {mask}" in str(err.value)
    from dllm.modeling import FAMILIES, fast_dllm_v2, sdar

    assert (sdar.MASK_ID, fast_dllm_v2.MASK_ID) == (151669, 151665)
    assert all(f"{f.name}: {f.mask_token_id}" in str(err.value) for f in FAMILIES)  # built from the family table
    assert require_mask_token(tiny_llada()) == MASK


def test_a_config_without_its_own_mask_id_fails_closed(tmp_path):
    """A small checkpoint whose config.json lacks mask_token_id gets LLaDA's published id (126336), which its
    vocabulary does not have: loading succeeds, but generate and the server refuse it by name, never 500s."""
    import json

    from dllm.serving.settings import ServerSettings
    from dllm.serving.state import load_bundle

    model = tiny_llada()
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["mask_token_id"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    bare = load_model(tmp_path)
    assert bare.config.mask_token_id == 126336
    with pytest.raises(CheckpointError, match=r"mask_token_id=126336 is not in this model's vocabulary \(64 rows\)"):
        bare.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=8, block_length=8)
    with pytest.raises(CheckpointError, match="mask_token_id"):
        bare.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=8, block_length=8, mask_token_id=999)
    from dllm.testing import tiny_tokenizer

    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="mask_token_id=126336"):
        load_bundle(ServerSettings(model=str(tmp_path)))


def test_device_map_through_accelerate(tmp_path):
    model = tiny_dream()
    model.save_pretrained(tmp_path)
    for device_map in ("cpu", "auto", {"": "cpu"}):
        loaded = load_model(tmp_path, device_map=device_map)
        ids = _ids()
        assert torch.equal(loaded(ids).logits, model(ids).logits)
        assert {p.device.type for p in loaded.parameters()} == {"cpu"}


def test_the_family_is_found_by_architecture_then_model_type():
    from dllm.errors import CheckpointError
    from dllm.modeling import family_of

    assert family_of({"architectures": ["DreamModel"], "model_type": "Dream"}).name == "Dream"
    assert family_of({"model_type": "llada"}).architecture == "LLaDAModelLM"  # no architectures: the model type
    # a known model_type with an unknown architecture is not loaded as the dense family that shares it
    with pytest.raises(CheckpointError, match="LLaDAMoEModelLM"):  # the message lists what dllm loads
        family_of({"architectures": ["LLaDAUnknownModelLM"], "model_type": "llada"})
    assert family_of({"architectures": ["LLaDAMoEModelLM"], "model_type": "llada"}).name == "LLaDA-MoE"
