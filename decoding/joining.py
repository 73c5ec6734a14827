"""Continuous batching: rows that join a running decoding loop.

A :class:`~dllm.decoding.decode_session.DecodeSession` created with ``joinable=True`` takes new rows between
steps (``add_rows``) when its strategy can (``Strategy.joins_rows``); its loop places them at its join
points (without joining it runs exactly as a plain batch):

* semi-AR (``vanilla``, ``threshold``, ``factor``, Dream's ``entropy``/``margin``/``maskgit_plus``;
  caches ``none``/``prefix``/``dual`` and the exact block cache of block-causal models): at every
  block boundary, and after every step where policy and plan allow it (``joins_mid_block``:
  ``threshold``/``factor`` with any cache, the dual cache without ``dual_cache_step_bound``; with the
  prefix and dual caches a joined row refreshes on its own steps). A new row's prompt is
  placed so that it *ends* at the current block start, so its generated blocks coincide with the
  batch's block grid.
* D2F pipeline (block-causal models): before every forward. Rows keep their own block grids, so a
  new row's prompt ends where the batch's forward window starts (the oldest uncached slot). With
  ``join_max_spread_blocks`` set, only while the live rows' windows span at most
  that many blocks from there (:func:`may_join`): rows that are far apart make every forward
  cover the union of their windows.
* d3LLM: before every forward, as D2F. Without a cache its full forwards keep nothing to move; with
  the delayed cache each row decides its own refreshes and keeps its own stable prefix, and one
  batched forward serves every row's choice (the cache keeps the slots a row would not feed alone:
  :meth:`dllm.modeling.kv_cache.DiffusionKVCache.keeping`); a joined row's first forward refreshes.
* SDAR (``sdar``) and Fast-dLLM v2 (``fast_dllm_v2``, its sub-block cache too) on position-aligned
  models: at every block boundary (for ``fast_dllm_v2`` before the forward that reads the next
  blocks' first tokens). Blocks follow each row's own positions, so a new prompt of ``n`` tokens is
  placed so that its first block (its last ``n % B`` tokens and the first masks) starts at or after
  the slowest row's next block (:func:`dllm.decoding.loops.block_grid.join_at_boundary`). With ``cache="dual"`` each row chooses
  its own full-block or sub-block forward, served by one batched forward whose cache keeps, for each
  row, the slots it would not feed alone, so rows on different block grids decode as alone.
* Token editing (``edit``): before every forward, as D2F (rows already advance through their blocks
  on their own); a new prompt ends at the slowest row's current block start.
* LoPA with its single-process executor (``local_executor``) or a branch-parallel one
  (``BranchParallelExecutor.branch_factory``): on the D2F base rule before every round, as D2F
  (``join_max_spread_blocks`` included); on the threshold base rule (bidirectional models) at every
  block boundary, as semi-AR. The executor re-lays out every branch group's canvas rows and cache the
  same way (:meth:`dllm.decoding.lopa.slots.SlotWorker.admit`, with :func:`move_cache`; a branch-parallel
  executor tells every rank to do so for its share of the groups); a joined row starts with no
  lookahead branches, as in its first round alone. An executor factory takes joined rows when it is
  marked ``joins_rows = True``.

Every row owns a slot range of the canvas (:meth:`dllm.decoding.state.DecodeState.admit`): slots outside
it are invalid for the row (``key_valid``), RoPE positions count its valid slots only, and
block-causal masks use its own prompt end (a per-row ``prompt_length``). Attention never crosses
rows, so at temperature 0 a joined row commits the same tokens, in the same forwards, as when it
runs alone. How its prompt's K/V get computed:

* no cache: every forward covers the whole canvas;
* ``prefix``/``dual``: the full refresh that starts every block;
* exact block cache, D2F (LoPA's too), SDAR, Fast-dLLM v2 and token editing: the next forward is fed from the new
  prompt's first slot (the K/V of
  the other rows' final blocks are recomputed from the same tokens: exact under the block-causal
  mask). That forward is the new row's first one, as it is when the row runs alone (prompt and
  first block together), so forward counts match too.

Joining re-lays out the canvas and the cache (a copy, once per join): slots no live row uses any
more are dropped on the left, so a long-running call does not grow without bound.

Strategies that do not join take new rows in a batch of their own, which the server steps in turn
with the running ones:

* LoPA with a branch executor factory not marked ``joins_rows`` (a third-party one).
* Classifier-free guidance: the conditional and unconditional rows share each forward from the start.
"""

from __future__ import annotations

import torch

from dllm.modeling.kv_cache import DiffusionKVCache


def may_join(state, *, place_at: int, window_end: int, block: int) -> bool:
    """Whether a D2F call places waiting rows now (see ``DecodeSession(join_max_spread_blocks=...)``).

    ``place_at`` is where a new prompt would end (the slowest live row's first uncached slot) and
    ``window_end`` the furthest live row's end: every forward after the join spans at least that
    range, for every row, until the rows ahead finish.
    """
    bound = state.join_max_spread_blocks
    return state.live == 0 or bound is None or window_end - place_at <= bound * block


def poll(state, *, place_at: int, runner, cache: DiffusionKVCache | None):
    """Place the rows waiting in ``state.incoming`` with their prompts ending at slot ``place_at``.

    Returns ``(number of new rows, slot shift, cache)``: every slot index the caller holds moves by
    ``-shift``; the runner is updated in place and the cache is replaced (rows and slots re-laid
    out). ``(0, 0, cache)`` when nothing joined.
    """
    if not state.incoming:
        return 0, 0, cache
    old_live = state.live
    joined, shift = state.admit(place_at)
    runner.key_valid = state.key_valid
    runner.prompt_length = state.gstart.clone()
    if cache is not None:
        cache = relayout_cache(cache, state, shift, old_live)
    return joined, shift, cache


def relayout_cache(cache: DiffusionKVCache, state, shift: int, old_rows: int) -> DiffusionKVCache:
    """A cache for the re-laid-out canvas: the old rows' K/V moved by ``-shift``, new rows empty.

    A cache without ``prompt_length`` (a position-aligned model's grid, from each row's first token)
    keeps none; any other gets the rows' own prompt ends."""
    return move_cache(cache, state.key_valid, state.gstart, shift, list(range(old_rows)))


def move_cache(cache: DiffusionKVCache, key_valid, prompt_length, shift: int, rows) -> DiffusionKVCache:
    """A cache over ``key_valid`` (``[new rows, width]``) whose row ``rows[i]`` holds old row ``i``'s K/V,
    moved by ``-shift``; the other rows are empty (LoPA's branch-major slots use it per branch group)."""
    if cache.extra:
        raise ValueError("rows cannot join a cache that carries decoder side data")
    k0 = cache.keys[0]
    new = DiffusionKVCache.allocate(num_layers=len(cache.keys), num_kv_heads=k0.shape[1], head_dim=k0.shape[3],
                                    key_valid=key_valid, dtype=k0.dtype,
                                    prompt_length=None if cache.prompt_length is None else prompt_length.clone(),
                                    device=k0.device)
    width = key_valid.shape[1]
    lo, hi = max(shift, 0), min(cache.capacity, shift + width)
    if hi > lo and len(rows):
        dst = torch.as_tensor(rows, dtype=torch.long, device=k0.device)
        src = slice(0, len(rows))
        for layer in range(len(cache.keys)):
            new.keys[layer][dst, :, lo - shift : hi - shift] = cache.keys[layer][src, :, lo:hi]
            new.values[layer][dst, :, lo - shift : hi - shift] = cache.values[layer][src, :, lo:hi]
    new.length = max(0, cache.length - shift)
    return new
