"""Attention backends: FlexAttention (eager on CPU) against the SDPA reference, in every decoding shape."""

import pytest
import torch
from torch.nn.attention.flex_attention import _convert_mask_to_block_mask, create_mask

from dllm.modeling import attention_backends as ab
from dllm.modeling.attention_backends import (
    MaskSpec,
    block_tables,
    flex_block_mask,
    flex_mask_mod,
)
from dllm.modeling.attention_masks import build_attention_mask
from dllm.testing import PAD, tiny_dream, tiny_llada
from dllm.text import left_pad

B = 4  # generation block size of the block-causal tiny models


@pytest.fixture(autouse=True)
def _inference(monkeypatch):
    monkeypatch.delenv(ab.ENV_VAR, raising=False)
    with torch.no_grad():  # FlexAttention has no CPU backward; decoding never needs one
        yield


@pytest.fixture(scope="module")
def bi():
    return tiny_llada(initializer_range=0.5)


@pytest.fixture(scope="module")
def bc():
    return tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=B)


@pytest.fixture(scope="module")
def dream_bc():  # GQA (4 query heads, 2 kv heads) and the logit shift
    return tiny_dream(initializer_range=0.5, attention_policy="block_causal", block_size=B)


def _ids(b, t, seed=0):
    return torch.randint(0, 60, (b, t), generator=torch.Generator().manual_seed(seed))


