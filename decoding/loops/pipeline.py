"""Pipelined multi-block decoding: D2F (block-causal, exact cache) and d3LLM (entropy, no cache).

Each row keeps a list of blocks: the prompt (block 0) and generated blocks appended one at a time.
A block is *semi-activated* (may fill nothing) until its predecessor's decoded ratio reaches
``decoded_token_threshold`` (tau_act), then *fully activated* (fills at least its best token).
A new block is appended when the last block's ratio reaches ``block_add_threshold`` (tau_add) and
no EOS has been committed. One forward per step covers every active block.

D2F (block-causal model): finished blocks are cached in order (a block retires to ``to_cache``
only when every earlier block is done) and their K/V are appended to the cache by the next forward,
which computes them from their final tokens: exact, because under the block-causal mask a block's
K/V depend only on the prefix. The input of every forward starts at the cache end.
Commit rule: conf > skip_threshold (strict, on the max probability); a fully activated block with
no such position fills its single best one, ranked by ``d2f_confidence`` (the D2F-eval reference's
``sampling_strategy``: ``prob`` = "default", ``neg_entropy``, ``margin`` = "margin_confidence").

d3LLM (any model, no cache): same pipeline, full forward over the prompt and the appended blocks;
commit masked positions with entropy <= entropy_threshold; the lowest-entropy position is always
committed, and the first fully activated block commits its lowest-entropy position if it got none.

Batches: rows advance independently. The forward covers the union of the rows' windows; slots a
row has not appended yet are invisible to it (block-causal mask, or key-padding for d3LLM), so a
row's decisions equal its single-row run.

The strategy's rule (:class:`D2FRule`, :class:`EntropyRule`) chooses tokens and fills blocks; the
window plan (:class:`ExactWindow`, :class:`FullWindow`, :class:`DelayedWindow`) decides what each forward
feeds and caches. The loop yields after every forward.

Rows may join a running D2F batch before any forward (``DecodeSession.add_rows``; see
``dllm.decoding.joining``): a new row's prompt block is fed by the next forward together with its first
block, as in its single-row run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.decoding.joining import may_join, poll
from dllm.decoding.policies import select_above, select_best
from dllm.decoding.runner import LogitRules, ModelRunner
from dllm.decoding.sampling import entropy, llada_choice, llada_token, ranking_confidence
from dllm.decoding.state import DecodeState

ACTIVE, TO_CACHE, IN_CACHE = "active", "to_cache", "in_cache"


@dataclass
class Block:
    start: int
    end: int
    state: str
    complete: bool  # fully activated
    done_at: int | None = None  # forwards so far when its last mask was filled (d3LLM's delayed cache)


class RowPlan:
    """Block bookkeeping of one row."""

    def __init__(self, prompt_length: int, prompt_start: int = 0) -> None:
        self.blocks = [Block(prompt_start, prompt_length, TO_CACHE, True)]
        self.eos = False
        self.forwards = 0  # forwards this row has taken (a joined row counts from its own first)
        self.cache_end: int | None = None  # d3LLM's delayed cache: slots [0, cache_end) hold its stable K/V

    @property
    def generated_blocks(self) -> int:
        return len(self.blocks) - 1

    @property
    def end(self) -> int:
        return self.blocks[-1].end

    def cached_end(self) -> int:
        end = 0
        for b in self.blocks:
            if b.state != IN_CACHE:
                break
            end = b.end
        return end

    def feed_start(self) -> int:
        for b in self.blocks:
            if b.state != IN_CACHE:
                return b.start
        return self.end

    def active(self) -> list[Block]:
        return [b for b in self.blocks if b.state == ACTIVE]

    def shift(self, d: int) -> None:
        """The canvas was re-laid out: slot s is now s - d."""
        for b in self.blocks:
            b.start -= d
            b.end -= d
        if self.cache_end is not None:
            self.cache_end -= d

    def copy(self) -> RowPlan:
        new = RowPlan.__new__(RowPlan)
        new.blocks = [Block(b.start, b.end, b.state, b.complete, b.done_at) for b in self.blocks]
        new.eos = self.eos
        new.forwards, new.cache_end = self.forwards, self.cache_end
        return new

    def append_and_activate(self, x_row: torch.Tensor, cfg, mask_id: int, tau_add: float | None = None,
                            tau_act: float | None = None) -> None:
        """D2F steps 1-2: append a block once the last one is decoded to tau_add; activate at tau_act
        (the row's own values where given, else the config's)."""
        tau_add = cfg.block_add_threshold if tau_add is None else tau_add
        tau_act = cfg.decoded_token_threshold if tau_act is None else tau_act
        last = self.blocks[-1]
        if (self.generated_blocks < cfg.num_blocks and not self.eos
                and decoded_ratio(x_row, last, mask_id, len(self.blocks) == 1) >= tau_add):
            self.blocks.append(Block(last.end, last.end + cfg.block_size, ACTIVE, False))
        for i in range(len(self.blocks) - 1):
            if decoded_ratio(x_row, self.blocks[i], mask_id, i == 0) >= tau_act:
                self.blocks[i + 1].complete = True

    def mark_done(self, x_row: torch.Tensor, mask_id: int, step: int) -> None:
        for b in self.blocks[1:]:
            if b.done_at is None and not bool((x_row[b.start : b.end] == mask_id).any()):
                b.done_at = step

    def stable_end(self, step: int, delay: int) -> int:
        """End of the leading blocks that have been fully decoded for at least ``delay`` forwards."""
        end = self.blocks[0].end
        for b in self.blocks[1:]:
            if b.done_at is None or step - b.done_at < delay:
                break
            end = b.end
        return end

    def stabilizing(self, step: int, delay: int) -> bool:
        return any(b.done_at is not None and step - b.done_at < delay for b in self.blocks[1:])

    def retire_finished(self, x_row: torch.Tensor, mask_id: int) -> None:
        """D2F step 7: a fully decoded block goes to the cache only when no earlier block is active."""
        earlier_active = False
        for b in self.blocks[1:]:
            if b.state == ACTIVE and not earlier_active and not bool((x_row[b.start : b.end] == mask_id).any()):
                b.state = TO_CACHE
            earlier_active = earlier_active or b.state == ACTIVE


def per_row(state, name: str) -> list[float]:
    """One value of option ``name`` per live row (the rows' own values, else the config's)."""
    value = state.option(name)
    return value[:, 0].tolist() if torch.is_tensor(value) else [value] * state.live


def decoded_ratio(x_row: torch.Tensor, block: Block, mask_id: int, prompt_block: bool) -> float:
    if prompt_block:
        return 1.0
    span = x_row[block.start : block.end]
    return float((span != mask_id).sum()) / max(1, block.end - block.start)


def d2f_fill(conf: torch.Tensor, rank: torch.Tensor, candidates: torch.Tensor, tau: float, complete: bool) -> torch.Tensor:
    """D2F's rule for one block: candidates with probability ``conf > tau``; a fully activated block
    that gets none fills its single best candidate by ``rank`` (the references rank this fallback by
    their ``sampling_strategy`` while the threshold always tests the probability)."""
    take = select_above(conf, candidates, tau)
    if complete:  # decided on the device: no host synchronisation per block
        take = torch.where(take.any(-1, keepdim=True), take, select_best(rank, candidates))
    return take


class D2FRule:
    """D2F: per active block, slots with probability > ``skip_threshold`` (per row); a fully activated block
    with none fills its best one, ranked by ``d2f_confidence``."""

    def __init__(self, cfg, state) -> None:
        self.cfg, self.state = cfg, state

    def choose(self, logits, gen):
        cfg = self.cfg
        temperature = self.state.temperature()
        x0, conf = llada_choice(logits, temperature=temperature, remasking="low_confidence", generator=gen,
                                top_p=cfg.top_p, top_k=cfg.top_k)
        self.conf = conf
        self.rank = ranking_confidence(cfg.d2f_confidence, logits, conf, temperature=temperature,
                                       top_p=cfg.top_p, top_k=cfg.top_k)
        self.taus = per_row(self.state, "skip_threshold")  # once per step, not once per row
        return x0

    def fill_row(self, r: int, plan: RowPlan, start: int, candidates: torch.Tensor) -> torch.Tensor:
        tau = self.taus[r]
        take = torch.zeros_like(candidates[r])
        for b in plan.active():
            s, e = b.start - start, b.end - start
            take[s:e] |= d2f_fill(self.conf[r: r + 1, s:e], self.rank[r: r + 1, s:e], candidates[r: r + 1, s:e],
                                  tau, b.complete)[0]
        return take


class EntropyRule:
    """d3LLM: slots with entropy <= ``entropy_threshold``; the first fully activated block commits its
    lowest-entropy slot if it got none, and each row always commits its lowest-entropy slot."""

    def __init__(self, cfg, state) -> None:
        self.cfg = cfg

    def choose(self, logits, gen):
        cfg = self.cfg  # d3LLM decides by entropy only: no confidence needed
        self.ent = entropy(logits)
        return llada_token(logits, temperature=cfg.temperature, generator=gen, top_p=cfg.top_p, top_k=cfg.top_k)

    def fill_row(self, r, plan, start, candidates):
        ent, take = self.ent, torch.zeros_like(candidates[r])
        forced_first = False
        row_any = torch.zeros_like(candidates[r])
        for b in plan.active():
            s, e = b.start - start, b.end - start
            cand = candidates[r: r + 1, s:e]
            got = cand & (ent[r: r + 1, s:e] <= self.cfg.entropy_threshold)
            if b.complete and not forced_first and not bool(got.any()):
                got = select_best(-ent[r: r + 1, s:e], cand)
            forced_first = forced_first or b.complete
            take[s:e] |= got[0]
            row_any[s:e] |= cand[0]
        if bool(row_any.any()):  # the lowest-entropy position is always decoded
            take |= select_best(-ent[r: r + 1], row_any[None])[0]
        return take


class ExactWindow:
    """D2F on a block-causal model: finished blocks cached in order; every forward starts at the cache end."""

    joins_rows = True

    def __init__(self, model, cfg, state, runner) -> None:
        self.runner, self.block = runner, cfg.block_size
        self.cache = model.allocate_cache(state.key_valid, prompt_length=state.P)

    def start(self, plans) -> int:
        return min(p.feed_start() for p in plans)

    def forward(self, state, plans, start, end, steps):
        self.cache.length = start
        return self.runner.cached(state.x, start=start, end=end, cache=self.cache, mode="prefix", block_size=self.block)


class FullWindow:
    """d3LLM without a cache: a full forward over each row's prompt and appended blocks. Nothing is cached,
    so a row may join before any forward: its prompt and blocks are its own slots of the canvas."""

    joins_rows = True
    cache = None

    def __init__(self, model, cfg, state, runner) -> None:
        self.runner, self.cfg = runner, cfg

    def start(self, plans) -> int:  # logits are needed from the first active block on
        return min(p.active()[0].start for p in plans)

    def key_valid(self, state, plans):
        key_valid = state.key_valid.clone()
        for r, p in enumerate(plans):
            key_valid[r, p.end:] = False  # blocks a row has not appended are not part of its canvas
        return key_valid

    def forward(self, state, plans, start, end, steps):
        return self.runner.full(state.x[:, :end], logits_from=start, key_valid=self.key_valid(state, plans))


class DelayedWindow(FullWindow):
    """d3LLM with a cache: a finished block is cached ``cache_delay`` forwards after its last token, and a full
    forward refreshes everything while blocks stabilise or every ``refresh_interval`` forwards. Each row
    decides for itself (its own forwards, its own stable prefix ``RowPlan.cache_end``), as it would alone:
    one batched forward starts at the earliest slot any row feeds, and the cache keeps, for each row that
    does not refresh, its stable prefix (:meth:`~dllm.modeling.kv_cache.DiffusionKVCache.keeping`). So a row
    decodes as alone, and rows may join (with no cache yet, a joined row's first forward refreshes)."""

    joins_rows = True

    def __init__(self, model, cfg, state, runner) -> None:
        super().__init__(model, cfg, state, runner)
        self.cache = model.allocate_cache(state.key_valid, prompt_length=state.P)

    def refreshes(self, p: RowPlan) -> bool:
        cfg = self.cfg
        return (p.cache_end is None or p.stabilizing(p.forwards, cfg.cache_delay)
                or bool(cfg.refresh_interval and p.forwards % cfg.refresh_interval == 0))

    def forward(self, state, plans, start, end, steps):
        cfg, cache = self.cfg, self.cache
        cache.key_valid = self.key_valid(state, plans)  # the same per-row canvas view for cached forwards
        refresh = [self.refreshes(p) for p in plans]
        if all(refresh):
            logits = self.runner.full(state.x[:, :end], logits_from=start, cache=cache)
        else:  # from the earliest slot a row feeds; the others keep their stable prefixes
            c = min(0 if r else p.cache_end for r, p in zip(refresh, plans))
            ends = torch.tensor([0 if r else p.cache_end for r, p in zip(refresh, plans)], device=state.x.device)
            keep = torch.arange(cache.capacity, device=state.x.device)[None, :] < ends[:, None]
            with cache.keeping(keep if bool(keep[:, c:end].any()) else None):
                logits = self.runner.cached(state.x, start=c, end=end, cache=cache, mode="prefix")[:, start - c:]
        for r, p in zip(refresh, plans):
            if r:
                p.cache_end = p.stable_end(p.forwards, cfg.cache_delay)
        return logits


def window_for(model, cfg, rule: type):
    if rule is D2FRule:
        return ExactWindow
    return FullWindow if cfg.cache == "none" else DelayedWindow


def decode_pipeline(model, state: DecodeState, gen: torch.Generator | None):
    cfg = state.cfg
    B, mask_id = cfg.block_size, state.mask_id
    runner = ModelRunner(model, prompt_length=state.P, key_valid=state.key_valid,
                         rules=LogitRules.from_config(cfg, state.mask_id, state.eos))
    rule = state.strategy.policy(cfg, state)
    window = window_for(model, cfg, state.strategy.policy)(model, cfg, state, runner)
    plans = [RowPlan(state.P) for _ in range(state.live)]
    steps = 0
    join = state.joining and window.joins_rows

    x_host = None  # the plans' host copy of the canvas, carried from one step's end to the next step

    def keep_rows(keep):
        nonlocal plans, x_host
        if keep is not None:
            kept = keep.tolist()
            plans = [plans[i] for i in kept]
            x_host = x_host[kept] if x_host is not None else None
            runner.select_rows(keep)
            if window.cache is not None:
                window.cache = window.cache.select_rows(keep)

    while True:
        if join:  # before every forward new rows may join, their prompts ending where the window starts
            place = min((p.feed_start() for p in plans), default=0)
            window_end = max((p.end for p in plans), default=place)
            if may_join(state, place_at=place, window_end=window_end, block=B):
                joined, shift, window.cache = poll(state, place_at=place, runner=runner, cache=window.cache)
                if joined:
                    x_host = None  # the canvas was re-laid out
                    for p in plans:
                        p.shift(shift)
                    first, _ = state.row_spans()
                    plans += [RowPlan(int(state.gstart[r]), int(first[r])) for r in range(state.live - joined, state.live)]
        if not state.live:
            break
        # 1-2: append and activate, per row (with its own tau_add / tau_act where rows set them)
        # (the plans read a host copy of the canvas: one transfer per step instead of a synchronisation per
        # row and block on a GPU; the copy made after the last commit serves, unless rows joined)
        taus = zip(per_row(state, "block_add_threshold"), per_row(state, "decoded_token_threshold"))
        if x_host is None:
            x_host = state.x.cpu()
        for r, (plan, (tau_add, tau_act)) in enumerate(zip(plans, taus)):
            plan.append_and_activate(x_host[r], cfg, mask_id, tau_add, tau_act)
        # 3: rows with nothing left to decode are finished
        finished = [not p.active() for p in plans]
        if any(finished):
            keep_rows(state.retire(torch.tensor(finished, device=state.x.device), reason="length"))
            if not state.live:
                if join and state.incoming:
                    continue  # waiting rows join now
                break
        # 4-5: one forward over the union of the rows' windows
        start, end = window.start(plans), max(p.end for p in plans)
        logits = window.forward(state, plans, start, end, steps)
        steps += 1
        state.count_forward()
        for p in plans:
            p.forwards += 1
            for b in p.blocks:
                if b.state == TO_CACHE:
                    b.state = IN_CACHE  # its K/V were written by this forward, from final tokens
        # 6: decode every active block
        x0 = rule.choose(logits, gen)
        candidates = state.x[:, start:end] == mask_id
        transfer = torch.stack([rule.fill_row(r, p, start, candidates) for r, p in enumerate(plans)])
        was_masked = x_host[:, start:end] == mask_id  # before the commit (on a CPU, x_host is state.x itself)
        state.commit(start, transfer, x0)
        x_host = state.x.cpu()
        if state.eos:  # committed this step: masked before, a token now (read on the host copy)
            committed_eos = (state.eos.match(x_host[:, start:end]) & was_masked).any(-1).tolist()
            for p, hit in zip(plans, committed_eos):
                if hit:
                    p.eos = True
        # 7: retire finished blocks in order
        for r, p in enumerate(plans):
            p.mark_done(x_host[r], mask_id, p.forwards)
            p.retire_finished(x_host[r], mask_id)
        keep_rows(state.pop_finished())
        yield
    return {"forward_seconds": runner.forward_seconds, "forwards": runner.forwards, "steps": steps}
