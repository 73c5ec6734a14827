"""Fast-dLLM v2's decoder (strategy ``fast_dllm_v2``): ``v2/generation_functions.py: batch_sample``.

The model's own blocks (``bd_size``, counted from position 0; ``decoding.loops.block_grid``) are
decoded left to right, each in sub-blocks of ``sub_block_length`` (the reference's
``small_block_size``) taken in order. While a sub-block has masks, one forward commits every masked
slot of it whose probability exceeds ``threshold`` (strictly), and at least its most confident one.
When a block is complete, one forward over it stores its K/V and reads the next block's first token
from the block's last position (the logits are shifted, as an autoregressive model's: the argmax of
that logit, whatever the temperature, as the reference does). A prompt that ends on a block boundary
gets its first token the same way.

``cache="dual"`` is the reference's ``use_block_cache``: a forward over the whole block keeps the
block's K/V; while the first slot of the current sub-block is committed, later forwards feed only
the sub-block, whose fresh K/V replace its slots while the rest of the block keeps the stale ones.
The reference makes that choice for the batch (a full forward as soon as any row's sub-block starts
with a mask), so there a row's tokens depend on its batchmates; dllm makes it per row, in one batched
forward whose cache keeps, for each row, the slots it would not feed alone
(:meth:`~dllm.modeling.kv_cache.DiffusionKVCache.keeping`), so a row decodes as alone and rows may join.

Forward counts: every forward above counts for the rows it serves. The reference also spends a
forward on the complete blocks of a prompt that does not end on a block boundary (its prefill, which
commits nothing); dllm computes them in the first block's first forward, so it counts one forward
fewer for such prompts.

Differences from the reference, each outside what it does correctly:

* a prompt of exactly one block is dropped by the reference (no prefill: ``min_len > block_size`` is
  false, and the first block it decodes has no past); dllm decodes after it;
* at temperature > 0 the reference draws every row's tokens from row 0's distribution
  (``multinomial(p_1t[0])``); dllm draws each row from its own;
* it finishes the block holding the stop token before it stops; dllm stops a row once everything
  before its EOS is committed (``stop_at_eos=False`` decodes the whole budget);
* dllm leaves the slots past ``max_new_tokens`` masked (the model sees them as masks), so an
  answer never depends on tokens it does not return.
"""

from __future__ import annotations

import torch

from dllm.decoding.errors import GenerationConfigError
from dllm.decoding.loops.block_grid import choose, first_block_starts, join_at_boundary, windows
from dllm.decoding.policies import select_best
from dllm.decoding.runner import LogitRules, ModelRunner
from dllm.decoding.state import DecodeState

DEFAULT_SUB_BLOCK = 8  # the reference's small_block_size


def dual_cache_forward(runner, state, cache, cached_end: int, lo: int, hi: int, fresh, alone, first, sub_end,
                       need, block: int) -> tuple[torch.Tensor, int]:
    """Logits [live, hi - lo] for ``cache="dual"``, each row's own forward, and the new ``cached_end``: rows
    ``fresh`` get a forward over their whole block, whose K/V stay cached; rows ``alone`` feed only their
    sub-block after its first slot, whose fresh K/V replace the stale ones while the rest of their block
    keeps its cached K/V; rows that need no forward keep their cache untouched. One batched forward serves
    them all: the cache keeps every slot a row would not feed alone."""
    dev = state.x.device
    slots = torch.arange(cache.capacity, device=dev)[None, :]
    # an `alone` row's fed slots: after the sub-block's first slot, and that slot too where the logits are
    # shifted (its hidden state gives the next slot's logit, so the forward alone feeds it as well)
    own = (slots >= first[:, None] + (0 if runner.shift else 1)) & (slots < sub_end[:, None])
    keep = ~need[:, None] | (alone[:, None] & ~own)
    if bool(fresh.any()):
        with cache.keeping(keep if bool((~fresh).any()) else None):
            logits = runner.cached(state.x, start=cached_end, end=hi, cache=cache, mode="prefix",
                                   block_size=block)[:, lo - cached_end:]
        cache.length = max(cache.length, hi)  # the blocks' K/V stay for the sub-block forwards
        return logits, lo
    a = int(first[alone].min())
    b = min(hi, int(sub_end[alone].max()))
    fed = a + 1 - (1 if runner.shift and a + 1 > 0 else 0)  # the runner feeds the slot before, shifted
    with cache.keeping(keep if bool(keep[:, fed: b].any()) else None):
        part = runner.cached(state.x, start=a + 1, end=b, cache=cache, mode="replace", block_size=block)
    logits = torch.zeros((state.live, hi - lo, part.shape[-1]), dtype=part.dtype, device=dev)
    logits[:, a + 1 - lo: b - lo] = part
    return logits, cached_end


