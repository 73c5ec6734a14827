"""Continuous batching: rows that join a running decoding loop.

A :class:`~dllm.decoding.streaming.BatchStreamer` with ``joins_rows = True`` may hand new prompts to a
running ``generate`` call (``admit_rows``). The loops that support it poll it at their join points
(with ``joins_rows`` False they run exactly as without a streamer's joins):

* semi-AR (``vanilla``, ``threshold``, ``factor``, Dream's ``entropy``/``margin``/``maskgit_plus``;
  caches ``none``/``prefix``/``dual`` and the exact block cache of block-causal models): at every
  block boundary. A new row's prompt is placed so that it *ends* at the current block start, so
  its generated blocks coincide with the batch's block grid.
* D2F pipeline (block-causal models): before every forward. Rows keep their own block grids, so a
  new row's prompt ends where the batch's forward window starts (the oldest uncached slot). With
  ``BatchStreamer.join_max_spread_blocks`` set, only while the live rows' windows span at most
  that many blocks from there (:func:`may_join`): rows that are far apart make every forward
  cover the union of their windows.

Every row owns a slot range of the canvas (:meth:`dllm.decoding.state.DecodeState.admit`): slots outside
it are invalid for the row (``key_valid``), RoPE positions count its valid slots only, and
block-causal masks use its own prompt end (a per-row ``prompt_length``). Attention never crosses
rows, so at temperature 0 a joined row commits the same tokens, in the same forwards, as when it
runs alone. How its prompt's K/V get computed:

* no cache: every forward covers the whole canvas;
* ``prefix``/``dual``: the full refresh that starts every block;
* exact block cache and D2F: the next forward is fed from the new prompt's first slot (the K/V of
  the other rows' final blocks are recomputed from the same tokens: exact under the block-causal
  mask). That forward is the new row's first one, as it is when the row runs alone (prompt and
  first block together), so forward counts match too.

Joining re-lays out the canvas and the cache (a copy, once per join): slots no live row uses any
more are dropped on the left, so a long-running call does not grow without bound.

Not supported (the streamer is never polled): LoPA, d3LLM, classifier-free guidance.
"""

from __future__ import annotations

from dllm.modeling.kv_cache import DiffusionKVCache

SEMI_AR_STRATEGIES = ("vanilla", "threshold", "factor", "entropy", "margin", "maskgit_plus")


def supports_joining(model, cfg) -> bool:
    """Whether ``generate`` with this model and config polls ``BatchStreamer.admit_rows``."""
    if cfg.cfg_scale > 0:
        return False
    if cfg.strategy == "d2f":
        return bool(model.is_block_causal)
    return cfg.strategy in SEMI_AR_STRATEGIES


def joining_enabled(streamer, model, cfg) -> bool:
    """Whether a loop runs in joining mode: the streamer admits rows and the strategy supports it."""
    return streamer is not None and bool(getattr(streamer, "joins_rows", False)) and supports_joining(model, cfg)


def may_join(streamer, *, place_at: int, window_end: int, live: int, block: int) -> bool:
    """Whether a D2F call polls for new rows now (see ``BatchStreamer.join_max_spread_blocks``).

    ``place_at`` is where a new prompt would end (the slowest live row's first uncached slot) and
    ``window_end`` the furthest live row's end: every forward after the join spans at least that
    range, for every row, until the rows ahead finish.
    """
    bound = getattr(streamer, "join_max_spread_blocks", None)
    return live == 0 or bound is None or window_end - place_at <= bound * block


def poll(state, *, place_at: int, runner, cache: DiffusionKVCache | None):
    """Ask the streamer for new rows; add them with their prompts ending at slot ``place_at``.

    Returns ``(number of new rows, slot shift, cache)``: every slot index the caller holds moves by
    ``-shift``; the runner is updated in place and the cache is replaced (rows and slots re-laid
    out). ``(0, 0, cache)`` when nothing joined.
    """
    streamer = state.batch_streamer
    if streamer is None:
        return 0, 0, cache
    prompts = streamer.admit_rows(state.num_rows, state.live)
    if not prompts:
        return 0, 0, cache
    prompts = [[int(t) for t in p] for p in prompts]
    for p in prompts:
        if not p:
            raise ValueError("admit_rows returned an empty prompt")
        if state.mask_id in p:
            raise ValueError(f"an admitted prompt contains the mask token id {state.mask_id}")
    old_live = state.live
    shift = state.admit(prompts, place_at)
    runner.key_valid = state.key_valid
    runner.prompt_length = state.gstart.clone()
    if cache is not None:
        cache = relayout_cache(cache, state, shift, old_live)
    return len(prompts), shift, cache


def relayout_cache(cache: DiffusionKVCache, state, shift: int, old_rows: int) -> DiffusionKVCache:
    """A cache for the re-laid-out canvas: the old rows' K/V moved by ``-shift``, new rows empty."""
    if cache.extra:
        raise ValueError("rows cannot join a cache that carries decoder side data")
    k0 = cache.keys[0]
    new = DiffusionKVCache.allocate(num_layers=len(cache.keys), num_kv_heads=k0.shape[1], head_dim=k0.shape[3],
                                    key_valid=state.key_valid, prompt_length=state.gstart.clone(), dtype=k0.dtype,
                                    device=k0.device)
    width = state.x.shape[1]
    lo, hi = max(shift, 0), min(cache.capacity, shift + width)
    if hi > lo:
        for layer in range(len(cache.keys)):
            new.keys[layer][:old_rows, :, lo - shift : hi - shift] = cache.keys[layer][:, :, lo:hi]
            new.values[layer][:old_rows, :, lo - shift : hi - shift] = cache.values[layer][:, :, lo:hi]
    new.length = max(0, cache.length - shift)
    return new
