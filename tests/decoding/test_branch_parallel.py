"""Branch-parallel LoPA over gloo processes on CPU equals single-process LoPA (tokens, rounds, winners).

Each test spawns real worker processes, which load the tiny checkpoint saved to a temp dir.
The calling process is rank 0.
"""

import pytest
import torch

from dllm.decoding.lopa import branch_parallel as bp
from dllm.decoding.lopa.branch_parallel import (
    BranchParallelExecutor,
    rank_groups,
    run_branch_parallel,
)
from dllm.generation import DiffusionGenerationConfig, GenerationConfigError
from dllm.loading import load_model
from dllm.testing import PAD, tiny_llada
from dllm.text import left_pad

G, B = 16, 4
PIPE = dict(block_add_threshold=0.25, decoded_token_threshold=0.5, skip_threshold=0.6)
WORKER = dict(num_threads=1, timeout_s=120)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-bc")
    tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=B).save_pretrained(path)
    return path


def _cfg(**kw):
    base = dict(strategy="lopa", max_new_tokens=G, block_length=B, stop_at_eos=False, return_dict_in_generate=True,
                pad_token_id=PAD, **PIPE)
    base.update(kw)
    return DiffusionGenerationConfig(**base)


def _prompts():
    rows = [torch.randint(0, 60, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 8)]
    ids, mask = left_pad(rows, PAD)
    return rows, ids, mask


def _same(a, b):
    assert torch.equal(a.sequences, b.sequences)
    assert torch.equal(a.num_forwards, b.num_forwards)  # rounds
    assert torch.equal(a.step_map, b.step_map)
    assert a.stats["lopa_winners"] == b.stats["lopa_winners"]
    assert a.stats["steps"] == b.stats["steps"]


def test_rank_groups_are_contiguous_with_anchor_on_rank0():
    assert rank_groups(3, 2) == [[0, 1], [2]]
    assert rank_groups(5, 3) == [[0, 1], [2, 3], [4]]
    assert rank_groups(2, 3) == [[0], [1], []]


def test_two_processes_equal_single_process(ckpt, monkeypatch):
    local = load_model(ckpt)
    _, ids, mask = _prompts()
    sent = []
    run_local = bp._run_local

    def spy(worker, comm, header, x, rows):
        packed = run_local(worker, comm, header, x, rows)
        sent.append((packed.shape[-1], header["req"].width, header["digest_width"], header["ranked"]))
        return packed

    monkeypatch.setattr(bp, "_run_local", spy)
    # a heartbeat every 5 ms: pings fall between the rounds of every generation, and the ranks ignore them
    with BranchParallelExecutor(ckpt, world_size=2, heartbeat_s=0.005, **WORKER) as ex:
        for cfg in (_cfg(lopa_branches=2), _cfg(lopa_branches=4, stop_at_eos=True, max_new_tokens=2 * G),
                    _cfg(lopa_branches=3, lopa_confidence="neg_entropy"),
                    _cfg(lopa_branches=2, lopa_confidence="margin", d2f_confidence="margin")):
            out = ex.generate(ids, attention_mask=mask, generation_config=cfg)
            ref = local.generate(ids, attention_mask=mask, generation_config=cfg)
            _same(out, ref)
            assert any(w > 0 for row in out.stats["lopa_winners"] for w in row)
            assert out.stats["lopa_commit_max_rel_diff"] <= 1e-5  # the winner commit was a no-op on every rank
        # ranks return compact results: per slot (token, prob) per window position + score + K/V digest,
        # and with a ranking other than the probability one ranking confidence per window position
        assert sent and all(n == 2 * w + 1 + d + (w if ranked else 0) and d in (0, 4 * local.spec.num_layers)
                            for n, w, d, ranked in sent)
        assert any(d for _, _, d, _ in sent)  # rounds that cache blocks carry the digest the commit check uses
        assert any(ranked for *_, ranked in sent) and not all(ranked for *_, ranked in sent)
        # sampling cannot be spread over ranks: a clear error, and the executor keeps working
        with pytest.raises(GenerationConfigError, match="greedy"):
            ex.generate(ids, attention_mask=mask, generation_config=_cfg(lopa_branches=2, temperature=0.7, seed=1))
        ex.ping()
        cfg = _cfg(lopa_branches=1)
        _same(ex.generate(ids, attention_mask=mask, generation_config=cfg),
              local.generate(ids, attention_mask=mask, generation_config=cfg))
        # other strategies run on rank 0 alone
        d2f = _cfg(strategy="d2f")
        a, b = ex.generate(ids, attention_mask=mask, generation_config=d2f), local.generate(ids, attention_mask=mask, generation_config=d2f)
        assert torch.equal(a.sequences, b.sequences) and torch.equal(a.num_forwards, b.num_forwards)


@pytest.mark.slow
def test_three_processes_equal_single_process(ckpt):
    rows, ids, mask = _prompts()
    cfg = _cfg(lopa_branches=4)  # 5 branch groups over 3 ranks: shares 2 / 2 / 1
    out = run_branch_parallel(ckpt, rows, cfg, world_size=3, **WORKER)
    ref = load_model(ckpt).generate(ids, attention_mask=mask, generation_config=cfg)
    _same(out, ref)


def test_two_processes_bidirectional_dual_cache(ckpt):
    _, ids, mask = _prompts()
    cfg = _cfg(lopa_branches=3, threshold=0.7, cache="dual")
    with BranchParallelExecutor(ckpt, world_size=2, attention_policy="bidirectional", **WORKER) as ex:
        out = ex.generate(ids, attention_mask=mask, generation_config=cfg)
    ref = load_model(ckpt, attention_policy="bidirectional").generate(ids, attention_mask=mask, generation_config=cfg)
    _same(out, ref)
    assert any(w > 0 for row in out.stats["lopa_winners"] for w in row)


@pytest.mark.slow
def test_an_idle_executor_outlives_the_process_group_timeout(ckpt):
    """The ranks wait for the next round inside a collective, which fails after the group's timeout: idle for
    longer than it (30 s against 24 s), the executor still decodes, because its heartbeat pinged them. With
    ``heartbeat_s=1000`` the same wait ends the worker (gloo: "Connection closed by peer"), as the default
    30-minute timeout would end an idle ``dllm serve --branch-parallel`` server's workers without it."""
    import time

    _, ids, mask = _prompts()
    cfg = _cfg(lopa_branches=2)
    # the timeout also bounds the workers' start (spawn, import, load): 24 s leaves room on a loaded 2-core host
    with BranchParallelExecutor(ckpt, world_size=2, num_threads=1, timeout_s=24, heartbeat_s=2) as ex:
        first = ex.generate(ids, attention_mask=mask, generation_config=cfg)
        time.sleep(30)
        _same(ex.generate(ids, attention_mask=mask, generation_config=cfg), first)
