"""When a row stops: its EOS, its ``max_new_tokens``, a stop string, a criterion from outside, or a cancel.

:class:`Stopping` is asked after every commit with each live row's generated region and the length of its
final committed prefix (the tokens that can no longer change); it answers which rows are done and which of
those were cancelled. A *criterion* is any callable ``criterion(rows) -> iterable of rows`` over the
original indices of the live rows (a server's own stops: a stop string it matched in the text, its
``max_tokens``); such rows end with ``"stop"``, like a stop string. :meth:`Stopping.cancel` marks a row
that ends ``"cancelled"`` at the next commit (a client that went away).

:class:`EosIds` holds the ids that end an answer: every EOS id of the config (checkpoints of the
block-diffusion families list two, the chat turn end and the document end), any of which stops a row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

StoppingCriterion = Callable[[list[int]], Iterable[int]]


class EosIds:
    """The EOS ids of a batch (none, one or several): ``ids`` in the config's order, ``tensor`` the same
    ids as a small LongTensor on the canvas's device, ``first`` the id that pads a finished answer.

    :meth:`match` is ``x == id`` for one id (the common case, unchanged) and ``torch.isin`` for several."""

    __slots__ = ("_copies", "first", "ids", "tensor")

    def __init__(self, ids: Iterable[int] = (), device: torch.device | str | None = None) -> None:
        self.ids = tuple(dict.fromkeys(int(i) for i in ids))
        self.first = self.ids[0] if self.ids else None
        self.tensor = torch.tensor(self.ids, dtype=torch.long, device=device)
        self._copies = {self.tensor.device: self.tensor}  # per device (a loop may test a host copy)

    def __bool__(self) -> bool:
        return bool(self.ids)

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, token) -> bool:
        return int(token) in self.ids

    def __repr__(self) -> str:
        return f"EosIds({list(self.ids)})"

    def match(self, x: torch.Tensor) -> torch.Tensor:
        """Bool tensor shaped like ``x``: where it holds any of the ids (all False when there are none)."""
        if len(self.ids) == 1:
            return x == self.first
        ids = self._copies.get(x.device)
        if ids is None:
            ids = self._copies[x.device] = self.tensor.to(x.device)
        return torch.isin(x, ids)


class Stopping:
    def __init__(self, cfg, *, limit: int, eos: EosIds, tokenizer=None,
                 criteria: Iterable[StoppingCriterion] = ()) -> None:
        self.cfg = cfg
        self.limit = limit  # the answer's length; slots past it only round the canvas up to whole blocks
        self.eos = eos
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
        if self.eos and self.cfg.stop_at_eos:
            is_eos = self.eos.match(gen)
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