def _padded(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids, mask = left_pad([torch.randint(0, 60, (n,), generator=g).tolist() for n in lengths], PAD)
    return ids, mask.bool()


def _both(fn):
    """fn(backend) under sdpa and flex; returns the two results."""
    return fn("sdpa"), fn("flex")


def _close(a, b, tol=1e-5):
    """max |a - b| <= tol * max |a| (scale-relative: random tiny models have logits of size ~10)."""
    if isinstance(a, (tuple, list)):
        for x, y in zip(a, b, strict=True):
            _close(x, y, tol)
        return
    assert a.shape == b.shape and a.dtype == b.dtype
    err = (a.float() - b.float()).abs().max().item()
    scale = a.float().abs().max().item()
    print(f"err {err:.3g} scale {scale:.3g} rel {err / max(scale, 1e-30):.3g}")
    assert err <= tol * max(scale, 1.0), (err, scale)


# --- full forwards ----------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["llada", "dream"])
def test_bidirectional_left_padding(bi, which):
    m = bi if which == "llada" else tiny_dream(initializer_range=0.5)
    ids, mask = _padded([9, 5, 12], seed=1)
    a, b = _both(lambda be: m(ids, attention_mask=mask, attn_backend=be).logits)
    _close(a, b)
    ids = _ids(2, 10)  # no padding at all: flex runs without a block mask
    _close(*_both(lambda be: m(ids, attn_backend=be).logits))


@pytest.mark.parametrize("per_row", [False, True])
def test_block_causal_prompt_lengths(bc, dream_bc, per_row):
    ids, mask = _padded([11, 7, 14], seed=2)
    p = torch.tensor([6, 9, 3]) if per_row else 6
    for m in (bc, dream_bc):
        a, b = _both(lambda be, m=m: m(ids, attention_mask=mask, prompt_length=p, attn_backend=be).logits)
        _close(a, b)


def test_long_canvas_spans_several_flex_tiles(bc):
    # > 128 slots on both axes: empty, partial and full BlockMask tiles all occur.
    ids, mask = _padded([300, 170, 260], seed=3)
    p = torch.tensor([135, 140, 129])
    a, b = _both(lambda be: bc(ids, attention_mask=mask, prompt_length=p, attn_backend=be).logits)
    _close(a, b)
    spec = MaskSpec(policy="block_causal", block_size=B, prompt_length=p, start=0, q_len=300, key_end=300,
                    key_valid=mask, device=torch.device("cpu"))
    partial, full = block_tables(spec, 3)
    assert partial.sum() > 0 and full.sum() > 0 and (partial + full == 0).sum() > 0


# --- cached forwards ---------------------------------------------------------------------------
def _prefix_step(m, be, ids, kv, P, q):
    cache = m.allocate_cache(kv, prompt_length=P)
    fill = m(ids[:, :P], kv_cache=cache, cache_mode="fill", attn_backend=be).logits
    step = m(ids[:, P:P + q], kv_cache=cache, cache_mode="prefix", cache_start=P, attn_backend=be).logits
    return fill, step, cache.keys[1][:, :, :P + q]


@pytest.mark.parametrize("model", ["bi", "bc", "dream_bc"])
def test_prefix_cache(model, request):
    m = request.getfixturevalue(model)
    ids, kv = _padded([8, 5], seed=4)
    canvas = torch.cat([ids, _ids(2, 12, seed=5)], dim=1)
    kv = torch.cat([kv, torch.ones(2, 12, dtype=torch.bool)], dim=1)
    _close(*_both(lambda be: _prefix_step(m, be, canvas, kv, 8, 12)))


def _dual_step(m, be, canvas, kv, P, s, new):
    cache = m.allocate_cache(kv, prompt_length=P)
    fill = m(canvas, kv_cache=cache, cache_mode="fill", attn_backend=be).logits
    step = m(new, kv_cache=cache, cache_mode="replace", cache_start=s, attn_backend=be).logits
    return fill, step, cache.values[0]


@pytest.mark.parametrize("model", ["bi", "bc", "dream_bc"])
def test_dual_cache_replace(model, request):
    m = request.getfixturevalue(model)
    ids, kv = _padded([7, 4, 6], seed=6)
    canvas = torch.cat([ids, _ids(3, 16, seed=7)], dim=1)
    kv = torch.cat([kv, torch.ones(3, 16, dtype=torch.bool)], dim=1)
    new = _ids(3, B, seed=8)
    _close(*_both(lambda be: _dual_step(m, be, canvas, kv, 7, 7 + B, new)))


def _exact_append(m, be, canvas, kv, P):
    """D2F's exact block cache: each finished block is appended with a prefix forward, then committed."""
    cache = m.allocate_cache(kv, prompt_length=P)
    outs = [m(canvas[:, :P], kv_cache=cache, cache_mode="fill", attn_backend=be).logits]
    for s in range(P, canvas.shape[1] - 2 * B + 1, B):
        # two blocks in flight (the pipeline's shape); only the first is committed
        outs.append(m(canvas[:, s:s + 2 * B], kv_cache=cache, cache_mode="prefix", cache_start=s,
                      attn_backend=be).logits)
        cache.length = s + B
    full = m(canvas, attention_mask=kv, prompt_length=P, attn_backend=be).logits
    return outs, full


@pytest.mark.parametrize("model", ["bc", "dream_bc"])
def test_exact_block_causal_cache_append(model, request):
    m = request.getfixturevalue(model)
    ids, kv = _padded([6, 9], seed=9)
    P = ids.shape[1]
    canvas = torch.cat([ids, _ids(2, 4 * B, seed=10)], dim=1)
    kv = torch.cat([kv, torch.ones(2, 4 * B, dtype=torch.bool)], dim=1)
    (sd_steps, sd_full), (fx_steps, fx_full) = _both(lambda be: _exact_append(m, be, canvas, kv, P))
    _close(sd_steps, fx_steps)
    _close(sd_full, fx_full)
    if not m.spec.logit_shift:  # the cache is exact under the block-causal mask, for both backends
        for k, s in enumerate(range(P, canvas.shape[1] - 2 * B + 1, B)):
            _close(fx_steps[k + 1][:, :B], fx_full[:, s:s + B], 1e-5)


def _lopa_round(m, be, canvas, kv, P, mode):
    cache = m.allocate_cache(kv, prompt_length=P)
    m(canvas[:, :P], kv_cache=cache, cache_mode="fill", attn_backend=be)
    branches = cache.repeat_rows(3)  # 2 rows x 3 branches sharing the cached prefix
    x = _ids(6, 2 * B, seed=11)
    step = m(x, kv_cache=branches, cache_mode=mode, cache_start=P, attn_backend=be).logits
    return step, branches.keys[0]


@pytest.mark.parametrize("mode", ["prefix", "replace"])
def test_lopa_branches_share_a_prefix(bc, mode):
    ids, kv = _padded([5, 8], seed=12)
    P = ids.shape[1]
    canvas = torch.cat([ids, _ids(2, 3 * B, seed=13)], dim=1)
    kv = torch.cat([kv, torch.ones(2, 3 * B, dtype=torch.bool)], dim=1)
    _close(*_both(lambda be: _lopa_round(bc, be, canvas, kv, P, mode)))


def test_bf16():
    # bf16 rounding dominates: flex and SDPA must be equally far from the fp32 reference.
    m = tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=B)
    ids, mask = _padded([10, 6], seed=14)
    ref = m(ids, attention_mask=mask, prompt_length=7).logits
    m = m.to(torch.bfloat16)
    a, b = _both(lambda be: m(ids, attention_mask=mask, prompt_length=7, attn_backend=be).logits)
    assert a.dtype == b.dtype == torch.bfloat16 and b.isfinite().all()
    err_sdpa = (a.float() - ref).abs().mean().item()
    err_flex = (b.float() - ref).abs().mean().item()
    print(f"bf16 mean abs error vs fp32: sdpa {err_sdpa:.3g} flex {err_flex:.3g}")
    assert err_flex <= 1.5 * err_sdpa + 1e-3
    assert (a.argmax(-1) == b.argmax(-1)).float().mean() > 0.9


