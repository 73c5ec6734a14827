"""Continuous batching: rows added to a running DecodeSession decode exactly as when they run alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from dllm import load_model
from dllm.decoding import DecodeSession, get_strategy
from dllm.decoding.errors import GenerationConfigError
from dllm.decoding.joining import may_join
from dllm.decoding.streaming import CollectingBatchStreamer
from dllm.generation import DiffusionGenerationConfig
from dllm.testing import EOS, PAD, tiny_block_model, tiny_dream, tiny_llada
from dllm.text import left_pad

# one set of options runs every strategy here (a sweep), so most calls set some their strategy
# does not read; test_registry.py checks that generate warns of them
pytestmark = pytest.mark.filterwarnings("ignore:strategy '.*' does not read:UserWarning")

G, B = 16, 4


@pytest.fixture(scope="module")
def model():
    return tiny_llada(initializer_range=0.5)


@pytest.fixture(scope="module")
def dream():
    return tiny_dream(initializer_range=0.5)


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 60, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


INITIAL = [_ids(5, 1), _ids(9, 2)]
# after step 1: one row; after step 2: a prompt longer than the batch's (the canvas grows on the left) and
# a short one; once the first two rows are gone: one more (the canvas is trimmed on the left).
EARLY = {1: [_ids(7, 3)], 2: [_ids(12, 4), _ids(3, 5)]}
LATE = [_ids(6, 6)]

CASES = [
    ("threshold", "none", "bidirectional"), ("threshold", "prefix", "bidirectional"),
    ("threshold", "dual", "bidirectional"), ("vanilla", "none", "bidirectional"), ("factor", "dual", "bidirectional"),
    ("threshold", "none", "block_causal"),  # the exact block cache
    ("d2f", "none", "block_causal"), ("d2f", "none", "eos_block_causal"),
    ("threshold", "prefix", "dream"), ("entropy", "dual", "dream"),  # logit shift, GQA
    ("d3llm", "none", "bidirectional"),  # the pipeline without a cache
    ("d3llm", "prefix", "bidirectional"),  # the delayed cache: each row refreshes on its own schedule
]


def _session(m, kw, streamer=None, **session_kw) -> DecodeSession:
    cfg = m.diffusion_generation_config.replace(**kw)
    return DecodeSession(m, cfg, streamer=streamer, joinable=True, **session_kw)


@pytest.mark.parametrize("strategy,cache,which", CASES)
@pytest.mark.parametrize("stop_at_eos", [False, True])
def test_joined_rows_equal_their_single_runs(model, bc_model, eos_bc_model, dream, strategy, cache, which,
                                             stop_at_eos):
    m = {"bidirectional": model, "block_causal": bc_model, "eos_block_causal": eos_bc_model, "dream": dream}[which]
    kw = {"max_new_tokens": G, "block_length": B, "strategy": strategy, "cache": cache, "threshold": 0.7,
          "skip_threshold": 0.6, "stop_at_eos": stop_at_eos, "return_dict_in_generate": True}
    if which == "eos_block_causal":
        kw.update(block_add_threshold=0.25, decoded_token_threshold=0.5)  # several blocks in flight per row
    assert get_strategy(strategy).can_join(m.diffusion_generation_config.replace(**kw))
    streamer = CollectingBatchStreamer()
    session = _session(m, kw, streamer)
    ids, mask = left_pad(INITIAL, PAD)
    assert session.add_rows(ids, mask) == range(0, 2)
    added, joined, steps, late = [], [], 0, False
    while session.step():
        steps += 1
        if session.finished():  # every row left (EOS) and none was waiting: the batch has ended
            break
        if steps in EARLY:
            added.append((session.add_rows(EARLY[steps]).start, session.live))
            joined += EARLY[steps]
        elif not late and 0 in streamer.finished and 1 in streamer.finished and session.live:
            added.append((session.add_rows(LATE).start, session.live))
            joined += LATE
            late = True
    # every row joined mid-call and got the next row indices in order
    assert [first for first, _ in added] == [2, 3, 5][: len(added)]
    # threshold/factor join mid-block (with any cache; a joined row refreshes on its own steps): the early rows then
    # share the first rows' block grid and may all end together (no late join)
    mid_block = getattr(get_strategy(strategy).policy, "joins_mid_block", False)
    if not (stop_at_eos and which == "eos_block_causal"):  # there, every row may be gone already
        assert (late or mid_block) and all(live > 0 for _, live in added), (late, added, steps)
    out = session.output()
    prompts = INITIAL + joined
    assert out.sequences.shape == (len(prompts), max(map(len, prompts)) + G)
    assert len(out.finish_reason) == len(prompts) == len(out.num_forwards)
    for i, p in enumerate(prompts):
        single = m.generate(torch.tensor([p]), **kw)
        assert torch.equal(out.sequences[i, -G:], single.sequences[0, -G:]), (i, strategy, cache)
        assert torch.equal(out.sequences[i, -G - len(p) : -G], torch.tensor(p))  # the prompt, left-padded
        assert int(out.num_forwards[i]) == int(single.num_forwards[0]), i
        assert torch.equal(out.step_map[i], single.step_map[0]), i
        assert out.finish_reason[i] == single.finish_reason[0]
        assert streamer.finished[i] == single.finish_reason[0]
        gen = single.sequences[0, len(p):].tolist()
        n = int(single.generated_tokens[0])
        assert streamer.tokens.get(i, []) == (gen[: n - 1] if gen[n - 1] == EOS else gen[:n])
    if which == "eos_block_causal" and stop_at_eos:
        assert "stop" in out.finish_reason  # rows did leave early


def test_rows_with_their_own_thresholds_share_forwards_and_equal_their_single_runs(model, bc_model):
    for m, strategy, name in ((model, "threshold", "threshold"), (bc_model, "d2f", "skip_threshold")):
        kw = {"max_new_tokens": G, "block_length": B, "strategy": strategy, "return_dict_in_generate": True}
        taus = [0.5, 0.9, 0.7]
        prompts = [_ids(5, 1), _ids(9, 2), _ids(7, 3)]
        session = _session(m, kw)
        session.add_rows(prompts[:2], **{name: taus[:2]})
        session.step()
        session.add_rows(prompts[2:], **{name: taus[2]})
        out = session.run()
        forwards = session.forwards
        for i, (p, tau) in enumerate(zip(prompts, taus)):
            single = m.generate(torch.tensor([p]), **kw, **{name: tau})
            assert torch.equal(out.sequences[i, -G:], single.sequences[0, -G:]), (strategy, i)
            assert int(out.num_forwards[i]) == int(single.num_forwards[0])
        assert forwards < int(out.num_forwards.sum())  # rows shared forwards
    with pytest.raises(GenerationConfigError, match="per row"):
        _session(model, {"strategy": "threshold"}).add_rows([[1, 2]], skip_threshold=0.5)
    with pytest.raises(GenerationConfigError, match="threshold"):
        _session(model, {"strategy": "threshold"}).add_rows([[1, 2]], threshold=float("nan"))


def test_a_session_that_has_drained_takes_no_more_rows(bc_model):
    """The last row left: the session is finished; new rows go to a new session."""
    kw = {"max_new_tokens": 8, "block_length": B, "strategy": "d2f", "skip_threshold": 0.6, "stop_at_eos": False,
          "return_dict_in_generate": True}
    session = _session(bc_model, kw)
    session.add_rows([_ids(4, 8)])
    out = session.run()
    assert out.sequences.shape[0] == 1 and session.finished()
    with pytest.raises(GenerationConfigError, match="finished"):
        session.add_rows([_ids(6, 9)])


@pytest.mark.parametrize("strategy,extra", [("vanilla", {"cfg_scale": 1.0})])
def test_strategies_without_joining_refuse_rows_once_running(model, strategy, extra):
    cfg = DiffusionGenerationConfig(strategy=strategy, max_new_tokens=8, block_length=B, **extra)
    session = DecodeSession(model, cfg, joinable=True)
    assert not session.joinable
    session.add_rows([_ids(5, 2)])
    session.add_rows([_ids(3, 1)])  # before the first step: part of the first batch
    session.step()
    with pytest.raises(GenerationConfigError, match="does not take rows into a running batch"):
        session.add_rows([_ids(3, 1)])
    session.run()
    assert session.output().sequences.shape[0] == 2


def test_may_join_bounds_the_spread_of_the_live_windows():
    def state(live, bound):
        return SimpleNamespace(live=live, join_max_spread_blocks=bound)

    assert may_join(state(3, 2), place_at=10, window_end=10 + 2 * B, block=B)
    assert not may_join(state(3, 2), place_at=10, window_end=10 + 2 * B + 1, block=B)
    assert may_join(state(0, 2), place_at=10, window_end=10 + 9 * B, block=B)  # an emptied call always takes rows
    assert may_join(state(5, None), place_at=0, window_end=99 * B, block=B)  # no bound


@pytest.mark.parametrize("bound", [1, 2])
def test_d2f_with_a_spread_bound_places_rows_only_inside_it_and_joined_rows_equal_single_runs(eos_bc_model, bound):
    """The admission bound delays joins (never while the windows spread wider) and keeps joins exact."""
    kw = {"max_new_tokens": G, "block_length": B, "strategy": "d2f", "skip_threshold": 0.6,
          "block_add_threshold": 0.25, "decoded_token_threshold": 0.5, "return_dict_in_generate": True,
          "stop_at_eos": False}
    calls: list[tuple[bool, bool, int, int]] = []  # (allowed, rows waiting, live rows, spread in slots)

    from dllm.decoding.loops import pipeline

    real = pipeline.may_join

    def spy(state, *, place_at, window_end, block):
        ok = real(state, place_at=place_at, window_end=window_end, block=block)
        calls.append((ok, bool(state.incoming), state.live, window_end - place_at))
        return ok

    pipeline.may_join = spy
    try:
        session = _session(eos_bc_model, kw, join_max_spread_blocks=bound)
        ids, mask = left_pad(INITIAL, PAD)
        session.add_rows(ids, mask)
        added = False
        while session.step():
            if not added and calls and not calls[-1][0]:  # the windows spread too wide right now: add rows
                session.add_rows([_ids(7, 3), _ids(11, 4)])
                added = True
        out = session.output()
    finally:
        pipeline.may_join = real
    assert added
    assert any(not ok for ok, *_ in calls)  # the bound did bite
    assert all(live > 0 and spread > bound * B for ok, _, live, spread in calls if not ok)
    assert all(live == 0 or spread <= bound * B for ok, _, live, spread in calls if ok)  # rows placed only inside it
    assert sum(ok and waiting for ok, waiting, *_ in calls) == 1
    assert out.sequences.shape[0] == 4
    for i, p in enumerate(INITIAL + [_ids(7, 3), _ids(11, 4)]):
        single = eos_bc_model.generate(torch.tensor([p]), **kw)
        assert torch.equal(out.sequences[i, -G:], single.sequences[0, -G:]), i
        assert int(out.num_forwards[i]) == int(single.num_forwards[0]), i


def test_a_session_that_is_not_joinable_runs_as_a_plain_batch(bc_model):
    kw = {"max_new_tokens": G, "block_length": B, "strategy": "d2f", "skip_threshold": 0.6, "stop_at_eos": False,
          "return_dict_in_generate": True}
    session = DecodeSession(bc_model, bc_model.diffusion_generation_config.replace(**kw))
    session.add_rows(torch.tensor([_ids(7, 3)]))
    session.step()
    with pytest.raises(GenerationConfigError, match="running batch"):
        session.add_rows([_ids(5, 9)])
    out = session.run()
    assert torch.equal(out.sequences, bc_model.generate(torch.tensor([_ids(7, 3)]), **kw).sequences)


@pytest.mark.parametrize("strategy,cache,which", [
    ("threshold", "none", "bidirectional"), ("factor", "none", "bidirectional"),
    ("threshold", "none", "block_causal"), ("d2f", "none", "block_causal"), ("d3llm", "none", "bidirectional"),
])
def test_a_row_added_between_steps_is_decoded_by_the_next_step(model, bc_model, strategy, cache, which):
    """No waiting for a block boundary where the forwards stay exact: the row's first committed tokens
    come from the very next forward (and still equal its single run, above)."""
    m = {"bidirectional": model, "block_causal": bc_model}[which]
    kw = {"max_new_tokens": G, "block_length": B, "strategy": strategy, "cache": cache, "threshold": 1.0,
          "factor": 0.01, "skip_threshold": 0.6, "stop_at_eos": False}  # semi-AR: one token per step
    session = _session(m, kw)
    session.add_rows(INITIAL)
    session.step()
    session.step()  # mid-block for the semi-AR strategies: 2 steps into a block of 4
    (row,) = session.add_rows([_ids(7, 3)])
    session.step()
    state = session.state
    assert state.live == 3  # joined
    r = state.live - 1
    start = int(state.gstart[r])
    assert bool((state.x[r, start : start + G] != m.config.mask_token_id).any())


# -- the decoders of position-aligned block-causal models (SDAR, Fast-dLLM v2) and token editing (LLaDA2) --

@pytest.fixture(scope="module")
def block_models():
    """SDAR and Fast-dLLM v2 at the parity fixtures' recipe, EOS made likelier (some rows stop early)."""
    models = {f: tiny_block_model(f, seed=0, scale=8.0, silent=(3,)) for f in ("sdar", "fast-dllm-v2")}
    with torch.no_grad():
        for m in models.values():
            m.lm_head.weight[2] *= 1.5  # the bundled tokenizer's EOS
    return models


