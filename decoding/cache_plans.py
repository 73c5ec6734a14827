"""Cache plans of the semi-AR loop: which forward step ``i`` of a block runs, and the KV cache it keeps.

* :class:`Recompute` (``cache="none"``, bidirectional): the whole canvas every step (LLaDA ``generate.py``;
  Fast-dLLM ``generate``).
* :class:`Guided`: classifier-free guidance, the canvas with and without the prompt in one batched forward.
* :class:`ExactBlocks` (``cache="none"`` on a block-causal model): finished blocks are cached exactly, since
  their K/V depend only on the prefix, and a step feeds the current block, plus whatever the cache lacks.
* :class:`PrefixCache`: a full forward at block start (doubling as step 0) whose K/V are kept for the prefix
  only; later steps feed the block **and the whole suffix** against that frozen prefix.
* :class:`DualCache`: the same refresh keeps the whole canvas' K/V; later steps feed only the block, whose
  fresh K/V replace the stale ones in place.

``refresh_interval`` makes the prefix and dual plans recompute everything every N steps inside a block.
Rows that joined in the middle of a block count their own steps (``i`` is then a tensor, one step per
row): a row refreshes at its own step 0, and one forward serves rows that refresh and rows that do not,
the cache keeping for the latter what they would not feed alone
(:meth:`~dllm.modeling.kv_cache.DiffusionKVCache.keeping`).
``dual_cache_step_bound`` reproduces upstream Fast-dLLM's dual-cache loop cap ``range(1, steps_per_block)``
and, with it, upstream's block-start refresh filling masks that earlier blocks left behind
(:meth:`DualCache.first_slot`).
"""

from __future__ import annotations

import torch

from .runner import ModelRunner


class CachePlan:
    #: A row may join in the middle of a block and decode as alone: the plan's forwards are exact for every
    #: row whenever it arrived (no cache, the exact block cache), or each row refreshes on its own steps (the
    #: prefix and dual caches; not with ``dual_cache_step_bound``, whose loop cap is the batch's).
    joins_mid_block = False

    def __init__(self, model, cfg, state, runner: ModelRunner) -> None:
        self.cfg = cfg
        self.runner = runner
        self.cache = None
        self.block_kw = {"block_size": cfg.block_size} if model.is_block_causal else {}

    def first_slot(self, state, s: int, i: int) -> int:
        """The first slot step ``i`` may fill (the block start, unless a plan sweeps earlier masks)."""
        return s

    def forward(self, state, lo: int, s: int, e: int, i: int) -> torch.Tensor:
        """Logits [live, e - lo] of slots [lo, e) for step ``i`` of block [s, e)."""
        raise NotImplementedError

    def block_over(self, i: int) -> bool:
        """Whether the plan ends the block before step ``i`` (a reference's loop bound)."""
        return False

    def keep_rows(self, keep: torch.Tensor) -> None:
        if self.cache is not None:
            self.cache = self.cache.select_rows(keep)

    def joined(self, shift: int, first_new_slot: int) -> None:
        """Rows joined: slot ``s`` is now ``s - shift``; the new rows' prompts start at ``first_new_slot``."""

    def _refresh(self, i):
        """Whether step ``i`` refreshes. ``i`` may be a tensor of the rows' own steps: then a bool where the
        rows agree, else a bool tensor, one per row."""
        every = self.cfg.refresh_interval
        if not torch.is_tensor(i):
            return i == 0 or bool(every and i % every == 0)
        refresh = (i == 0) | ((i % every) == 0) if every else i == 0
        return True if bool(refresh.all()) else False if not bool(refresh.any()) else refresh


class Recompute(CachePlan):
    joins_mid_block = True

    def forward(self, state, lo, s, e, i):
        return self.runner.full(state.x, logits_from=s, **self.block_kw)[:, : e - s]


class Guided(CachePlan):
    """Classifier-free guidance: the un-prompted canvas has its prompt slots masked; one batched forward."""

    def __init__(self, model, cfg, state, runner) -> None:
        super().__init__(model, cfg, state, runner)
        P = state.P
        self.prompt_slots = (state.x[:, :P] != state.mask_id) & state.key_valid[:, :P]

    def forward(self, state, lo, s, e, i):
        un = state.x.clone()
        un[:, : state.P][self.prompt_slots] = state.mask_id
        both = torch.cat([state.x, un], 0)
        runner = self.runner
        kv = runner.key_valid
        runner.key_valid = torch.cat([kv, kv], 0)
        logits = runner.full(both, logits_from=s)[:, : e - s]
        runner.key_valid = kv
        cond, uncond = logits.chunk(2, 0)
        return uncond + (self.cfg.cfg_scale + 1.0) * (cond - uncond)

    def keep_rows(self, keep):
        self.prompt_slots = self.prompt_slots[keep]


