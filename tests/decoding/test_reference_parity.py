"""Golden parity: our strategies vs. transcriptions of the reference decoding loops.

The functions below transcribe ML-GSAI/LLaDA ``generate.py`` and NVlabs/Fast-dLLM
``v1/llada/generate.py`` (``generate``, ``generate_with_prefix_cache``, ``generate_with_dual_cache``,
``get_transfer_index``, ``get_transfer_index_dynamic``) step for step, including their loop bounds
and quirks. They drive our model through an adapter exposing the interface the Fast-dLLM modified
LLaDA model has (``past_key_values``, ``use_cache``, ``replace_position``); the cache semantics of
that interface are checked against full forwards in tests/dllm/test_model_core.py.
"""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from dllm.testing import MASK, tiny_llada


# --------------------------------------------------------------------------- adapter
class FastDLLMInterface:
    def __init__(self, model):
        self.model = model

    def __call__(self, x, past_key_values=None, use_cache=False, replace_position=None):
        m = self.model
        if past_key_values is None:
            if not use_cache:
                return SimpleNamespace(logits=m(x).logits)
            cache = m.allocate_cache(torch.ones_like(x, dtype=torch.bool), prompt_length=0)
            logits = m(x, kv_cache=cache, cache_mode="fill").logits
            return SimpleNamespace(logits=logits, past_key_values=cache)
        cache = past_key_values
        if replace_position is None:  # keys = past (cache.length slots) + new
            return SimpleNamespace(logits=m(x, kv_cache=cache, cache_mode="prefix", cache_start=cache.length).logits)
        s = int(replace_position[0].nonzero().min())
        return SimpleNamespace(logits=m(x, kv_cache=cache, cache_mode="replace", cache_start=s).logits)


def truncate(cache, s):
    cache.length = s  # the reference slices every layer's K/V to [:, :, :s]
    return cache


# --------------------------------------------------------------------------- reference pieces
def add_gumbel_noise(logits, temperature):
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand_like(logits, dtype=torch.float64)
    return logits.exp() / (-torch.log(noise)) ** temperature


def get_num_transfer_tokens(mask_index, steps):
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    num = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num[i, : remainder[i]] += 1
    return num


def llada_generate(model, prompt, steps, gen_length, block_length, mask_id=MASK):
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    nfe = 0
    for nb in range(num_blocks):
        lo, hi = prompt.shape[1] + nb * block_length, prompt.shape[1] + (nb + 1) * block_length
        ntt = get_num_transfer_tokens(x[:, lo:hi] == mask_id, steps)
        for i in range(steps):
            mask_index = x == mask_id
            logits = model(x).logits
            nfe += 1
            x0 = torch.argmax(add_gumbel_noise(logits, 0.0), dim=-1)
            p = F.softmax(logits, dim=-1)
            x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            x0_p[:, hi:] = -float("inf")
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -float("inf"))
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, sel = torch.topk(confidence[j], k=int(ntt[j, i]))
                transfer[j, sel] = True
            x[transfer] = x0[transfer]
    return x, nfe


def get_transfer_index(logits, mask_index, x, num_transfer_tokens, threshold=None):
    x0 = torch.argmax(add_gumbel_noise(logits, 0.0), dim=-1)
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -float("inf"))
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    if threshold is not None:
        num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        _, sel = torch.topk(confidence[j], k=int(num_transfer_tokens[j]))
        transfer[j, sel] = True
        if threshold is not None:
            for k in range(1, int(num_transfer_tokens[j])):
                if confidence[j, sel[k]] < threshold:
                    transfer[j, sel[k]] = False
    return x0, transfer


