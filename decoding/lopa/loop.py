"""The LoPA round loop on its two base rules (D2F pipeline on block-causal models, semi-AR threshold
on bidirectional ones). See :mod:`dllm.decoding.lopa` for the method and its conventions."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dllm.decoding.joining import may_join
from dllm.decoding.loops.pipeline import IN_CACHE, TO_CACHE, RowPlan, d2f_fill
from dllm.decoding.policies import select_threshold
from dllm.decoding.runner import LogitRules
from dllm.decoding.state import DecodeState

from .scoring import certain_confidence, gather_rows, select_winners, top_lookaheads, winner_rankings
from .slots import RoundRequest, SlotSettings, check_commit_noop, digest_tolerance, local_executor


def _settings(state: DecodeState, *, use_cache: bool, remasking: str, fill_confidence: str = "prob") -> SlotSettings:
    cfg = state.cfg
    return SlotSettings(prompt_length=state.P, mask_id=state.mask_id, use_cache=use_cache,
                        rules=LogitRules.from_config(cfg, state.mask_id, state.eos), temperature=cfg.temperature,
                        top_p=cfg.top_p,
                        top_k=cfg.top_k, remasking=remasking, alpha=cfg.lopa_alpha, rho=cfg.lopa_rho,
                        confidence=cfg.lopa_confidence, fill_confidence=fill_confidence)




@dataclass
class _Books:
    rows: int = 0  # rows of the batch so far (original ids 0 .. rows - 1)
    rounds: int = 0
    slot_rows: int = 0  # branch rows forwarded, all rounds (compute actually spent)
    commit_diff: float = 0.0
    # per round: the live rows' original ids (device), their winners and whether each took part (host; None:
    # all did). The ids are read back once, after the loop, rather than once per round.
    log: list = field(default_factory=list)

    def grow(self, rows: int) -> None:
        """Rows joined: the batch has ``rows`` rows so far."""
        self.rows = max(self.rows, rows)

    def record(self, original_rows: torch.Tensor, winners: torch.Tensor, took_part: list | None = None) -> None:
        self.log.append((original_rows, winners, took_part))

    def winners(self) -> list[list[int]]:
        """Per original row: the winner id of each round it took part in."""
        out = [[] for _ in range(self.rows)]
        if not self.log:
            return out
        ids = torch.cat([rows for rows, _, _ in self.log]).tolist()
        i = 0
        for rows, won, took in self.log:
            for r, w in enumerate(won.tolist()):
                if took is None or took[r]:
                    out[ids[i + r]].append(w)
            i += len(rows)
        return out

    def stats(self, ex, k: int) -> dict:
        return {"forward_seconds": ex.forward_seconds, "forwards": ex.forwards, "steps": self.rounds,
                "lopa_branches": k, "lopa_winners": self.winners(), "lopa_branch_rows": self.slot_rows,
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


def _branch_rows(x: torch.Tensor, looks: list, groups: int, confidence: str):
    """The round's rows, branch-major: group 0 is every row's anchor ``x``, group j its j-th lookahead
    (the anchor plus one token); a row with fewer lookaheads repeats its anchor, marked not ``valid``.
    Returns ``(X, valid, creation)``: creation = the lookahead token's confidence (certain for anchors)."""
    R = x.shape[0]
    X = x.repeat(groups, 1)
    valid = torch.zeros(groups * R, dtype=torch.bool)
    creation = torch.full((groups * R,), certain_confidence(confidence), dtype=torch.float64)
    valid[:R] = True
    for r in range(R):
        for j, (pos, tok, c) in enumerate(looks[r], start=1):
            X[j * R + r, pos] = tok
            valid[j * R + r] = True
            creation[j * R + r] = c
    return X, valid, creation


