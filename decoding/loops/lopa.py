"""LoPA: lookahead parallel decoding. Several token-filling orders are tried in one forward per round.

Every round, each row has an **anchor** branch (the base rule's fill) and up to ``k =
lopa_branches`` **lookahead** branches. Each lookahead branch is the anchor plus **one** extra token.
That token goes at one of the k most confident masked positions still left after the anchor fill.
The positions must lie in active blocks, and the token is the argmax at T=0. All ``k + 1``
branches of every row go through **one** batched forward. A branch's score is the mean confidence
over its remaining masked positions. The highest-scoring branch wins. Its canvas becomes the row's
canvas, and its logits (from the same forward) drive the next anchor fill and the next lookahead
positions. So a round costs exactly one forward, and TPF counts rounds.

Base rules:

* block-causal model: the D2F pipeline (``dllm.decoding.loops.pipeline``), with the same tau_add,
  tau_act and tau_conf semantics and the exact block KV cache;
* bidirectional model: semi-AR ``threshold`` decoding (``dllm.decoding.loops.semi_ar``) with the
  configured cache (``dual`` is the reference setting; ``prefix`` and ``none`` also work).

Conventions:

* Branch count: ``lopa_branches = k`` counts lookahead branches only, so a round has ``k + 1``
  branches (the convention of the single-device reference ``scale_dream_d2f``). ``k = 0`` is
  plain D2F / threshold decoding.
* Branch ids: 0 is the anchor, and ``j = 1..k`` is the lookahead at the j-th most confident
  position (position ties go to the lower slot index). ``output.stats["lopa_winners"][row]`` lists
  the winning id of every round the row took part in.
* Tie-break: branches are ranked in the order ``1, 2, .., k, 0``, and the first maximum wins.
  Equal scores go to the lowest-id lookahead, and the anchor wins only when it is strictly better.
  This is the reference's order (lookaheads listed before the anchor, stable descending sort).
* Score (reference Eq. 2 and its variants): ``alpha * c_create + (1 - alpha) * mean of the
  lowest max(1, floor(rho * n)) confidences`` over the branch's n remaining masked positions.
  Confidence (``lopa_confidence``) is the max probability, the negative entropy sum p log p or the
  top-1 minus top-2 margin; it also ranks the lookahead positions. ``c_create`` is the confidence
  of the branch's extra token, and the certain value (1.0, or 0.0 for negative entropy) for the
  anchor. A branch with no masked position left has the certain value as its mean (its future is
  certain). Defaults are ``alpha = 0``, ``rho = 1``: the plain mean of the paper and of every
  shipped reference script. Scored positions:
  block-causal: every masked position of the branch's own blocks in the forward window,
  including a block the branch appended this round;
  bidirectional: the current block's masked positions.
* Anchor fill (block-causal): the D2F rule, its top-1 fallback ranked by ``d2f_confidence``
  as in ``d2f``, so ``k = 0`` equals ``d2f`` for any ``lopa_confidence``. The reference
  (``scale_dream_d2f``) ranks the fallback, the lookaheads and the branch scores with one
  ``sampling_strategy``: its ``neg_entropy`` setting is ``d2f_confidence = lopa_confidence =
  "neg_entropy"``. Thresholds always test the max probability.
* Block states (to_cache) change only through the anchor fill on the winner. A block completed
  by a lookahead token retires at the end of the round in which that branch won.

Batch and cache layout: branches are stored **branch-major**. Slot ``j * R + r`` is branch j of
live row r. Branch groups without a lookahead for some row (fewer than k masked positions were
left) are padded with a copy of the anchor. Padding slots are computed but never scored (score
``-inf``). When no row has a lookahead (the first round, a bidirectional block start, the tail of
a generation), only the anchor group is forwarded. Its K/V are then copied into the other
groups. Each slot owns one row of a :class:`DiffusionKVCache` for the whole generation, so
nothing is copied when the winner changes:

* block-causal: the cache holds the prompt plus finished blocks, and it is the same in every
  branch of a row. Lookahead tokens sit only in active blocks, and under the block-causal mask
  the K/V of a block depend only on the prefix. The blocks a forward caches therefore get the
  same K/V in every branch, and "committing the winner's cache" is a no-op. This is checked every
  round that caches blocks: per slot, a digest of the newly cached K/V must match the winner's;
* bidirectional: slots outside the fed span come only from the block-start refresh, which has no
  lookaheads, so they are identical in every branch. The fed span is rewritten before it is read
  in every forward, so again nothing needs committing. ``refresh_interval`` would refresh in the
  middle of a block while branches differ, so it is rejected.

Branch parallelism (``dllm.decoding.branch_parallel``) spreads the branch groups over processes. Each
process owns the cache rows of its groups, and the same no-op argument holds across processes.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field

import torch

from dllm.decoding.errors import GenerationConfigError
from dllm.decoding.loops.pipeline import IN_CACHE, TO_CACHE, RowPlan, d2f_fill
from dllm.decoding.policies import select_threshold
from dllm.decoding.runner import LogitRules, ModelRunner
from dllm.decoding.sampling import llada_choice, ranking_confidence
from dllm.decoding.state import DecodeState
from dllm.modeling.kv_cache import DiffusionKVCache

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------- pure pieces
def branch_scores(conf: torch.Tensor, score_mask: torch.Tensor, creation: torch.Tensor, alpha: float,
                  rho: float, certain: float = 1.0) -> torch.Tensor:
    """Score of each branch [n] from its per-position confidences [n, W] and scored positions [n, W].

    ``alpha * creation + (1 - alpha) * mean(lowest max(1, floor(rho * m)) confidences)``. ``m``
    is the number of scored positions, and the mean is ``certain`` (the confidence of a sure
    position: 1.0 for probabilities, 0.0 for negative entropy) when ``m = 0``.
    """
    c = conf.double()
    m = score_mask.sum(-1)
    if rho >= 1.0:
        total = torch.where(score_mask, c, torch.zeros_like(c)).sum(-1)
        cnt = m
    else:
        srt = torch.where(score_mask, c, torch.full_like(c, float("inf"))).sort(-1).values
        cnt = torch.floor(m.double() * rho).long().clamp(min=1)
        cnt = torch.where(m == 0, torch.zeros_like(cnt), cnt)
        take = torch.arange(c.shape[-1], device=c.device)[None] < cnt[:, None]
        total = torch.where(take, srt, torch.zeros_like(srt)).sum(-1)
    future = torch.where(m > 0, total / cnt.clamp(min=1).double(), torch.full_like(total, certain))
    return alpha * creation.to(future) + (1.0 - alpha) * future


def select_winners(score: torch.Tensor, rows: int, groups: int, force_anchor: bool = False) -> torch.Tensor:
    """Winning branch id per row from branch-major scores [groups * rows].

    Ranking order ``1, .., k, 0``, first maximum wins (ties: lowest lookahead id, then anchor).
    """
    if force_anchor or groups == 1:
        return torch.zeros(rows, dtype=torch.long)
    s = score.detach().double().cpu().view(groups, rows)
    order = torch.tensor(list(range(1, groups)) + [0])
    s = s[order]
    best = s.max(0).values
    rank = torch.arange(groups)[:, None].expand_as(s)
    first = torch.where(s == best[None], rank, torch.full_like(rank, groups)).min(0).values
    return order[first]


def top_lookaheads(conf: torch.Tensor, tokens: torch.Tensor, candidates: torch.Tensor, k: int) -> list[list[tuple[int, int, float]]]:
    """Per row, up to k (offset, token, confidence) at the most confident candidate offsets.

    Ties go to the lower offset.
    """
    if k <= 0:
        return [[] for _ in range(conf.shape[0])]
    c = torch.where(candidates, conf.double(), torch.full_like(conf, NEG_INF, dtype=torch.float64))
    order = torch.sort(c, dim=-1, descending=True, stable=True).indices[:, :k].cpu()
    cand, tok, cf = candidates.cpu(), tokens.cpu(), conf.double().cpu()
    out = []
    for r in range(conf.shape[0]):
        row = []
        for i in order[r].tolist():
            if not bool(cand[r, i]):
                break
            row.append((i, int(tok[r, i]), float(cf[r, i])))
        out.append(row)
    return out


def certain_confidence(kind: str) -> float:
    """The confidence of a position that is sure: max probability 1, or negative entropy 0."""
    return 0.0 if kind == "neg_entropy" else 1.0


# ----------------------------------------------------------------------------- executors
@dataclass
class RoundRequest:
    """One verification forward over every branch slot (branch-major ``[groups * rows, end]``)."""

    x: torch.Tensor  # slot canvases, columns [0, end)
    kind: str  # "prefix" | "replace" | "fill" | "full" (no cache)
    start: int  # logits of slots [start, start + width) are returned
    end: int  # input end (cached kinds feed [start, end))
    width: int
    slot_end: torch.Tensor  # [S] long: scored positions are masked slots < slot_end
    creation: torch.Tensor  # [S] float64
    valid: torch.Tensor  # [S] bool: False on padding slots (score -inf)
    dedupe: bool = False  # every slot of a row holds the same canvas: forward one group, copy
    spans: torch.Tensor | None = None  # [rows, 2]: K/V span each row's forward commits (digested)
    prefix_keep: int | None = None  # after a fill: keep only [0, prefix_keep) (semi-AR prefix cache)
    block_size: int | None = None  # attention block size override (D2F)


@dataclass
class RoundResult:
    x0: torch.Tensor  # [S, width] long: the argmax (T=0) / sampled token per position
    conf: torch.Tensor  # [S, width] float64: its probability
    score: torch.Tensor  # [S] float64
    digest: torch.Tensor | None = None  # [S, 4 * layers] float64
    rank: torch.Tensor | None = None  # [S, width] float64: the ``lopa_confidence`` ranking when it is not ``conf``
    fill: torch.Tensor | None = None  # [S, width] float64: the anchor fill's ranking when it is neither


@dataclass
class SlotSettings:
    """What a slot worker needs besides the model (shipped to every rank in branch parallelism)."""

    prompt_length: int
    mask_id: int
    use_cache: bool
    rules: LogitRules
    temperature: float
    top_p: float | None
    top_k: int | None
    remasking: str
    alpha: float
    rho: float
    confidence: str = "prob"  # RANKINGS: what scores branches and ranks lookahead positions
    fill_confidence: str = "prob"  # RANKINGS: what ranks the anchor fill's top-1 fallback (d2f_confidence)


class SlotWorker:
    """Owns ``groups`` branch groups for all live rows on one device: a runner and the slots' cache.

    The single-process executor is one worker holding every group. Under branch parallelism each
    rank runs one worker holding its share of the groups.
    """

    def __init__(self, model, *, groups: int, key_valid: torch.Tensor, settings: SlotSettings,
                 generator: torch.Generator | None = None) -> None:
        self.model = model
        self.groups = groups
        self.rows = key_valid.shape[0]
        self.s = settings
        self.generator = generator
        device = model.get_input_embeddings().weight.device
        self.device = device
        kv = key_valid.to(device).repeat(groups, 1)
        self.runner = ModelRunner(model, prompt_length=settings.prompt_length, key_valid=kv, rules=settings.rules)
        self.cache = model.allocate_cache(kv, prompt_length=settings.prompt_length) if settings.use_cache and groups else None

    @property
    def forward_seconds(self) -> float:
        return self.runner.forward_seconds

    @property
    def forwards(self) -> int:
        return self.runner.forwards

    def close(self) -> None:
        pass

    def select_rows(self, keep: torch.Tensor) -> None:
        keep = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        idx = torch.cat([keep + g * self.rows for g in range(self.groups)]) if self.groups else keep[:0]
        self.runner.select_rows(idx)
        if self.cache is not None:
            self.cache = self.cache.select_rows(idx)
        self.rows = int(keep.numel())

    def _head_view(self) -> DiffusionKVCache:
        c, r = self.cache, self.rows
        return DiffusionKVCache(keys=[k[:r] for k in c.keys], values=[v[:r] for v in c.values],
                                key_valid=c.key_valid[:r], positions=c.positions[:r],
                                prompt_length=c.prompt_length, length=c.length)

    def _forward(self, x: torch.Tensor, req: RoundRequest, cache, key_valid) -> torch.Tensor:
        r = self.runner
        kw = {} if req.block_size is None else {"block_size": req.block_size}
        if req.kind == "full":
            return r.full(x, logits_from=req.start, key_valid=key_valid, **kw)[:, : req.width]
        if req.kind == "fill":
            logits = r.full(x, logits_from=req.start, cache=cache, **kw)[:, : req.width]
            if req.prefix_keep is not None:
                cache.length = req.prefix_keep
            return logits
        if req.kind == "prefix":
            cache.length = req.start
        elif req.kind != "replace":
            raise ValueError(f"unknown round kind {req.kind!r}")
        return r.cached(x, start=req.start, end=req.end, cache=cache, mode=req.kind,
                        logits_end=req.start + req.width, **kw)

    def run(self, req: RoundRequest) -> RoundResult:
        n, R = self.groups * self.rows, self.rows
        W = req.width
        if n == 0:
            empty = torch.zeros(0, W)
            return RoundResult(empty.long(), empty.double(), torch.zeros(0, dtype=torch.float64), None)
        x = req.x.to(self.device)
        dedupe = req.dedupe and self.groups > 1
        if dedupe:
            cache = self._head_view() if self.cache is not None else None
            logits = self._forward(x[:R], req, cache, self.runner.key_valid[:R])
            if self.cache is not None:
                lo = 0 if req.kind == "fill" else max(0, req.start - 1)
                for buf in (*self.cache.keys, *self.cache.values):
                    buf[R:].view(self.groups - 1, R, *buf.shape[1:])[:, :, :, lo: req.end] = buf[:R, :, lo: req.end]
                self.cache.length = cache.length
        else:
            logits = self._forward(x, req, self.cache, self.runner.key_valid)
        s = self.s
        x0, conf = llada_choice(logits, temperature=s.temperature, remasking=s.remasking, generator=self.generator,
                                top_p=s.top_p, top_k=s.top_k)
        kw = dict(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        rank = None if s.confidence == "prob" else ranking_confidence(s.confidence, logits, conf, **kw)
        # the fill ranking is sent only when it is neither the probability nor the lookahead ranking
        fill = None if s.fill_confidence in ("prob", s.confidence) else ranking_confidence(s.fill_confidence, logits,
                                                                                          conf, **kw)
        if dedupe:
            x0, conf = x0.repeat(self.groups, 1), conf.repeat(self.groups, 1)
            rank = rank.repeat(self.groups, 1) if rank is not None else None
            fill = fill.repeat(self.groups, 1) if fill is not None else None
        pos = torch.arange(req.start, req.start + W, device=self.device)
        score_mask = (x[:, req.start: req.start + W] == s.mask_id) & (pos[None] < req.slot_end.to(self.device)[:, None])
        score = branch_scores(conf if rank is None else rank, score_mask, req.creation.to(self.device), s.alpha, s.rho,
                              certain_confidence(s.confidence))
        score = torch.where(req.valid.to(self.device), score, torch.full_like(score, NEG_INF))
        digest = self._digest(req.spans) if (req.spans is not None and self.cache is not None) else None
        return RoundResult(x0, conf, score, digest, rank, fill)

    def _digest(self, spans: torch.Tensor) -> torch.Tensor:
        """Per slot, sums and sums of squares of the K/V its row committed this round (zeros elsewhere)."""
        R, n = self.rows, self.groups * self.rows
        layers = len(self.cache.keys)
        out = torch.zeros(n, 4 * layers, dtype=torch.float64, device=self.device)
        for r in range(R):
            a, b = int(spans[r, 0]), int(spans[r, 1])
            if b <= a:
                continue
            parts = []
            for k, v in zip(self.cache.keys, self.cache.values):
                kk, vv = k[r::R, :, a:b].double(), v[r::R, :, a:b].double()
                parts += [kk.sum((1, 2, 3)), (kk * kk).sum((1, 2, 3)), vv.sum((1, 2, 3)), (vv * vv).sum((1, 2, 3))]
            out[r::R] = torch.stack(parts, -1)
        return out


def local_executor(model, *, groups: int, key_valid: torch.Tensor, settings: SlotSettings,
                   generator: torch.Generator | None, cfg) -> SlotWorker:
    return SlotWorker(model, groups=groups, key_valid=key_valid, settings=settings, generator=generator)


_EXECUTOR = contextvars.ContextVar("lopa_executor_factory", default=None)


@contextlib.contextmanager
def use_branch_executor(factory):
    """Run LoPA rounds through ``factory`` (same signature as :func:`local_executor`) inside the block."""
    token = _EXECUTOR.set(factory)
    try:
        yield
    finally:
        _EXECUTOR.reset(token)


def _digest_tolerance(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-9, torch.float32: 1e-5}.get(dtype, 2e-2)


def _check_commit_noop(digest: torch.Tensor, winners: torch.Tensor, rows: int, groups: int, spans: torch.Tensor,
                       tol: float) -> float:
    """The K/V each row cached this round must agree across its branches (so the winner's commit is a no-op)."""
    worst = 0.0
    d = digest.detach().cpu().view(groups, rows, -1)
    for r in range(rows):
        if int(spans[r, 1]) <= int(spans[r, 0]):
            continue
        ref = d[int(winners[r]), r]
        scale = float(ref.abs().max()) + 1e-30
        diff = float((d[:, r] - ref[None]).abs().max()) / scale
        worst = max(worst, diff)
        if diff > tol:
            raise RuntimeError(
                f"LoPA invariant violated: the K/V cached this round differ across the branches of row {r} "
                f"(relative digest difference {diff:.3e} > {tol:.1e}); under a block-causal mask they must be equal"
            )
    return worst


# ----------------------------------------------------------------------------- the loop
def _settings(state: DecodeState, *, use_cache: bool, remasking: str, fill_confidence: str = "prob") -> SlotSettings:
    cfg = state.cfg
    return SlotSettings(prompt_length=state.P, mask_id=state.mask_id, use_cache=use_cache,
                        rules=LogitRules.from_config(cfg, state.mask_id, state.eos_id), temperature=cfg.temperature,
                        top_p=cfg.top_p,
                        top_k=cfg.top_k, remasking=remasking, alpha=cfg.lopa_alpha, rho=cfg.lopa_rho,
                        confidence=cfg.lopa_confidence, fill_confidence=fill_confidence)


def _rankings(res: RoundResult, cfg, winners: torch.Tensor, rows: int, conf: torch.Tensor, device, fill_kind: str):
    """The winners' lookahead ranking and anchor-fill ranking [rows, W] (``conf`` where it is the probability).

    An executor that does not return a ranking the config asks for fails here rather than rank by
    probability without saying so.
    """
    def pick(t):
        return _gather_rows(t, winners, rows).to(device)

    if cfg.lopa_confidence != "prob" and res.rank is None:
        raise GenerationConfigError(f"this LoPA executor returns no lopa_confidence={cfg.lopa_confidence!r} ranking")
    rank = conf if res.rank is None else pick(res.rank)
    if fill_kind == "prob":
        return rank, conf
    if fill_kind == cfg.lopa_confidence:
        return rank, rank
    if res.fill is None:
        raise GenerationConfigError(f"this LoPA executor returns no d2f_confidence={fill_kind!r} ranking; "
                                    "use d2f_confidence='prob' or equal to lopa_confidence")
    return rank, pick(res.fill)


@dataclass
class _Books:
    winners: list = field(default_factory=list)  # per original row: winner id of each round it took part in
    rounds: int = 0
    slot_rows: int = 0  # branch rows forwarded, all rounds (compute actually spent)
    commit_diff: float = 0.0

    def stats(self, ex, k: int) -> dict:
        return {"forward_seconds": ex.forward_seconds, "forwards": ex.forwards, "steps": self.rounds,
                "lopa_branches": k, "lopa_winners": self.winners, "lopa_branch_rows": self.slot_rows,
                "lopa_commit_max_rel_diff": self.commit_diff}


def _adopt(state: DecodeState, xc: torch.Tensor, start: int, width: int, winners: torch.Tensor, looks: list) -> None:
    """Write each row's winning lookahead token into the canvas (one commit for the batch)."""
    R = state.live
    transfer = torch.zeros(R, width, dtype=torch.bool)
    tokens = torch.zeros(R, width, dtype=state.x.dtype)
    for r in range(R):
        w = int(winners[r])
        if w > 0:
            off, tok, _ = looks[r][w - 1]
            if not 0 <= off - start < width or int(xc[r, off]) != state.mask_id:
                raise RuntimeError("LoPA: a lookahead token lies outside its round's window or on a filled slot")
            transfer[r, off - start] = True
            tokens[r, off - start] = tok
    if bool(transfer.any()):
        dev = state.x.device
        state.commit(start, transfer.to(dev), tokens.to(dev))


def _gather_rows(t: torch.Tensor, winners: torch.Tensor, rows: int) -> torch.Tensor:
    idx = winners.to(t.device) * rows + torch.arange(rows, device=t.device)
    return t.index_select(0, idx)


def decode_lopa(model, state: DecodeState, gen: torch.Generator | None) -> dict:
    if model.is_block_causal:
        return _decode_block_causal(model, state, gen)
    return _decode_semi_ar(model, state, gen)


def _decode_block_causal(model, state: DecodeState, gen) -> dict:
    cfg = state.cfg
    K = cfg.lopa_branches
    G = K + 1
    B, P, mask_id, eos_id = cfg.block_size, state.P, state.mask_id, state.eos_id
    factory = _EXECUTOR.get() or local_executor
    ex = factory(model, groups=G, key_valid=state.key_valid,
                 settings=_settings(state, use_cache=True, remasking="low_confidence", fill_confidence=cfg.d2f_confidence),
                 generator=gen, cfg=cfg)
    tol = _digest_tolerance(model.get_input_embeddings().weight.dtype)
    books = _Books(winners=[[] for _ in range(state.live)])
    plans = [RowPlan(P) for _ in range(state.live)]
    looks: list[list[tuple[int, int, float]]] = [[] for _ in plans]  # absolute slot, token, confidence
    try:
        while state.live:
            R = state.live
            xc = state.x.cpu()  # block bookkeeping reads a host copy (no device sync per block)
            # 1-2: append / activate, per branch (the anchor in place, lookaheads on copies)
            slot_plans = [[None] * R for _ in range(G)]
            for r, plan in enumerate(plans):
                base = plan.copy() if looks[r] else None
                plan.append_and_activate(xc[r], cfg, mask_id)
                slot_plans[0][r] = plan
                for j, (pos, tok, _) in enumerate(looks[r], start=1):
                    xr = xc[r].clone()
                    xr[pos] = tok
                    sp = base.copy()
                    sp.eos = sp.eos or (eos_id is not None and tok == eos_id)
                    sp.append_and_activate(xr, cfg, mask_id)
                    slot_plans[j][r] = sp
            # 3: rows whose anchor has nothing left to decode are finished
            finished = [not p.active() for p in plans]
            if any(finished):
                keep = state.retire(torch.tensor(finished, dtype=torch.bool, device=state.x.device), reason="length")
                kl = keep.tolist()
                plans, looks = [plans[i] for i in kl], [looks[i] for i in kl]
                slot_plans = [[g[i] for i in kl] for g in slot_plans]
                xc = xc[keep.cpu()]
                ex.select_rows(keep)
                if not state.live:
                    break
                R = state.live
            # 4: the round's slots (branch-major), padding = the anchor
            start = min(p.feed_start() for p in plans)
            for j in range(1, G):
                for r in range(R):
                    if slot_plans[j][r] is None:
                        slot_plans[j][r] = plans[r]
            end = max(sp.end for g in slot_plans for sp in g)
            X = xc[:, :end].repeat(G, 1)
            valid = torch.zeros(G * R, dtype=torch.bool)
            creation = torch.full((G * R,), certain_confidence(cfg.lopa_confidence), dtype=torch.float64)
            valid[:R] = True
            for r in range(R):
                for j, (pos, tok, c) in enumerate(looks[r], start=1):
                    X[j * R + r, pos] = tok
                    valid[j * R + r] = True
                    creation[j * R + r] = c
            slot_end = torch.tensor([sp.end for g in slot_plans for sp in g], dtype=torch.long)
            spans = torch.zeros(R, 2, dtype=torch.long)
            for r, p in enumerate(plans):
                tc = [b for b in p.blocks if b.state == TO_CACHE]
                if tc:
                    spans[r, 0], spans[r, 1] = tc[0].start, tc[-1].end
            dedupe = not any(looks)
            # 5: one forward for every branch of every row
            res = ex.run(RoundRequest(x=X, kind="prefix", start=start, end=end, width=end - start, slot_end=slot_end,
                                      creation=creation, valid=valid, dedupe=dedupe, spans=spans, block_size=B))
            state.count_forward()
            books.rounds += 1
            books.slot_rows += R if dedupe else G * R
            for g in slot_plans:
                for sp in g:
                    for b in sp.blocks:
                        if b.state == TO_CACHE:
                            b.state = IN_CACHE  # cached by this forward, identically in every branch
            winners = select_winners(res.score, R, G, cfg.lopa_force_anchor)
            if res.digest is not None and bool((spans[:, 1] > spans[:, 0]).any()):
                books.commit_diff = max(books.commit_diff, _check_commit_noop(res.digest, winners, R, G, spans, tol))
            for r in range(R):
                books.winners[int(state.rows[r])].append(int(winners[r]))
            # adopt the winners: canvas (+ its extra token), block plan, logits
            _adopt(state, xc, start, end - start, winners, looks)
            plans = [slot_plans[int(winners[r])][r] for r in range(R)]
            x0 = _gather_rows(res.x0, winners, R).to(state.x.device)
            conf = _gather_rows(res.conf, winners, R).to(state.x.device)
            rank, fill = _rankings(res, cfg, winners, R, conf, state.x.device, cfg.d2f_confidence)
            # 6: anchor fill with the winner's logits (the D2F rule per active block)
            candidates = state.x[:, start:end] == mask_id
            transfer = torch.zeros_like(candidates)
            for r, p in enumerate(plans):
                for b in p.active():
                    s, e = b.start - start, b.end - start
                    transfer[r, s:e] |= d2f_fill(conf[r: r + 1, s:e], fill[r: r + 1, s:e], candidates[r: r + 1, s:e],
                                                 cfg.skip_threshold, b.complete)[0]
            state.commit(start, transfer, x0)
            xc, tc = state.x.cpu(), transfer.cpu()
            if eos_id is not None:
                for r, p in enumerate(plans):
                    if bool((xc[r, start:end][tc[r]] == eos_id).any()):
                        p.eos = True
            # 7: retire finished blocks in order
            for r, p in enumerate(plans):
                p.retire_finished(xc[r], mask_id)
            keep = state.pop_finished()
            if keep is not None:
                kl = keep.tolist()
                plans = [plans[i] for i in kl]
                x0, conf, rank = x0[keep], conf[keep], rank[keep]
                ex.select_rows(keep)
            # lookahead branches for the next round: top-k remaining masked slots of active blocks
            if K and state.live:
                window = state.x[:, start:end]
                cand = torch.zeros_like(window, dtype=torch.bool)
                for r, p in enumerate(plans):
                    for b in p.active():
                        cand[r, b.start - start: b.end - start] = True
                cand &= window == mask_id
                looks = [[(start + o, t, c) for o, t, c in row] for row in top_lookaheads(rank, x0, cand, K)]
            else:
                looks = [[] for _ in plans]
    finally:
        ex.close()
    return books.stats(ex, K)


def _decode_semi_ar(model, state: DecodeState, gen) -> dict:
    cfg = state.cfg  # refresh_interval is rejected up front by registry.check_compatible
    K = cfg.lopa_branches
    G = K + 1
    B, P = cfg.block_size, state.P
    T = P + state.G
    spb = cfg.steps_per_block()
    factory = _EXECUTOR.get() or local_executor
    ex = factory(model, groups=G, key_valid=state.key_valid,
                 settings=_settings(state, use_cache=cfg.cache != "none", remasking=cfg.remasking), generator=gen, cfg=cfg)
    books = _Books(winners=[[] for _ in range(state.live)])
    try:
        for blk in range(cfg.num_blocks):
            if state.live == 0:
                break
            s, e = P + blk * B, P + (blk + 1) * B
            looks: list[list[tuple[int, int, float]]] = [[] for _ in range(state.live)]
            i = 0
            while state.live:
                need = state.masked(s, e).any(-1)
                if not bool(need.any()):
                    break
                if cfg.cache == "dual" and cfg.dual_cache_step_bound and i >= spb:
                    break
                R = state.live
                xc = state.x.cpu()
                if cfg.cache == "none":
                    kind, end, keep_prefix = "full", T, None
                elif i == 0:
                    kind, end, keep_prefix = "fill", T, (s if cfg.cache == "prefix" else None)
                elif cfg.cache == "prefix":
                    kind, end, keep_prefix = "prefix", T, None
                else:
                    kind, end, keep_prefix = "replace", e, None
                X = xc.repeat(G, 1)
                valid = torch.zeros(G * R, dtype=torch.bool)
                creation = torch.full((G * R,), certain_confidence(cfg.lopa_confidence), dtype=torch.float64)
                valid[:R] = True
                for r in range(R):
                    for j, (pos, tok, c) in enumerate(looks[r], start=1):
                        X[j * R + r, pos] = tok
                        valid[j * R + r] = True
                        creation[j * R + r] = c
                dedupe = not any(looks)
                if kind == "fill" and not dedupe:
                    raise RuntimeError("LoPA: a block-start refresh must not carry lookahead branches")
                res = ex.run(RoundRequest(x=X[:, :end], kind=kind, start=s, end=end, width=B,
                                          slot_end=torch.full((G * R,), e, dtype=torch.long), creation=creation,
                                          valid=valid, dedupe=dedupe, prefix_keep=keep_prefix))
                state.count_forward(need)
                books.rounds += 1
                books.slot_rows += R if dedupe else G * R
                winners = select_winners(res.score, R, G, cfg.lopa_force_anchor)
                for r in range(R):
                    if bool(need[r]):
                        books.winners[int(state.rows[r])].append(int(winners[r]))
                _adopt(state, xc, s, B, winners, looks)
                x0 = _gather_rows(res.x0, winners, R).to(state.x.device)
                conf = _gather_rows(res.conf, winners, R).to(state.x.device)
                rank, _ = _rankings(res, cfg, winners, R, conf, state.x.device, "prob")
                transfer = select_threshold(conf, state.masked(s, e), cfg.threshold)
                state.commit(s, transfer & need[:, None], x0)
                i += 1
                keep = state.pop_finished()
                if keep is not None:
                    x0, conf, rank = x0[keep], conf[keep], rank[keep]
                    ex.select_rows(keep)
                if K and state.live:
                    found = top_lookaheads(rank, x0, state.masked(s, e), K)
                    looks = [[(s + o, t, c) for o, t, c in row] for row in found]
                else:
                    looks = [[] for _ in range(state.live)]
    finally:
        ex.close()
    return books.stats(ex, K)