def get_transfer_index_dynamic(logits, mask_index, x, factor=1.0):
    x0 = torch.argmax(logits, dim=-1)
    p = F.softmax(logits.to(torch.float64), dim=-1)
    x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, -float("inf"))
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    num_transfer_tokens = mask_index.sum(dim=1, keepdim=True)
    for j in range(confidence.shape[0]):
        n = int(num_transfer_tokens[j])
        threshs = [1 - factor / (k + 1) for k in range(1, n + 1)]
        threshs[0] = -1
        sorted_c = torch.sort(confidence[j][mask_index[j]], dim=-1, descending=True)[0]
        top_i = 0
        for top_i in range(len(threshs)):
            if sorted_c[top_i] < threshs[top_i]:
                break
        if top_i == 0 or top_i == len(threshs) - 1:
            top_i += 1
        _, sel = torch.topk(confidence[j], k=top_i)
        transfer[j, sel] = True
    return x0, transfer


def _select(logits, mask_index, x, ntt_i, threshold, factor):
    if factor is not None:
        return get_transfer_index_dynamic(logits, mask_index, x, factor)
    return get_transfer_index(logits, mask_index, x, ntt_i, threshold)


def fast_generate(model, prompt, steps, gen_length, block_length, threshold=None, factor=None, mask_id=MASK):
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    nfe = 0
    for nb in range(num_blocks):
        lo, hi = prompt.shape[1] + nb * block_length, prompt.shape[1] + (nb + 1) * block_length
        ntt = get_num_transfer_tokens(x[:, lo:hi] == mask_id, steps)
        i = 0
        while True:
            nfe += 1
            mask_index = x == mask_id
            logits = model(x).logits
            mask_index[:, hi:] = 0
            x0, tr = _select(logits, mask_index, x, ntt[:, i] if threshold is None and factor is None else None, threshold, factor)
            x[tr] = x0[tr]
            i += 1
            if (x[:, lo:hi] == mask_id).sum() == 0:
                break
    return x, nfe


def fast_generate_prefix(model, prompt, steps, gen_length, block_length, threshold=None, factor=None, mask_id=MASK):
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    nfe = 0
    for nb in range(num_blocks):
        lo, hi = prompt.shape[1] + nb * block_length, prompt.shape[1] + (nb + 1) * block_length
        ntt = get_num_transfer_tokens(x[:, lo:hi] == mask_id, steps)
        out = model(x, use_cache=True)
        pkv = out.past_key_values
        mask_index = x == mask_id
        mask_index[:, hi:] = 0
        x0, tr = _select(out.logits, mask_index, x, ntt[:, 0] if threshold is None and factor is None else None, threshold, factor)
        x[tr] = x0[tr]
        pkv = truncate(pkv, lo)
        nfe += 1
        i = 1
        while True:
            if (x[:, lo:hi] == mask_id).sum() == 0:
                break
            nfe += 1
            mask_index = x[:, lo:] == mask_id
            mask_index[:, block_length:] = 0
            logits = model(x[:, lo:], past_key_values=pkv, use_cache=True).logits
            x0, tr = _select(logits, mask_index, x[:, lo:], ntt[:, i] if threshold is None and factor is None else None, threshold, factor)
            x[:, lo:][tr] = x0[tr]
            i += 1
    return x, nfe


def fast_generate_dual(model, prompt, steps, gen_length, block_length, threshold=None, factor=None, mask_id=MASK):
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt.clone()
    num_blocks = gen_length // block_length
    steps = steps // num_blocks
    nfe = 0
    for nb in range(num_blocks):
        lo, hi = prompt.shape[1] + nb * block_length, prompt.shape[1] + (nb + 1) * block_length
        ntt = get_num_transfer_tokens(x[:, lo:hi] == mask_id, steps)
        out = model(x, use_cache=True)
        pkv = out.past_key_values
        mask_index = x == mask_id
        mask_index[:, hi:] = 0
        x0, tr = _select(out.logits, mask_index, x, ntt[:, 0] if threshold is None and factor is None else None, threshold, factor)
        x[tr] = x0[tr]
        nfe += 1
        replace_position = torch.zeros_like(x, dtype=torch.bool)
        replace_position[:, lo:hi] = True
        for i in range(1, steps):
            if (x[:, lo:hi] == mask_id).sum() == 0:
                break
            nfe += 1
            mask_index = x[:, lo:hi] == mask_id
            logits = model(x[:, lo:hi], past_key_values=pkv, use_cache=True, replace_position=replace_position).logits
            x0, tr = _select(logits, mask_index, x[:, lo:hi], ntt[:, i] if threshold is None and factor is None else None, threshold, factor)
            x[:, lo:hi][tr] = x0[tr]
    return x, nfe


