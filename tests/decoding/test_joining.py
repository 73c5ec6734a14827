"""Continuous batching: rows that join a running decode loop decode exactly as when they run alone."""

from __future__ import annotations

import pytest
import torch

from dllm.decoding.joining import may_join, supports_joining
from dllm.decoding.streaming import CollectingBatchStreamer
from dllm.generation import DiffusionGenerationConfig
from dllm.testing import EOS, PAD, tiny_dream, tiny_llada
from dllm.text import left_pad

G, B = 16, 4


@pytest.fixture(scope="module")
def model():
    return tiny_llada(initializer_range=0.5)


@pytest.fixture(scope="module")
def bc_model():
    return tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=B)


@pytest.fixture(scope="module")
def dream():
    return tiny_dream(initializer_range=0.5)


@pytest.fixture(scope="module")
def eos_bc_model():
    """Block-causal, and EOS is likely: rows stop at different times (some leave before others join)."""
    m = tiny_llada(initializer_range=0.5, attention_policy="block_causal", block_size=B, seed=1)
    with torch.no_grad():
        head = m.model.transformer["ff_out"].weight
        head[EOS] = head[EOS] * 0 + m.model.transformer["ln_f"].weight.sign() * 1.5
    return m


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 60, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Joiner(CollectingBatchStreamer):
    """Admits scripted prompts at given polls (1-based); records where rows joined."""

    joins_rows = True

    def __init__(self, schedule: dict[int, list[list[int]]]) -> None:
        super().__init__()
        self.schedule = schedule
        self.polls = 0
        self.joined_at: list[tuple[int, int, int]] = []  # (poll, first_row, live_rows)

    def admit_rows(self, first_row: int, live_rows: int) -> list[list[int]]:
        self.polls += 1
        prompts = self.schedule.get(self.polls, [])
        if prompts:
            self.joined_at.append((self.polls, first_row, live_rows))
        return prompts


INITIAL = [_ids(5, 1), _ids(9, 2)]
# poll 2: one row; poll 3: a prompt longer than the batch's (the canvas grows on the left) and a short
# one; poll 6: one more, after the first rows are gone (the canvas is trimmed on the left).
SCHEDULE = {2: [_ids(7, 3)], 3: [_ids(12, 4), _ids(3, 5)], 6: [_ids(6, 6)]}
JOINED = [p for k in sorted(SCHEDULE) for p in SCHEDULE[k]]

CASES = [
    ("threshold", "none", "bidirectional"), ("threshold", "prefix", "bidirectional"),
    ("threshold", "dual", "bidirectional"), ("vanilla", "none", "bidirectional"), ("factor", "dual", "bidirectional"),
    ("threshold", "none", "block_causal"),  # the exact block cache
    ("d2f", "none", "block_causal"), ("d2f", "none", "eos_block_causal"),
    ("threshold", "prefix", "dream"), ("entropy", "dual", "dream"),  # logit shift, GQA
]


@pytest.mark.parametrize("strategy,cache,which", CASES)
@pytest.mark.parametrize("stop_at_eos", [False, True])
def test_joined_rows_equal_their_single_runs(model, bc_model, eos_bc_model, dream, strategy, cache, which,
                                             stop_at_eos):
    m = {"bidirectional": model, "block_causal": bc_model, "eos_block_causal": eos_bc_model, "dream": dream}[which]
    kw = {"max_new_tokens": G, "block_length": B, "strategy": strategy, "cache": cache, "threshold": 0.7,
          "skip_threshold": 0.6, "stop_at_eos": stop_at_eos, "return_dict_in_generate": True}
    if which == "eos_block_causal":
        kw.update(block_add_threshold=0.25, decoded_token_threshold=0.5)  # several blocks in flight per row
    assert supports_joining(m, DiffusionGenerationConfig(**{k: v for k, v in kw.items() if k != "return_dict_in_generate"}))
    ids, mask = left_pad(INITIAL, PAD)
    streamer = Joiner(SCHEDULE)
    out = m.generate(ids, attention_mask=mask, streamer=streamer, **kw)
    # every scripted row joined, mid-call, and got the next row indices in order
    assert [(p, first) for p, first, _ in streamer.joined_at] == [(2, 2), (3, 3), (6, 5)]
    if not (stop_at_eos and which == "eos_block_causal"):  # there, rows may all be gone already
        assert all(live > 0 for _, _, live in streamer.joined_at[:2])
    prompts = INITIAL + JOINED
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


def test_joins_also_refill_an_emptied_call(bc_model):
    """All rows finished: the loop asks once more and keeps going with the rows that join."""
    kw = {"max_new_tokens": 8, "block_length": B, "strategy": "d2f", "skip_threshold": 0.6, "stop_at_eos": False,
          "return_dict_in_generate": True}

    class Later(Joiner):
        def admit_rows(self, first_row, live_rows):
            self.polls += 1
            if live_rows == 0 and first_row == 1:
                self.joined_at.append((self.polls, first_row, live_rows))
                return [_ids(6, 9)]
            return []

    streamer = Later({})
    out = bc_model.generate(torch.tensor([_ids(4, 8)]), streamer=streamer, **kw)
    assert len(streamer.joined_at) == 1 and out.sequences.shape[0] == 2
    single = bc_model.generate(torch.tensor([_ids(6, 9)]), **kw)
    assert torch.equal(out.sequences[1, -8:], single.sequences[0, -8:])
    assert int(out.num_forwards[1]) == int(single.num_forwards[0])


