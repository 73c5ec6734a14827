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
nothing is copied when the winner changes (rows that join a running batch, see
:mod:`dllm.decoding.joining`, re-lay out every group's rows alike, once per join):

* block-causal: the cache holds the prompt plus finished blocks, and it is the same in every
  branch of a row. Lookahead tokens sit only in active blocks, and under the block-causal mask
  the K/V of a block depend only on the prefix. The blocks a forward caches therefore get the
  same K/V in every branch, and "committing the winner's cache" is a no-op. This is checked every
  round that caches blocks: per slot, a digest of the newly cached K/V must match the winner's;
* bidirectional: slots outside the fed span come only from the block-start refresh, which has no
  lookaheads, so they are identical in every branch. The fed span is rewritten before it is read
  in every forward, so again nothing needs committing. ``refresh_interval`` would refresh in the
  middle of a block while branches differ, so it is rejected.

Branch parallelism (:mod:`dllm.decoding.lopa.branch_parallel`) spreads the branch groups over processes. Each
process owns the cache rows of its groups, and the same no-op argument holds across processes.
"""

from .loop import decode_lopa
from .scoring import branch_scores, certain_confidence, select_winners, top_lookaheads
from .slots import RoundRequest, RoundResult, SlotSettings, SlotWorker, local_executor

__all__ = ["RoundRequest", "RoundResult", "SlotSettings", "SlotWorker", "branch_scores", "certain_confidence",
           "decode_lopa", "local_executor", "select_winners", "top_lookaheads"]
