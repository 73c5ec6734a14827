"""Streaming committed tokens out of a decoding batch.

A single-row ``transformers`` streamer (``BaseStreamer``: ``put``/``end``) gets the prompt first,
then every newly committed token of the contiguous committed prefix, never a token that can still
change (a committed token is final in every dllm strategy). For servers, a :class:`BatchStreamer`
receives the same per row of a batch, by the row's index in the ``generate`` call, and may cancel
rows (a client that disconnected) or add rows to the running call (:meth:`BatchStreamer.admit_rows`,
continuous batching).
"""

from __future__ import annotations


class BatchStreamer:
    """Override what you need; every method is called from the decoding loop's thread."""

    #: Whether this streamer adds rows to running calls (:meth:`admit_rows`). Loops only switch to
    #: their joining mode (polls, per-row block grids, retire-at-boundary) when it is True.
    joins_rows: bool = False

    #: Admission bound for joins in the D2F pipeline (``dllm.decoding.joining.may_join``): rows join only
    #: while the batch's live windows span at most this many blocks from the join point (the
    #: slowest row's first uncached slot) to the furthest row's end; staggered rows make every
    #: forward cover the union of their windows. ``None``: join at every forward. A call with no
    #: live rows always takes new rows.
    join_max_spread_blocks: float | None = None

    def put_row(self, row: int, token_ids: list[int]) -> None:
        """New final tokens of ``row`` (EOS and anything after it are never sent)."""

    def end_row(self, row: int, finish_reason: str, num_forwards: int | None = None) -> None:
        """``row`` is finished; no more tokens will come. ``num_forwards``: the forwards it took."""

    def cancelled_rows(self) -> set[int]:
        """Rows whose work should stop now (they finish with reason ``"cancelled"``)."""
        return set()

    def admit_rows(self, first_row: int, live_rows: int) -> list[list[int]]:
        """Prompts (token ids, no padding) to add to the running batch now: continuous batching.

        Polled by the loops that support joining (:func:`dllm.decoding.joining.supports_joining`): the
        semi-AR loop at every block boundary, the D2F pipeline before every forward. The prompts
        become rows ``first_row``, ``first_row + 1``, ... in order (indices for ``put_row``,
        ``end_row``, ``cancelled_rows`` and the output); ``live_rows`` is the number of rows running
        now. A joined row decodes with the call's config and, at temperature 0, produces the same
        tokens and forward count as when it runs alone. Only polled when :attr:`joins_rows` is True;
        the default adds nothing.
        """
        return []


class CollectingBatchStreamer(BatchStreamer):
    """Keeps everything it is given; handy in tests and notebooks."""

    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.chunks: dict[int, int] = {}
        self.finished: dict[int, str] = {}
        self.forwards: dict[int, int | None] = {}

    def put_row(self, row: int, token_ids: list[int]) -> None:
        self.tokens.setdefault(row, []).extend(token_ids)
        self.chunks[row] = self.chunks.get(row, 0) + 1

    def end_row(self, row: int, finish_reason: str, num_forwards: int | None = None) -> None:
        self.finished[row] = finish_reason
        self.forwards[row] = num_forwards
