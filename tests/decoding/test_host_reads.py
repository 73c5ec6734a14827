"""Host synchronisations of the decoding loops, counted on CPU (``dllm.testing.HostReads``): a GPU waits for
each one, so the loops keep them to a few per step, independent of the batch size and the number of blocks."""

import dataclasses
from pathlib import Path

import pytest
import torch

from dllm.decoding.config import DiffusionGenerationConfig
from dllm.testing import HostReads, forced_commits, tiny_block_model, tiny_llada

ROOT = str(Path(__file__).resolve().parents[2])


def _run(strategy: str, batch: int, block_causal: bool | None = None, **kw) -> tuple[int, HostReads]:
    model = tiny_llada(seed=1)
    if block_causal or (block_causal is None and strategy == "d2f"):
        model.spec = dataclasses.replace(model.spec, attention_policy="block_causal", block_size=4)  # a D2F view
    gen = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, 60, (batch, 9), generator=gen)
    mask = torch.ones_like(ids)
    for r in range(batch):  # left padding on every other row
        mask[r, : (r % 2) * 3] = 0
    cfg = DiffusionGenerationConfig(strategy=strategy, max_new_tokens=32, block_length=4, stop_at_eos=False,
                                    return_dict_in_generate=True, **kw)
    reads = HostReads(root=ROOT)
    with torch.no_grad(), forced_commits(model, 2, model.config.mask_token_id, token=7), reads:
        out = model.generate(ids, attention_mask=mask, generation_config=cfg)
    if strategy != "lopa":
        assert out.tpf.tolist() == [2.0] * batch  # two commits per forward: 16 forwards per row
    return int(out.num_forwards.max()), reads


@pytest.mark.parametrize("strategy,kw,per_forward", [
    ("threshold", {"cache": "dual", "threshold": 0.9}, 4),
    ("d2f", {}, 3.5),
    ("lopa", {"lopa_branches": 3, "block_causal": True}, 6),
    ("lopa", {"lopa_branches": 3, "threshold": 0.9, "block_causal": False}, 7),
], ids=["threshold-dual", "d2f", "lopa-d2f", "lopa-threshold"])
def test_a_few_host_reads_per_forward_whatever_the_batch(strategy, kw, per_forward):
    forwards, one = _run(strategy, 1, **kw)
    four_forwards, four = _run(strategy, 4, **kw)
    assert forwards == four_forwards and forwards >= 12
    # Per forward: a host copy of the canvas, the finished-rows test, the loop's exit test (threshold) or
    # LoPA's scores and lookahead slots, plus a few per call. At batch 1 and 4: threshold + dual 3.1 and 3.5,
    # d2f 2.8 and 3.1 (before its plans carried their host copy from step to step: 4.8 and 5.1), LoPA on a
    # block-causal model 5.2 and 5.7 (before its reads were batched: 11.8 and 15.3), on a bidirectional one
    # 6.1 and 6.5 (12.1 and 18.4).
    assert one.total <= per_forward * forwards and four.total <= per_forward * forwards, (one.reads, four.reads)


def test_sdar_reads_a_few_values_per_forward():
    """SDAR's block loop: the exit test and the finished-rows test per forward, the block bounds once per block."""
    totals = []
    for batch in (1, 4):
        model = tiny_block_model("sdar", seed=1)
        ids = torch.randint(5, 60, (batch, 9), generator=torch.Generator().manual_seed(batch))
        mask = torch.ones_like(ids)
        mask[1::2, :3] = 0
        cfg = DiffusionGenerationConfig(strategy="sdar", max_new_tokens=32, block_length=model.config.block_size,
                                        stop_at_eos=False, threshold=0.9, return_dict_in_generate=True)
        reads = HostReads(root=ROOT)
        with torch.no_grad(), forced_commits(model, 2, model.config.mask_token_id, token=7), reads:
            out = model.generate(ids, attention_mask=mask, generation_config=cfg)
        totals.append(reads.total / int(out.num_forwards.max()))
    # 3.9 and 4.8 at batch 1 and 4 (4.5 and 5.4 when the block bounds took two reads)
    assert max(totals) <= 5, totals


def test_a_cached_forward_reads_nothing_back():
    """The padding check of the attention mask is made once per cache (``DiffusionKVCache.has_padding``),
    not once per forward."""
    model = tiny_llada(seed=1)
    ids = torch.randint(0, 60, (2, 12))
    valid = torch.ones(2, 20, dtype=torch.bool)
    valid[1, :3] = False
    cache = model.allocate_cache(valid, prompt_length=12)
    with torch.no_grad():
        model(input_ids=ids, kv_cache=cache, cache_mode="fill")
        reads = HostReads()
        with reads:
            for start in (12, 16):
                model(input_ids=torch.full((2, 4), model.config.mask_token_id), kv_cache=cache, cache_mode="replace",
                      cache_start=start)
    assert reads.total == 0, reads.reads
    unpadded = torch.ones(2, 20, dtype=torch.bool)
    other = model.allocate_cache(unpadded, prompt_length=12)
    assert other.key_valid is unpadded and not other.has_padding()
    unpadded[0, 0] = False  # changed in place: the cache checks again
    assert other.has_padding()


def test_the_padding_check_works_on_inference_tensors():
    """Under torch.inference_mode tensors keep no version counter: the answer is kept per tensor."""
    model = tiny_llada(seed=1)
    with torch.inference_mode():
        valid = torch.ones(2, 20, dtype=torch.bool)
        cache = model.allocate_cache(valid, prompt_length=12)
        assert not cache.has_padding() and not cache.select_rows([1]).has_padding()
        model(input_ids=torch.randint(0, 60, (2, 12)), kv_cache=cache, cache_mode="fill")
        cache.key_valid = torch.cat([torch.zeros(2, 1, dtype=torch.bool), valid[:, 1:]], 1)  # replaced: seen
        assert cache.has_padding()


def test_host_reads_tell_host_copies_from_device_values():
    x = torch.arange(6, device="cpu")  # a named device: a GPU tensor on a GPU run
    with HostReads() as reads:
        host = x.cpu()
        int(host.sum())  # computed from the host copy: no wait
        bool((x > 2).any())  # a device value read by Python
        (x + 1).tolist()
    assert reads.total == 3 and {what for what, _ in reads.reads} == {"cpu", "__bool__", "tolist"}


def test_host_reads_follow_tensors_made_on_the_host_and_moved():
    with HostReads() as reads:
        flags = torch.zeros(4, dtype=torch.bool)  # no device named: a host tensor
        bool(flags.any())
        moved = flags.to(torch.device("cpu"))  # .to(device): a device copy
        assert moved is not flags
        bool(moved.any())
        back = moved.to("cpu", torch.float64)  # .to("cpu"): a host copy, one read (dtype changed on the host)
        bool(back.any())
        assert back.dtype == torch.float64
    assert reads.total == 2 and {what for what, _ in reads.reads} == {"__bool__", "cpu"}


def test_host_reads_do_not_mistake_a_reused_address_for_a_host_copy():
    """A freed host copy's memory may be reused by a device tensor; the mode marks tensors, not addresses."""
    x = torch.arange(64, device="cpu")
    with HostReads() as reads:
        for _ in range(20):
            host = x.cpu()
            del host
            bool((x * 2).sum() > 0)
    assert reads.total == 40