# --- generate ---------------------------------------------------------------------------------
def _generate(m, be, ids, mask, **kw):
    m.set_attention_backend(be)
    try:
        return m.generate(ids, attention_mask=mask, max_new_tokens=16, block_length=B, stop_at_eos=False,
                          return_dict_in_generate=True, **kw)
    finally:
        m.set_attention_backend(None)


@pytest.mark.parametrize("model,kw", [
    ("llada", {"strategy": "threshold", "threshold": 0.7, "cache": "dual"}),
    ("llada", {"strategy": "threshold", "threshold": 0.7}),
    ("bc", {"strategy": "d2f", "skip_threshold": 0.6, "block_add_threshold": 0.25, "decoded_token_threshold": 0.5}),
    ("bc", {"strategy": "lopa", "lopa_branches": 2}),
])
def test_generate_token_identical(bc, model, kw):
    m = tiny_llada() if model == "llada" else bc
    ids, mask = _padded([7, 4], seed=15)
    a, b = _both(lambda be: _generate(m, be, ids, mask, **kw))
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.num_forwards, b.num_forwards)
    assert torch.equal(a.step_map, b.step_map)


# --- masks ------------------------------------------------------------------------------------
def test_block_tables_match_create_block_mask():
    g = torch.Generator().manual_seed(0)

    def r(lo, hi):
        return int(torch.randint(lo, hi, (1,), generator=g))

    for trial in range(24):
        batch, q, start = 3, r(1, 300), r(0, 200)
        kv_end = start + q + r(0, 100)
        valid = None
        if trial % 3:
            valid = torch.ones(batch, kv_end + 5, dtype=torch.bool)
            for row in range(batch):
                valid[row, : r(0, 150)] = False
        p = torch.randint(0, kv_end, (batch,), generator=g) if trial % 4 == 0 else r(0, kv_end)
        spec = MaskSpec(policy="block_causal" if trial % 2 == 0 else "bidirectional", block_size=r(1, 40),
                        prompt_length=p, start=start, q_len=q, key_end=kv_end, key_valid=valid,
                        device=torch.device("cpu"))
        mod = flex_mask_mod(spec, batch)
        if mod is None:
            assert spec.policy == "bidirectional" and valid is None and spec.dense() is None
            continue
        dense = create_mask(mod, batch, 1, q, kv_end, "cpu")  # the mask_mod, element by element
        ref = spec.dense()
        assert torch.equal(dense, ref.expand(batch, 1, q, kv_end))  # same rule as build_attention_mask
        partial, full = block_tables(spec, batch)
        want_partial, want_full = _convert_mask_to_block_mask(dense, 128, 128, separate_full_blocks=True)
        assert torch.equal(partial, want_partial) and torch.equal(full, want_full)
        assert torch.equal(flex_block_mask(spec, batch).to_dense(), ab.create_block_mask(
            mod, batch, None, q, kv_end, device="cpu").to_dense())