class ExactBlocks(CachePlan):
    joins_mid_block = True

    def __init__(self, model, cfg, state, runner) -> None:
        super().__init__(model, cfg, state, runner)
        self.cache = model.allocate_cache(state.key_valid, prompt_length=state.P)
        self.cached_end = 0

    def forward(self, state, lo, s, e, i):
        logits = self.runner.cached(state.x, start=self.cached_end, end=e, cache=self.cache, mode="prefix",
                                    **self.block_kw)
        logits = logits[:, s - self.cached_end:]
        self.cached_end = s  # everything before the block is final: its K/V from this forward are exact
        return logits

    def joined(self, shift, first_new_slot):
        self.cached_end = min(max(0, self.cached_end - shift), first_new_slot)  # feed the new prompts


class PrefixCache(CachePlan):
    joins_mid_block = True

    def __init__(self, model, cfg, state, runner) -> None:
        super().__init__(model, cfg, state, runner)
        self.cache = model.allocate_cache(state.key_valid, prompt_length=state.P)

    def forward(self, state, lo, s, e, i):
        refresh = self._refresh(i)
        if torch.is_tensor(refresh):  # rows that do not refresh keep their frozen prefix
            keep = ~refresh[:, None] & (torch.arange(self.cache.capacity, device=state.x.device) < s)[None, :]
            with self.cache.keeping(keep):
                logits = self.runner.full(state.x, logits_from=s, cache=self.cache, **self.block_kw)[:, : e - s]
            self.cache.length = s
            return logits
        if refresh:
            logits = self.runner.full(state.x, logits_from=s, cache=self.cache, **self.block_kw)[:, : e - s]
            self.cache.length = s  # keep the prefix only; the suffix is recomputed every step
            return logits
        return self.runner.cached(state.x, start=s, end=state.x.shape[1], cache=self.cache, mode="prefix",
                                  logits_end=e, **self.block_kw)


class DualCache(CachePlan):
    def __init__(self, model, cfg, state, runner) -> None:
        super().__init__(model, cfg, state, runner)
        self.cache = model.allocate_cache(state.key_valid, prompt_length=state.P)
        self.steps = cfg.steps_per_block()
        self.joins_mid_block = not cfg.dual_cache_step_bound

    def first_slot(self, state, s, i):
        """With ``dual_cache_step_bound`` a block can end with masks left; upstream's next refresh forward
        takes every masked slot before the block end as a candidate (``mask_index = x == mask_id;
        mask_index[:, e:] = False``), so such masks can be filled there, the refresh's at-least-one
        token included. Slots before a row's generated region hold its prompt or padding, never a mask."""
        if self.cfg.dual_cache_step_bound and i == 0:
            return state.P if state.gstart is None else int(state.gstart.min())
        return s

    def forward(self, state, lo, s, e, i):
        refresh = self._refresh(i)
        if torch.is_tensor(refresh):  # rows that do not refresh keep their stale canvas outside the block
            slots = torch.arange(self.cache.capacity, device=state.x.device)[None, :]
            keep = ~refresh[:, None] & ((slots < s) | (slots >= e))
            with self.cache.keeping(keep):
                return self.runner.full(state.x, logits_from=lo, cache=self.cache, **self.block_kw)[:, : e - lo]
        if refresh:
            return self.runner.full(state.x, logits_from=lo, cache=self.cache, **self.block_kw)[:, : e - lo]
        return self.runner.cached(state.x, start=s, end=e, cache=self.cache, mode="replace", **self.block_kw)

    def block_over(self, i):
        return bool(self.cfg.dual_cache_step_bound) and i >= self.steps


def plan_for(model, cfg) -> type[CachePlan]:
    if cfg.cfg_scale > 0:
        return Guided
    if cfg.cache == "prefix":
        return PrefixCache
    if cfg.cache == "dual":
        return DualCache
    return ExactBlocks if model.is_block_causal else Recompute