def _to_host(score: torch.Tensor, digest: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The round's branch scores [n] (and K/V digests [n, d]) in one host copy."""
    if digest is None:
        return score.detach().cpu(), None
    both = torch.cat([score.detach().double()[:, None], digest.detach().double()], 1).cpu()
    return both[:, 0], both[:, 1:]


def _join(state: DecodeState, ex, place_at: int) -> tuple[int, int]:
    """Place the waiting rows with their prompts ending at ``place_at`` and re-lay out the executor's
    branch groups the same way (see :func:`dllm.decoding.joining.poll`). Returns ``(rows, shift)``."""
    joined, shift = state.admit(place_at)
    if joined:
        ex.admit(state.key_valid, state.gstart, shift)
    return joined, shift


def decode_lopa(model, state: DecodeState, gen: torch.Generator | None, *, executor=None):
    """``executor``: the factory of the branch executor (:func:`~dllm.decoding.lopa.slots.local_executor`'s
    signature; a :class:`~dllm.decoding.lopa.branch_parallel.BranchParallelExecutor` passes its own)."""
    factory = executor or local_executor
    if model.is_block_causal:
        return (yield from _decode_block_causal(model, state, gen, factory))
    return (yield from _decode_semi_ar(model, state, gen, factory))


def _decode_block_causal(model, state: DecodeState, gen, factory):
    cfg = state.cfg
    K = cfg.lopa_branches
    G = K + 1
    B, P, mask_id, eos = cfg.block_size, state.P, state.mask_id, state.eos
    ex = factory(model, groups=G, key_valid=state.key_valid,
                 settings=_settings(state, use_cache=True, remasking="low_confidence", fill_confidence=cfg.d2f_confidence),
                 generator=gen, cfg=cfg)
    tol = digest_tolerance(model.get_input_embeddings().weight.dtype)
    books = _Books(rows=state.live)
    plans = [RowPlan(P) for _ in range(state.live)]
    looks: list[list[tuple[int, int, float]]] = [[] for _ in plans]  # absolute slot, token, confidence
    join = state.joining
    xc = None  # host copy of the canvas, carried from one round's end to the next round (re-read when rows join)
    try:
        while True:
            if join:  # before every round new rows may join, as in the D2F pipeline
                place = min((p.feed_start() for p in plans), default=0)
                window_end = max((p.end for p in plans), default=place)
                if state.incoming and may_join(state, place_at=place, window_end=window_end, block=B):
                    joined, shift = _join(state, ex, place)
                    xc = None
                    for p in plans:
                        p.shift(shift)
                    looks = [[(pos - shift, tok, c) for pos, tok, c in row] for row in looks]
                    first, _ = state.row_spans()
                    news = range(state.live - joined, state.live)
                    plans += [RowPlan(int(state.gstart[r]), int(first[r])) for r in news]
                    looks += [[] for _ in news]
                    books.grow(state.num_rows)
            if not state.live:
                break
            R = state.live
            if xc is None:
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
                    sp.eos = sp.eos or tok in eos
                    sp.append_and_activate(xr, cfg, mask_id)
                    slot_plans[j][r] = sp
            # 3: rows whose anchor has nothing left to decode are finished
            finished = [not p.active() for p in plans]
            if any(finished):
                keep = state.retire(torch.tensor(finished, dtype=torch.bool, device=state.x.device), reason="length")
                kl = keep.tolist()
                plans, looks = [plans[i] for i in kl], [looks[i] for i in kl]
                slot_plans = [[g[i] for i in kl] for g in slot_plans]
                xc = xc[kl]
                ex.select_rows(keep)
                if not state.live:
                    if join and state.incoming:
                        continue  # waiting rows join now
                    break
                R = state.live
            # 4: the round's slots (branch-major), padding = the anchor
            start = min(p.feed_start() for p in plans)
            for j in range(1, G):
                for r in range(R):
                    if slot_plans[j][r] is None:
                        slot_plans[j][r] = plans[r]
            end = max(sp.end for g in slot_plans for sp in g)
            X, valid, creation = _branch_rows(xc[:, :end], looks, G, cfg.lopa_confidence)
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
            checked = res.digest is not None and bool((spans[:, 1] > spans[:, 0]).any())
            score, digest = _to_host(res.score, res.digest if checked else None)
            winners = select_winners(score, R, G, cfg.lopa_force_anchor)
            if checked:
                books.commit_diff = max(books.commit_diff, check_commit_noop(digest, winners, R, G, spans, tol))
            books.record(state.rows, winners)
            # adopt the winners: canvas (+ its extra token), block plan, logits
            was_masked = xc[:, start:end] == mask_id  # before this round's commits (on a CPU xc is state.x itself)
            _adopt(state, xc, start, end - start, winners, looks)
            plans = [slot_plans[int(winners[r])][r] for r in range(R)]
            x0 = gather_rows(res.x0, winners, R).to(state.x.device)
            conf = gather_rows(res.conf, winners, R).to(state.x.device)
            rank, fill = winner_rankings(res, cfg, winners, R, conf, state.x.device, cfg.d2f_confidence)
            # 6: anchor fill with the winner's logits (the D2F rule per active block)
            candidates = state.x[:, start:end] == mask_id
            transfer = torch.zeros_like(candidates)
            for r, p in enumerate(plans):
                for b in p.active():
                    s, e = b.start - start, b.end - start
                    transfer[r, s:e] |= d2f_fill(conf[r: r + 1, s:e], fill[r: r + 1, s:e], candidates[r: r + 1, s:e],
                                                 cfg.skip_threshold, b.complete)[0]
            state.commit(start, transfer, x0)
            xc = state.x.cpu()
            if eos:  # filled this round (the adopted lookahead token too, whose EOS its plan already has)
                tc = was_masked & (xc[:, start:end] != mask_id)
                committed_eos = (eos.match(xc[:, start:end]) & tc).any(-1).tolist()
                for p, hit in zip(plans, committed_eos):
                    if hit:
                        p.eos = True
            # 7: retire finished blocks in order
            for r, p in enumerate(plans):
                p.retire_finished(xc[r], mask_id)
            keep = state.pop_finished()
            if keep is not None:
                kl = keep.tolist()
                plans, xc = [plans[i] for i in kl], xc[kl]
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
            yield
    finally:
        ex.close()
    return books.stats(ex, K)


def _decode_semi_ar(model, state: DecodeState, gen, factory):
    cfg = state.cfg  # refresh_interval is rejected up front by registry.check_compatible
    K = cfg.lopa_branches
    G = K + 1
    B = cfg.block_size
    spb = cfg.steps_per_block()
    ex = factory(model, groups=G, key_valid=state.key_valid,
                 settings=_settings(state, use_cache=cfg.cache != "none", remasking=cfg.remasking), generator=gen, cfg=cfg)
    books = _Books(rows=state.live)
    blk, s = 0, state.P
    try:
        while True:
            if state.joining:  # at every block start, as semi-AR: rows whose region is done leave, waiting rows join
                if state.live:
                    ended = state.row_spans()[1] <= s
                    if bool(ended.any()):
                        ex.select_rows(state.retire(ended, reason="length"))
                if state.incoming:
                    _, shift = _join(state, ex, s)
                    s -= shift
                    books.grow(state.num_rows)
            elif blk >= cfg.num_blocks:
                break
            if state.live == 0:
                break
            e = s + B
            blk += 1
            looks: list[list[tuple[int, int, float]]] = [[] for _ in range(state.live)]
            i = 0
            while state.live:
                xc = state.x.cpu()  # one host copy per round: the block's masks and the lookahead slots
                need_host = (xc[:, s:e] == state.mask_id).any(-1)
                if not bool(need_host.any()):
                    break
                if cfg.cache == "dual" and cfg.dual_cache_step_bound and i >= spb:
                    break
                need = state.masked(s, e).any(-1)
                R = state.live
                T = xc.shape[1]
                if cfg.cache == "none":
                    kind, end, keep_prefix = "full", T, None
                elif i == 0:
                    kind, end, keep_prefix = "fill", T, (s if cfg.cache == "prefix" else None)
                elif cfg.cache == "prefix":
                    kind, end, keep_prefix = "prefix", T, None
                else:
                    kind, end, keep_prefix = "replace", e, None
                X, valid, creation = _branch_rows(xc, looks, G, cfg.lopa_confidence)
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
                books.record(state.rows, winners, need_host.tolist())
                _adopt(state, xc, s, B, winners, looks)
                x0 = gather_rows(res.x0, winners, R).to(state.x.device)
                conf = gather_rows(res.conf, winners, R).to(state.x.device)
                rank, _ = winner_rankings(res, cfg, winners, R, conf, state.x.device, "prob")
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
                if state.joining:  # rows join once this block ends
                    state.join_ready = not bool(state.masked(s, e).any()) or (
                        cfg.cache == "dual" and cfg.dual_cache_step_bound and i >= spb)
                yield
            s = e
    finally:
        ex.close()
    return books.stats(ex, K)