def test_compiled_flex_is_reused_across_decoding_steps():
    # What changes between steps (query offset, key range, prompt lengths, padding) reaches the
    # mask_mod as captured tensors, so dynamo compiles a handful of graphs, not one per step.
    # backend="eager" checks the guards without generating kernels (the CUDA kernels: gpu tests).
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    fn = torch.compile(ab.flex_attention, backend="eager")

    def step(batch, q, start, key_end, p, policy="block_causal"):
        spec = MaskSpec(policy=policy, block_size=4, prompt_length=p, start=start, q_len=q, key_end=key_end,
                        key_valid=torch.ones(batch, 200, dtype=torch.bool), device=torch.device("cpu"))
        x, k = torch.randn(batch, 4, q, 16), torch.randn(batch, 2, key_end, 16)
        out = fn(x, k, k, block_mask=spec.block_mask(batch), enable_gqa=True)
        ref = torch.nn.functional.scaled_dot_product_attention(x, k, k, attn_mask=spec.dense(), enable_gqa=True)
        _close(ref, out)

    for start in range(20, 60, 4):  # d2f-like: a block at a time, then two in flight
        step(2, 8, start, start + 8, 20)
    for start in range(20, 60, 4):
        step(2, 16, start, start + 16, 20)
    for start in range(20, 60, 4):  # dual cache: whole canvas as keys, per-row prompt lengths
        step(3, 4, start, 90, torch.tensor([20, 21, 22]))
    graphs = counters["stats"]["unique_graphs"]
    assert 2 <= graphs <= 5, graphs
    torch._dynamo.reset()


def test_flex_path_builds_no_dense_mask(bc, bi, monkeypatch):
    def boom(**_):
        raise AssertionError("the flex path built a dense [q, key_end] mask")

    monkeypatch.setattr(ab, "build_attention_mask", boom)
    ids, kv = _padded([6, 9], seed=16)
    P = ids.shape[1]
    canvas = torch.cat([ids, _ids(2, 2 * B, seed=17)], dim=1)
    kv = torch.cat([kv, torch.ones(2, 2 * B, dtype=torch.bool)], dim=1)
    for m in (bc, bi):
        m.set_attention_backend("flex")
        try:
            m(canvas, attention_mask=kv, prompt_length=P)
            m(canvas, attention_mask=kv, prompt_length=torch.tensor([P, P - 1]))
            _prefix_step(m, None, canvas, kv, P, B)
            _dual_step(m, None, canvas, kv, P, P, canvas[:, P:P + B])
            # the bidirectional model's threshold decoding with the dual cache; the block-causal one's d2f
            # caches finished blocks exactly by itself (it reads no cache option)
            m.generate(ids, attention_mask=kv[:, :P], max_new_tokens=8, block_length=B,
                       **({} if m is bc else {"cache": "dual"}))
        finally:
            m.set_attention_backend(None)
    with pytest.raises(AssertionError, match="dense"):
        bc(canvas, attention_mask=kv, prompt_length=P, attn_backend="sdpa")


def test_sdpa_builds_the_dense_mask_once_per_forward(bc, monkeypatch):
    calls = []
    real = ab.build_attention_mask

    def counting(**kw):
        calls.append(kw["key_end"])
        return real(**kw)

    monkeypatch.setattr(ab, "build_attention_mask", counting)
    ids, kv = _padded([6, 9], seed=18)
    bc(ids, attention_mask=kv, prompt_length=4)
    assert bc.spec.num_layers == 2 and calls == [ids.shape[1]]


