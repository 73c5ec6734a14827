"""LoPA's slots: one verification forward over every branch of every row (branch-major), and its results.

:class:`SlotWorker` is the single-process executor; :mod:`dllm.decoding.lopa.branch_parallel` spreads the
branch groups over processes with the same ``run``/``select_rows``/``close`` surface. An executor is made by
a factory with :func:`local_executor`'s signature and passed to the loop explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dllm.decoding.joining import move_cache
from dllm.decoding.runner import LogitRules, ModelRunner
from dllm.decoding.sampling import llada_choice, ranking_confidence
from dllm.modeling.kv_cache import DiffusionKVCache

from .scoring import NEG_INF, branch_scores, certain_confidence


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

    def admit(self, key_valid: torch.Tensor, prompt_length: torch.Tensor, shift: int) -> None:
        """Rows joined the batch (:meth:`dllm.decoding.state.DecodeState.admit`): the canvas was re-laid out
        (old slot ``s`` is now ``s - shift``) and ``key_valid`` [rows, width] and ``prompt_length`` [rows]
        are the live rows' new ones, the joined rows last. Every branch group is re-laid out the same way;
        the joined rows' slots start with an empty cache (their prompts are fed by the next forward)."""
        old, new = self.rows, key_valid.shape[0]
        kv = key_valid.to(self.device).repeat(self.groups, 1)
        pl = prompt_length.to(self.device).repeat(self.groups)
        self.runner.key_valid, self.runner.prompt_length = kv, pl
        if self.cache is not None:
            rows = [g * new + r for g in range(self.groups) for r in range(old)]
            self.cache = move_cache(self.cache, kv, pl, shift, rows)
        self.rows = new

    def _head_view(self) -> DiffusionKVCache:
        c, r = self.cache, self.rows
        return DiffusionKVCache(keys=[k[:r] for k in c.keys], values=[v[:r] for v in c.values],
                                key_valid=c.key_valid[:r], positions=c.positions[:r],
                                prompt_length=c.prompt_length[:r] if torch.is_tensor(c.prompt_length)
                                else c.prompt_length, length=c.length)

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
            pl = self.runner.prompt_length
            if torch.is_tensor(pl):  # per-row prompt ends (rows joined): the anchor group's
                self.runner.prompt_length = pl[:R]
            try:
                logits = self._forward(x[:R], req, cache, self.runner.key_valid[:R])
            finally:
                self.runner.prompt_length = pl
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


local_executor.joins_rows = True  # its workers take joined rows (SlotWorker.admit); DecodeSession asks




def digest_tolerance(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-9, torch.float32: 1e-5}.get(dtype, 2e-2)


def check_commit_noop(digest: torch.Tensor, winners: torch.Tensor, rows: int, groups: int, spans: torch.Tensor,
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