def _vocab_ids(n: int, seed: int) -> list[int]:
    """Ids of the bundled tokenizer's vocabulary past its special ids."""
    return torch.randint(10, 400, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run_joining(m, cfg, initial, early, late, branch_executor=None):
    """Decode ``initial``; add ``early[k]`` after step k and ``late`` once rows 0 and 1 have ended.
    Returns (output, every prompt in row order, how many rows were live at each add)."""
    streamer = CollectingBatchStreamer()
    session = DecodeSession(m, cfg, streamer=streamer, joinable=True, branch_executor=branch_executor)
    assert session.joinable
    session.add_rows(initial)
    prompts, live_at_add, steps, late_added = list(initial), [], 0, False
    while session.step():
        steps += 1
        if session.finished():
            break
        if steps in early:
            assert session.add_rows(early[steps]).start == len(prompts)
            prompts += early[steps]
            live_at_add.append(session.live)
        elif not late_added and 0 in streamer.finished and 1 in streamer.finished and session.live:
            assert session.add_rows(late).start == len(prompts)
            prompts += late
            live_at_add.append(session.live)
            late_added = True
    out = session.output()
    for i in range(len(prompts)):
        assert streamer.finished[i] == out.finish_reason[i]
    return out, prompts, live_at_add


def _assert_rows_equal_single_runs(m, cfg, out, prompts, n):
    """Every row's tokens, forwards, finish reason and step map are those of its single run (returned)."""
    assert len(out.finish_reason) == len(prompts)
    singles = [m.generate(torch.tensor([p]), generation_config=cfg) for p in prompts]
    for i, (p, single) in enumerate(zip(prompts, singles)):
        assert out.sequences[i, -n:].tolist() == single.sequences[0, len(p):].tolist(), i
        assert int(out.num_forwards[i]) == int(single.num_forwards[0]), i
        assert out.finish_reason[i] == single.finish_reason[0], i
        assert torch.equal(out.step_map[i], single.step_map[0]), i
    return singles


POSITION_CASES = [
    ("sdar", "sdar", {}), ("sdar", "sdar", {"unmasking": "low_confidence_static", "denoising_steps": 2}),
    ("fast-dllm-v2", "fast_dllm_v2", {}), ("fast-dllm-v2", "fast_dllm_v2", {"sub_block_length": 4}),
    # the sub-block cache: each row chooses its full-block or sub-block forward, in one batched forward
    ("fast-dllm-v2", "fast_dllm_v2", {"cache": "dual"}),
    ("fast-dllm-v2", "fast_dllm_v2", {"cache": "dual", "sub_block_length": 2}),
]


@pytest.mark.parametrize("family,strategy,extra", POSITION_CASES)
@pytest.mark.parametrize("stop_at_eos", [False, True])
@pytest.mark.parametrize("n", [16, 13])  # a budget that ends inside a block leaves its last slots masked
def test_position_grid_decoders_join_rows_that_then_equal_their_single_runs(block_models, family, strategy, extra,
                                                                             stop_at_eos, n):
    m = block_models[family]
    cfg = DiffusionGenerationConfig(strategy=strategy, max_new_tokens=n, block_length=m.spec.block_size,
                                    temperature=0.0, stop_at_eos=stop_at_eos, mask_token_id=3, eos_token_id=2,
                                    threshold=0.9, return_dict_in_generate=True, **extra)
    assert get_strategy(strategy).can_join(cfg)
    # prompts that end on a block boundary (8), one past it (9) and inside (3, 5, 7, 12, 6)
    initial = [_vocab_ids(5, 1), _vocab_ids(8, 2)]
    early = {1: [_vocab_ids(7, 3)], 2: [_vocab_ids(12, 4), _vocab_ids(3, 5), _vocab_ids(9, 7)]}
    out, prompts, live_at_add = _run_joining(m, cfg, initial, early, [_vocab_ids(6, 6)])
    assert len(prompts) >= 6 and all(live > 0 for live in live_at_add)
    _assert_rows_equal_single_runs(m, cfg, out, prompts, n)
    if stop_at_eos and n == 16 and not extra:
        assert "stop" in out.finish_reason  # rows did leave early


@pytest.fixture(scope="module")
def edit_models(moe_checkpoints):
    """LLaDA2 (blocks from each row's first token) and tiny-d2f (blocks from the prompt end)."""
    return {"llada2": load_model(moe_checkpoints["llada2"]), "tiny-d2f": load_model("tiny-d2f")}


@pytest.mark.parametrize("which,block,extra", [
    ("llada2", 4, {"threshold": 0.5, "editing_threshold": 0.5, "max_post_steps": 16}),  # edits fire
    ("llada2", 4, {"threshold": 0.3, "editing_threshold": 0.3, "max_post_steps": 2}),
    ("llada2", 8, {"threshold": 0.5, "editing_threshold": 1.0}),  # T2T off: threshold over the block cache
    ("tiny-d2f", 4, {"threshold": 0.5, "editing_threshold": 0.5, "max_post_steps": 4}),
])
@pytest.mark.parametrize("stop_at_eos", [False, True])
def test_token_editing_joins_rows_that_then_equal_their_single_runs(edit_models, which, block, extra, stop_at_eos):
    m = edit_models[which]
    n = 10
    cfg = m.diffusion_generation_config.replace(strategy="edit", max_new_tokens=n, block_length=block,
                                                temperature=0.0, stop_at_eos=stop_at_eos,
                                                return_dict_in_generate=True, **extra)
    assert get_strategy("edit").can_join(cfg)
    initial = [_vocab_ids(5, 1), _vocab_ids(8, 2)]
    early = {1: [_vocab_ids(7, 3)], 2: [_vocab_ids(12, 4), _vocab_ids(3, 5)], 5: [_vocab_ids(9, 7)]}
    out, prompts, live_at_add = _run_joining(m, cfg, initial, early, [_vocab_ids(6, 6)])
    assert len(prompts) >= 6 and all(live > 0 for live in live_at_add)
    singles = _assert_rows_equal_single_runs(m, cfg, out, prompts, n)
    for name in ("edits", "blocks", "edit_forwards"):
        assert out.stats[name] == [single.stats[name][0] for single in singles], name


def test_which_block_family_settings_join():
    def joins(strategy, **kw):
        return get_strategy(strategy).can_join(DiffusionGenerationConfig(strategy=strategy, **kw))

    assert joins("sdar") and joins("edit") and joins("fast_dllm_v2", cache="none")
    assert joins("fast_dllm_v2", cache="dual")  # each row chooses its own full-block or sub-block forward
    assert joins("lopa") and joins("lopa", cache="dual") and joins("d3llm", cache="prefix")


@pytest.fixture(scope="module")
def lopa_models(model, eos_bc_model):
    """The bundled checkpoints tiny-d2f (block-causal: the D2F base rule) and tiny (bidirectional: threshold),
    whose answers end at once with EOS, so without stopping there; and EOS-prone models with it."""
    return {"tiny-d2f": load_model("tiny-d2f"), "tiny": load_model("tiny"), "eos_block_causal": eos_bc_model,
            "bidirectional": model}


@pytest.mark.parametrize("which,block,extra", [
    ("tiny-d2f", 4, {"skip_threshold": 0.6, "block_add_threshold": 0.25, "decoded_token_threshold": 0.5}),
    ("tiny-d2f", 8, {"skip_threshold": 0.9}),
    ("eos_block_causal", 4, {"skip_threshold": 0.6, "block_add_threshold": 0.25, "decoded_token_threshold": 0.5,
                             "stop_at_eos": True}),
    ("tiny", 4, {"threshold": 0.5, "cache": "none"}),
    ("tiny", 4, {"threshold": 0.5, "cache": "dual"}),
    ("tiny", 8, {"threshold": 0.5, "cache": "prefix"}),
    ("bidirectional", 4, {"threshold": 0.7, "cache": "dual", "stop_at_eos": True}),
])
def test_lopa_joins_rows_that_then_equal_their_single_runs(lopa_models, which, block, extra):
    """Rows added after rounds 1 and 2 (and once the first two ended) commit the same tokens in the same
    forwards as alone, with the same branch winners (D2F base rule: before every round; threshold: at
    block starts)."""
    m = lopa_models[which]
    n = 16
    kw = {"stop_at_eos": False, **extra}
    cfg = m.diffusion_generation_config.replace(strategy="lopa", lopa_branches=2, max_new_tokens=n,
                                                block_length=block, temperature=0.0, return_dict_in_generate=True,
                                                **kw)
    assert get_strategy("lopa").can_join(cfg)
    ids = _vocab_ids if which.startswith("tiny") else _ids
    initial = [ids(5, 1), ids(8, 2)]
    early = {1: [ids(7, 3)], 2: [ids(12, 4), ids(3, 5)]}
    out, prompts, live_at_add = _run_joining(m, cfg, initial, early, [ids(6, 6)])
    # with EOS stops every row may be gone before the later rows could join
    assert len(prompts) >= (3 if kw["stop_at_eos"] else 5) and all(live > 0 for live in live_at_add)
    singles = _assert_rows_equal_single_runs(m, cfg, out, prompts, n)
    assert out.stats["lopa_winners"] == [single.stats["lopa_winners"][0] for single in singles]
    assert any(w for row in out.stats["lopa_winners"] for w in row)  # lookahead branches did win
    if kw["stop_at_eos"]:
        assert "stop" in out.finish_reason


@pytest.mark.slow
@pytest.mark.parametrize("which,block,extra", [
    ("tiny-d2f", 4, {"skip_threshold": 0.6, "block_add_threshold": 0.25, "decoded_token_threshold": 0.5}),
    ("tiny", 4, {"threshold": 0.5, "cache": "dual"}),
])
def test_branch_parallel_lopa_joins_rows_that_then_equal_their_single_runs(lopa_models, which, block, extra):
    """With its branch groups on 2 processes (a BranchParallelExecutor), LoPA takes joined rows as the
    single-process executor does: every rank re-lays out its groups' slots, and each row commits the same
    tokens in the same forwards, with the same winners, as alone on one process."""
    from dllm.decoding.lopa.branch_parallel import BranchParallelExecutor

    m = lopa_models[which]
    n = 16
    cfg = m.diffusion_generation_config.replace(strategy="lopa", lopa_branches=3, max_new_tokens=n,
                                                block_length=block, temperature=0.0, return_dict_in_generate=True,
                                                stop_at_eos=False, **extra)
    initial = [_vocab_ids(5, 1), _vocab_ids(8, 2)]
    early = {1: [_vocab_ids(7, 3)], 2: [_vocab_ids(12, 4), _vocab_ids(3, 5)]}
    with BranchParallelExecutor(which, world_size=2, num_threads=1, timeout_s=120) as ex:
        assert DecodeSession(ex.model, cfg, joinable=True, branch_executor=ex.branch_factory).joinable
        out, prompts, live_at_add = _run_joining(ex.model, cfg, initial, early, [_vocab_ids(6, 6)],
                                                 branch_executor=ex.branch_factory)
    assert len(prompts) == 6 and all(live > 0 for live in live_at_add)
    singles = _assert_rows_equal_single_runs(m, cfg, out, prompts, n)
    assert out.stats["lopa_winners"] == [single.stats["lopa_winners"][0] for single in singles]
    assert any(w for row in out.stats["lopa_winners"] for w in row)


def test_lopa_with_a_branch_executor_takes_no_rows_once_running(lopa_models):
    """The single-process executor takes joined rows; one that does not say so (an executor factory
    without ``joins_rows``) makes the batch a plain one."""
    from dllm.decoding.lopa import local_executor

    m = lopa_models["tiny-d2f"]
    cfg = m.diffusion_generation_config.replace(strategy="lopa", lopa_branches=2, max_new_tokens=8,
                                                stop_at_eos=False)
    assert DecodeSession(m, cfg, joinable=True).joinable
    assert DecodeSession(m, cfg, joinable=True, branch_executor=local_executor).joinable

    def foreign(*args, **kw):
        return local_executor(*args, **kw)

    session = DecodeSession(m, cfg, joinable=True, branch_executor=foreign)
    assert not session.joinable
    session.add_rows([_vocab_ids(5, 1)])
    session.step()
    with pytest.raises(GenerationConfigError, match="branch executor"):
        session.add_rows([_vocab_ids(3, 2)])
    assert session.run().sequences.shape[0] == 1


def _probe_admits_now(m, cfg, initial, new_prompt, probes: int) -> set[bool]:
    """For k = 1..probes: decode ``initial`` k steps, add ``new_prompt(k)``, step once, and check that the row
    was placed exactly when ``admits_now`` said so. Returns the answers seen."""
    seen = set()
    for probe in range(1, probes + 1):
        session = DecodeSession(m, cfg, joinable=True)
        session.add_rows(initial)
        for _ in range(probe):
            session.step()
        if session.finished():
            break
        ready = session.admits_now
        seen.add(ready)
        session.add_rows([new_prompt(probe)])
        session.step()
        assert (not session.state.incoming) == ready, (probe, ready)
    return seen


@pytest.mark.parametrize("which,kw", [
    ("bidirectional", {"strategy": "vanilla"}),  # joins at block boundaries
    ("bidirectional", {"strategy": "threshold", "cache": "dual", "threshold": 0.7, "dual_cache_step_bound": True}),
    ("bidirectional", {"strategy": "entropy", "cache": "dual"}),
    ("bidirectional", {"strategy": "threshold", "threshold": 0.7}),  # joins after any step
    ("bidirectional", {"strategy": "threshold", "cache": "dual", "threshold": 0.7}),
    ("block_causal", {"strategy": "d2f", "skip_threshold": 0.6}),
    ("block_causal", {"strategy": "threshold", "cache": "prefix", "threshold": 0.7}),
])
def test_admits_now_says_whether_the_next_step_decodes_a_row_added_now(model, bc_model, which, kw):
    """A server joins a request into a running batch only where ``admits_now`` holds; it must be exact both ways:
    a row added while it holds is live after the next step, one added while it does not still waits."""
    m = model if which == "bidirectional" else bc_model
    cfg = m.diffusion_generation_config.replace(max_new_tokens=G, block_length=B, stop_at_eos=False, **kw)
    seen = _probe_admits_now(m, cfg, INITIAL, lambda probe: _ids(6, 10 + probe), probes=7)
    mid_block = kw["strategy"] == "d2f" or (kw["strategy"] == "threshold" and not kw.get("dual_cache_step_bound"))
    assert seen == ({True} if mid_block else {True, False}), seen


@pytest.mark.parametrize("family,strategy,extra", [("sdar", "sdar", {}), ("fast-dllm-v2", "fast_dllm_v2", {}),
                                                   ("fast-dllm-v2", "fast_dllm_v2", {"cache": "dual"})])
def test_admits_now_holds_at_the_block_boundaries_of_position_grid_decoders(block_models, family, strategy, extra):
    m = block_models[family]
    cfg = DiffusionGenerationConfig(strategy=strategy, max_new_tokens=16, block_length=m.spec.block_size,
                                    temperature=0.0, stop_at_eos=False, mask_token_id=3, eos_token_id=2,
                                    threshold=0.9, **extra)
    initial = [_vocab_ids(5, 1), _vocab_ids(8, 2)]
    assert _probe_admits_now(m, cfg, initial, lambda probe: _vocab_ids(6, 10 + probe), probes=9) == {True, False}


@pytest.mark.parametrize("cache", ["prefix", "dual"])
@pytest.mark.parametrize("refresh_interval", [None, 2])
def test_rows_joining_mid_block_refresh_on_their_own_steps(model, monkeypatch, cache, refresh_interval):
    """With the prefix and dual caches a row that joins inside a block refreshes at its own step 0 (and every
    refresh_interval of its own steps) while the others take their cached steps, in one forward."""
    from dllm.modeling.kv_cache import DiffusionKVCache

    mixed = []
    keeping = DiffusionKVCache.keeping
    monkeypatch.setattr(DiffusionKVCache, "keeping", lambda self, keep: (mixed.append(keep is not None),
                                                                         keeping(self, keep))[1])
    cfg = model.diffusion_generation_config.replace(max_new_tokens=G, block_length=B, strategy="threshold", cache=cache,
                                                    threshold=0.7, stop_at_eos=False, refresh_interval=refresh_interval,
                                                    return_dict_in_generate=True)
    prompts = [_ids(5, 1), _ids(9, 2), _ids(7, 3), _ids(12, 4)]
    session = DecodeSession(model, cfg, joinable=True)
    session.add_rows(prompts[:2])
    session.step()
    session.add_rows([prompts[2]])
    session.step()
    session.add_rows([prompts[3]])
    out = session.run()
    assert any(mixed)  # some forward served refreshing and cached rows at once
    _assert_rows_equal_single_runs(model, cfg, out, prompts, G)