# --- selection --------------------------------------------------------------------------------
def test_backend_selection(bc, monkeypatch):
    assert bc.attention_backend == "auto"
    with pytest.raises(ValueError, match="valid: auto, sdpa, flex, eager"):
        bc.set_attention_backend("xformers")
    assert ab.resolve_backend("auto", torch.device("cpu")) == "sdpa"
    with torch.enable_grad():
        assert ab.resolve_backend("auto", torch.device("cpu")) == "sdpa"  # float32 training: on par
        assert ab.resolve_backend("auto", torch.device("cpu"), torch.bfloat16) == "eager"
        with torch.autocast("cpu", dtype=torch.bfloat16):  # CPU training under bf16 autocast
            assert ab.resolve_backend("auto", torch.device("cpu"), torch.float32) == "eager"
            assert ab.resolve_backend("sdpa", torch.device("cpu"), torch.float32) == "sdpa"
    assert ab.resolve_backend("auto", torch.device("cpu"), torch.bfloat16) == "sdpa"  # decoding keeps SDPA
    assert ab.resolve_backend("flex", torch.device("cpu")) == "flex"
    assert ab.resolve_backend("auto", torch.device("cuda")) == "flex"
    with torch.enable_grad():
        assert ab.resolve_backend("auto", torch.device("cuda")) == "sdpa"  # training forwards keep SDPA
    assert ab.requested_backend("sdpa", None) == "sdpa"
    monkeypatch.setenv(ab.ENV_VAR, "flex")
    assert ab.requested_backend("sdpa", None) == "flex"  # the environment overrides the model
    assert ab.requested_backend("sdpa", "sdpa") == "sdpa"  # a forward's argument overrides both
    monkeypatch.setenv(ab.ENV_VAR, "bogus")
    with pytest.raises(ValueError, match="DLLM_ATTN_BACKEND|attn_backend"):
        bc(_ids(1, 6), prompt_length=3)


def test_cpu_default_is_the_sdpa_path(bc, monkeypatch):
    ids, kv = _padded([6, 9], seed=19)
    auto = bc(ids, attention_mask=kv, prompt_length=5).logits
    assert torch.equal(auto, bc(ids, attention_mask=kv, prompt_length=5, attn_backend="sdpa").logits)
    bc.config.attn_backend = "flex"  # a config attribute (e.g. from_pretrained(..., attn_backend="flex"))
    try:
        assert bc.attention_backend == "flex"
        flex = bc(ids, attention_mask=kv, prompt_length=5).logits
    finally:
        del bc.config.attn_backend
    _close(auto, flex)


# --- CUDA (compiled FlexAttention) ------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _sees_a_valid_key(policy, key_valid, prompt_length):
    """[batch, slots] True where a query's mask row has at least one valid key."""
    slots = torch.arange(key_valid.shape[1], device=key_valid.device)
    mask = build_attention_mask(query_slots=slots, key_end=key_valid.shape[1], key_valid=key_valid, policy=policy,
                                block_size=B if policy == "block_causal" else None, prompt_length=prompt_length)
    return mask.expand(key_valid.shape[0], 1, -1, -1).any(-1)[:, 0]


def test_sees_a_valid_key_finds_the_fully_masked_padding_queries():
    ids, kv = _padded([40, 200, 130], seed=20)
    seen = _sees_a_valid_key("block_causal", kv, prompt_length=140)
    # row 0: pads at slots 0-159; slots 0-159 see only pads, its real tokens see themselves
    assert not seen[0, :160].any() and seen[0, 160:].all()
    assert seen[1:].all()
    assert _sees_a_valid_key("bidirectional", kv, prompt_length=140).all()


def test_flex_on_cuda_skips_head_sizes_its_kernel_rejects():
    assert not ab.flex_kernel_supports("cuda", 12)
    assert ab.flex_kernel_supports("cuda", 16) and ab.flex_kernel_supports("cuda", 128)
    assert ab.flex_kernel_supports("cpu", 12)  # eager flex has no such limit