@pytest.mark.parametrize("strategy,extra", [("lopa", {}), ("d3llm", {}), ("vanilla", {"cfg_scale": 1.0})])
def test_strategies_without_joining_never_poll(model, strategy, extra):
    cfg = DiffusionGenerationConfig(strategy=strategy, max_new_tokens=8, block_length=B, **extra)
    assert not supports_joining(model, cfg)
    streamer = Joiner({1: [_ids(3, 1)], 2: [_ids(3, 1)]})
    out = model.generate(torch.tensor([_ids(5, 2)]), generation_config=cfg.replace(return_dict_in_generate=True),
                         streamer=streamer)
    assert streamer.polls == 0 and out.sequences.shape[0] == 1


def test_may_join_bounds_the_spread_of_the_live_windows():
    class Bounded(CollectingBatchStreamer):
        join_max_spread_blocks = 2

    s = Bounded()
    assert may_join(s, place_at=10, window_end=10 + 2 * B, live=3, block=B)
    assert not may_join(s, place_at=10, window_end=10 + 2 * B + 1, live=3, block=B)
    assert may_join(s, place_at=10, window_end=10 + 9 * B, live=0, block=B)  # an emptied call always takes rows
    assert may_join(CollectingBatchStreamer(), place_at=0, window_end=99 * B, live=5, block=B)  # no bound
    assert may_join(None, place_at=0, window_end=99 * B, live=5, block=B)


@pytest.mark.parametrize("bound", [1, 2])
def test_d2f_with_a_spread_bound_polls_only_inside_it_and_joined_rows_equal_single_runs(eos_bc_model, bound):
    """The admission bound delays joins (never while the windows spread wider) and keeps joins exact."""
    kw = {"max_new_tokens": G, "block_length": B, "strategy": "d2f", "skip_threshold": 0.6,
          "block_add_threshold": 0.25, "decoded_token_threshold": 0.5, "return_dict_in_generate": True}
    seen: list[tuple[int, int]] = []  # (live rows, spread in slots) at every poll
    refused: list[tuple[int, int]] = []  # ... where the bound skipped the poll

    class BoundedJoiner(Joiner):
        join_max_spread_blocks = bound

        def admit_rows(self, first_row, live_rows):
            self.polls += 1
            if self.polls > 1 and live_rows and not self.joined_at and first_row == 2:
                self.joined_at.append((self.polls, first_row, live_rows))
                return [_ids(7, 3), _ids(11, 4)]
            return []

    from dllm.decoding.loops import pipeline

    real = pipeline.may_join

    def spy(streamer, *, place_at, window_end, live, block):
        ok = real(streamer, place_at=place_at, window_end=window_end, live=live, block=block)
        (seen if ok else refused).append((live, window_end - place_at))
        return ok

    pipeline.may_join = spy
    try:
        ids, mask = left_pad(INITIAL, PAD)
        streamer = BoundedJoiner({})
        out = eos_bc_model.generate(ids, attention_mask=mask, streamer=streamer, stop_at_eos=False, **kw)
    finally:
        pipeline.may_join = real
    assert streamer.polls == len(seen) > 0
    assert all(live == 0 or spread <= bound * B for live, spread in seen)
    assert refused and all(live > 0 and spread > bound * B for live, spread in refused)  # the bound did bite
    assert len(streamer.joined_at) == 1 and out.sequences.shape[0] == 4
    for i, p in enumerate(INITIAL + [_ids(7, 3), _ids(11, 4)]):
        single = eos_bc_model.generate(torch.tensor([p]), stop_at_eos=False, **kw)
        assert torch.equal(out.sequences[i, -G:], single.sequences[0, -G:]), i
        assert int(out.num_forwards[i]) == int(single.num_forwards[0]), i


def test_a_streamer_that_does_not_join_rows_is_never_polled(bc_model):
    """joins_rows False (the default, and the server without --join): the loops stay in plain mode."""
    kw = {"max_new_tokens": G, "block_length": B, "strategy": "d2f", "skip_threshold": 0.6, "stop_at_eos": False,
          "return_dict_in_generate": True}

    class Passive(Joiner):
        joins_rows = False

    s = Passive({1: [_ids(5, 9)]})
    out = bc_model.generate(torch.tensor([_ids(7, 3)]), streamer=s, **kw)
    assert s.polls == 0 and out.sequences.shape[0] == 1
    assert torch.equal(out.sequences, bc_model.generate(torch.tensor([_ids(7, 3)]), **kw).sequences)