# --------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def model():
    return tiny_llada(initializer_range=0.5)


def _prompt(b=1, length=7, seed=0):
    return torch.randint(0, 60, (b, length), generator=torch.Generator().manual_seed(seed))


CASES = [  # (gen_length, block_length, steps)
    (16, 4, 16),
    (16, 8, 8),
    (24, 8, 24),
    (16, 16, 4),
]


@pytest.mark.parametrize("gen_length,block_length,steps", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_vanilla_matches_llada_generate(model, gen_length, block_length, steps, seed):
    prompt = _prompt(2, seed=seed)
    ref, ref_nfe = llada_generate(model, prompt, steps, gen_length, block_length)
    out = model.generate(prompt, strategy="vanilla", steps=steps, max_new_tokens=gen_length, block_length=block_length,
                         stop_at_eos=False, suppress_mask_token=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, ref)
    assert out.num_forwards.tolist() == [ref_nfe] * 2


REFS = {"none": fast_generate, "prefix": fast_generate_prefix, "dual": fast_generate_dual}


@pytest.mark.parametrize("cache", ["none", "prefix", "dual"])
@pytest.mark.parametrize("strategy,kw", [("threshold", {"threshold": 0.9}), ("threshold", {"threshold": 0.5}),
                                         ("factor", {"factor": 1.0}), ("factor", {"factor": 2.0}), ("vanilla", {})])
@pytest.mark.parametrize("gen_length,block_length,steps", CASES[:3])
@pytest.mark.parametrize("seed", [0, 3])
def test_fast_dllm_strategies_match_reference(model, cache, strategy, kw, gen_length, block_length, steps, seed):
    prompt = _prompt(1, seed=seed)
    ref_kw = {"threshold": kw.get("threshold"), "factor": kw.get("factor")}
    # Upstream runs threshold/factor + dual cache with steps = gen_length (v1/llada/eval_gsm8k.sh)
    ref_steps = gen_length if (cache == "dual" and strategy != "vanilla") else steps
    ref, ref_nfe = REFS[cache](FastDLLMInterface(model), prompt, ref_steps, gen_length, block_length, **ref_kw)
    out = model.generate(prompt, strategy=strategy, cache=cache, steps=steps if strategy == "vanilla" else None,
                         max_new_tokens=gen_length, block_length=block_length, stop_at_eos=False,
                         suppress_mask_token=False, return_dict_in_generate=True, **kw)
    assert torch.equal(out.sequences, ref), (out.sequences, ref)
    assert int(out.num_forwards[0]) == ref_nfe


def test_dual_cache_step_bound_quirk(model):
    """Upstream caps the dual-cache loop at steps/block: with steps = G/B blocks stay partly masked."""
    prompt = _prompt(1, seed=5)
    ref, ref_nfe = fast_generate_dual(FastDLLMInterface(model), prompt, 2, 16, 8, threshold=0.99)
    out = model.generate(prompt, strategy="threshold", threshold=0.99, cache="dual", steps=2, max_new_tokens=16,
                         block_length=8, dual_cache_step_bound=True, stop_at_eos=False, suppress_mask_token=False,
                         return_dict_in_generate=True)
    assert int(out.num_forwards[0]) == ref_nfe == 2
    gen_ref = ref[0, 7:]
    assert int((gen_ref == MASK).sum()) > 0  # the reference leaves masks behind
    # our output fills never-committed slots with EOS; every committed token agrees
    committed = gen_ref != MASK
    assert torch.equal(out.sequences[0, 7:][committed], gen_ref[committed])
    sane = model.generate(prompt, strategy="threshold", threshold=0.99, cache="dual", max_new_tokens=16,
                          block_length=8, stop_at_eos=False, return_dict_in_generate=True)
    assert int(sane.num_forwards[0]) > 2 and bool((sane.step_map >= 1).all())
