"""When a row stops: its EOS, its ``max_new_tokens``, a stop string, a criterion from outside, or a cancel.

:class:`Stopping` is asked after every commit with each live row's generated region and the length of its
final committed prefix (the tokens that can no longer change); it answers which rows are done and which of
those were cancelled. A *criterion* is any callable ``criterion(rows) -> iterable of rows`` over the
original indices of the live rows (a server's own stops: a stop string it matched in the text, its
``max_tokens``); such rows end with ``"stop"``, like a stop string. :meth:`Stopping.cancel` marks a row
that ends ``"cancelled"`` at the next commit (a client that went away).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

StoppingCriterion = Callable[[list[int]], Iterable[int]]


class Stopping:
    def __init__(self, cfg, *, limit: int, eos_id: int | None, tokenizer=None,
                 criteria: Iterable[StoppingCriterion] = ()) -> None:
        self.cfg = cfg
        self.limit = limit  # the answer's length; slots past it only round the canvas up to whole blocks
        self.eos_id = eos_id
        self.tokenizer = tokenizer
        self.criteria = list(criteria)
        self.cancelled: set[int] = set()  # original row indices
        self._checked: dict[int, int] = {}  # stop strings: the prefix length last decoded, per original row

    def cancel(self, row: int) -> None:
        self.cancelled.add(int(row))

    def check(self, gen: torch.Tensor, prefix_len: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(done, cancelled)`` [live] bool for generated regions ``gen`` [live, G] whose first ``prefix_len``
        slots are final; ``rows`` are the live rows' original indices. ``cancelled`` is None when no row is."""
        done = torch.zeros(gen.shape[0], dtype=torch.bool, device=gen.device)
        if self.limit < gen.shape[1]:
            done |= prefix_len >= self.limit
        if self.eos_id is not None and self.cfg.stop_at_eos:
            is_eos = gen == self.eos_id
            done |= is_eos.any(-1) & (prefix_len > is_eos.long().argmax(-1))
        if self.cfg.stop_strings and self.tokenizer is not None:
            self._stop_strings(gen, prefix_len, rows, done)
        if not self.criteria and not self.cancelled:
            return done, None
        orig = rows.tolist()
        if self.criteria:
            stop = set()
            for criterion in self.criteria:
                stop.update(int(r) for r in criterion(orig))
            if stop:
                done |= torch.tensor([r in stop for r in orig], dtype=torch.bool, device=gen.device)
        cancelled = None
        if self.cancelled:
            hit = [r in self.cancelled for r in orig]
            if any(hit):
                cancelled = torch.tensor(hit, dtype=torch.bool, device=gen.device)
                done |= cancelled
        return done, cancelled

    def _stop_strings(self, gen, prefix_len, rows, done) -> None:
        for r in range(gen.shape[0]):
            n, orig = int(prefix_len[r]), int(rows[r])
            if done[r] or n == self._checked.get(orig, 0):
                continue
            self._checked[orig] = n
            text = self.tokenizer.decode(gen[r, :n].tolist(), skip_special_tokens=True)
            if any(s in text for s in self.cfg.stop_strings):
                done[r] = True

    def forget(self, rows: Iterable[int]) -> None:
        """Rows that left: drop what was kept for them."""
        for r in rows:
            self._checked.pop(r, None)
            self.cancelled.discard(r)