def _gpu_model(policy="bidirectional", dtype=torch.bfloat16):
    extra = {"attention_policy": "block_causal", "block_size": B} if policy == "block_causal" else {}
    m = tiny_llada(initializer_range=0.5, d_model=256, n_heads=4, n_kv_heads=2, mlp_hidden_size=512, **extra)
    return m.to("cuda", dtype)


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("policy", ["bidirectional", "block_causal"])
def test_gpu_compiled_flex_matches_sdpa(policy):
    ab._BROKEN.clear()  # earlier tests' small-head models may have tripped the fallback
    m = _gpu_model(policy)
    ids, kv = _padded([40, 200, 130], seed=20)
    ids, kv = ids.cuda(), kv.cuda()
    with torch.no_grad():
        a, b = _both(lambda be: m(ids, attention_mask=kv, prompt_length=140, attn_backend=be).logits.float())
        assert ab.resolve_backend("auto", ids.device) == "flex"
    # Row 0 (160 pads, prompt_length 140) has block-causal queries that see no valid key at all;
    # what attention returns there is kernel-defined (flex: zeros), so only queries that see a key count.
    seen = _sees_a_valid_key(policy, kv, prompt_length=140)
    assert seen.any() and (policy == "bidirectional") == bool(seen.all())
    _close(a[seen], b[seen], 2e-2)
    assert not ab._BROKEN


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("kw", [{"strategy": "threshold", "cache": "dual"}, {"strategy": "d2f"},
                                {"strategy": "lopa", "lopa_branches": 2}])
def test_gpu_generate_flex_equals_sdpa(kw):
    ab._BROKEN.clear()
    m = _gpu_model("block_causal" if kw["strategy"] != "threshold" else "bidirectional", torch.float32)
    ids, kv = _padded([12, 30], seed=21)
    a, b = _both(lambda be: _generate(m, be, ids.cuda(), kv.cuda(), **kw))
    assert torch.equal(a.sequences, b.sequences)
    assert not ab._BROKEN


# --- eager (explicit matmul + float32 softmax; the CPU training default) ---------------------------
@pytest.mark.parametrize("which", ["bi", "bc", "dream_bc"])
def test_eager_matches_sdpa(which, request):
    m = request.getfixturevalue(which)
    ids, kv = _padded([6, 9], seed=21)
    ref = m(ids, attention_mask=kv, prompt_length=5, attn_backend="sdpa").logits
    _close(ref, m(ids, attention_mask=kv, prompt_length=5, attn_backend="eager").logits)


@pytest.mark.parametrize("which", ["bc", "dream_bc"])
def test_eager_gradients_match_sdpa(which, request):
    m = request.getfixturevalue(which)
    ids, kv = _padded([7, 10], seed=22)
    grads = {}
    with torch.enable_grad():
        for backend in ("sdpa", "eager"):
            m.zero_grad(set_to_none=True)
            logits = m(ids, attention_mask=kv, prompt_length=5, attn_backend=backend).logits
            logits.float().logsumexp(-1).sum().backward()
            grads[backend] = [p.grad.clone() for p in m.parameters() if p.grad is not None]
        m.zero_grad(set_to_none=True)
    assert len(grads["sdpa"]) == len(grads["eager"]) > 0
    _close(grads["sdpa"], grads["eager"], tol=1e-4)


def test_cpu_training_forward_takes_eager(bc, monkeypatch):
    seen = []
    real = ab.eager_attention
    monkeypatch.setattr(ab, "eager_attention", lambda *a, **k: seen.append(1) or real(*a, **k))
    ids, kv = _padded([6, 9], seed=23)
    bc(ids, attention_mask=kv, prompt_length=5)  # no grad (the fixture): sdpa
    assert seen == []
    with torch.enable_grad():
        bc(ids, attention_mask=kv, prompt_length=5).logits.sum().backward()  # float32: sdpa
        assert seen == []
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = bc(ids, attention_mask=kv, prompt_length=5).logits.float().sum()
        loss.backward()
    bc.zero_grad(set_to_none=True)
    assert len(seen) == bc.spec.num_layers


def test_eager_bf16_close_to_sdpa():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 12, 16, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.ones(2, 1, 12, 12, dtype=torch.bool)
    mask[0, :, :, :3] = False
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    _close(ref, ab.eager_attention(q, k, v, mask, gqa=False), tol=2e-2)