def decode_fast_dllm_v2(model, state: DecodeState, gen: torch.Generator | None):
    cfg = state.cfg
    B, P = cfg.block_size, state.P
    S = min(cfg.sub_block_length or DEFAULT_SUB_BLOCK, B)
    if B % S:
        raise GenerationConfigError(f"sub_block_length={S} must divide the block length {B} (the reference "
                                    "decodes only whole sub-blocks)")
    dual = cfg.cache == "dual"
    runner = ModelRunner(model, prompt_length=P, key_valid=state.key_valid,
                         rules=LogitRules.from_config(cfg, state.mask_id, state.eos))
    cache = model.allocate_cache(state.key_valid, prompt_length=None)  # the model's grid from position 0
    cur = first_block_starts(state.key_valid, P, B)  # per row: the start of the block being decoded
    width = state.x.shape[1]
    dev = state.x.device
    budget = torch.full_like(cur, P + state.limit)  # slots past max_new_tokens stay masks (never committed)
    cached_end = 0

    def next_token(ends: torch.Tensor, rows_in: torch.Tensor) -> None:
        """One forward over the rows' finished blocks; commit the logit of slot ``ends[r]`` (the next
        block's first token) for the rows ``rows_in`` where that slot is still masked."""
        nonlocal cached_end
        hi = min(width, int(ends.max()) + 1)
        logits = runner.cached(state.x, start=cached_end, end=hi, cache=cache, mode="prefix", block_size=B)
        rows = torch.arange(state.live, device=dev)
        at = (ends - cached_end).clamp(max=logits.shape[1] - 1)
        slot_masked = rows_in & (ends < budget) & (state.x[rows, ends.clamp(max=width - 1)] == state.mask_id)
        token = logits[rows, at].argmax(-1)
        span = torch.arange(cached_end, hi, device=dev)[None, :]
        transfer = (span == ends[:, None]) & slot_masked[:, None]
        state.count_forward(slot_masked)
        state.commit(cached_end, transfer, token[:, None].expand_as(transfer))
        cached_end = int(ends.min())  # every row's blocks before `ends` were fed final: exact K/V

    built = torch.zeros_like(cur, dtype=torch.bool)  # per row: its block's K/V in the cache (cache="dual")

    def retire() -> None:
        nonlocal cur, budget, cache, built
        keep = state.pop_finished()
        if keep is not None:
            cur, budget, built = cur[keep], budget[keep], built[keep]
            runner.select_rows(keep)
            cache = cache.select_rows(keep)

    # A prompt that ends on a block boundary: its first token comes from the prompt's last position.
    if bool((cur == P).any()):
        next_token(torch.full_like(cur, P), cur == P)
        retire()
        state.join_ready = False
        yield
    while state.live:
        lo = int(cur.min())
        hi = min(width, int(cur.max()) + B)
        if lo >= hi:
            break
        cached_end = min(cached_end, lo)
        built = torch.zeros_like(cur, dtype=torch.bool)
        for j in range(B // S):
            while state.live:
                sub = windows(cur + j * S, 0, S, lo, hi) & (torch.arange(lo, hi, device=dev)[None, :] < budget[:, None])
                candidates = state.masked(lo, hi) & sub
                need = candidates.any(-1)
                if not bool(need.any()):
                    break
                first = (cur + j * S).clamp(max=width - 1)
                rows = torch.arange(state.live, device=dev)
                if dual:  # per row: a full-block forward, or its sub-block alone against its cached block
                    fresh = need & (~built | (state.x[rows, first] == state.mask_id))
                    alone = need & ~fresh
                    logits, cached_end = dual_cache_forward(runner, state, cache, cached_end, lo, hi, fresh, alone,
                                                            first, cur + (j + 1) * S, need, B)
                    built |= fresh
                else:
                    logits = runner.cached(state.x, start=cached_end, end=hi, cache=cache, mode="prefix",
                                           block_size=B)[:, lo - cached_end:]
                    cached_end = lo
                state.count_forward(need)
                x0, conf = choose(logits, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                                  generator=gen)
                transfer = (candidates & (conf > cfg.threshold)) | select_best(conf, candidates)
                state.commit(lo, transfer & need[:, None], x0)
                retire()
                if state.joining:  # rows join once every row's block is done
                    block = windows(cur, 0, B, lo, hi) & (torch.arange(lo, hi, device=dev)[None, :] < budget[:, None])
                    state.join_ready = not bool((state.masked(lo, hi) & block).any())
                yield
        if not state.live and not state.joining:
            break
        cur = cur + B
        if state.joining:  # a block boundary: rows with no block left leave, waiting rows join
            cur, budget, cache, cached_end = join_at_boundary(state, runner, cache, cached_end, cur, budget)
            width = state.x.shape[1]
            if not state.live:
                break
        built = torch.zeros_like(cur, dtype=torch.bool)  # a new block (and maybe new rows)
        next_token(cur, torch.ones_like(cur, dtype=torch.bool))
        retire()
        state.join_ready = False  # a block starts
        yield
    return {"forward_seconds": runner.forward_seconds, "forwards": runner.forwards}

