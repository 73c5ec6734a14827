"""Streaming committed tokens out of a decoding batch.

A single-row ``transformers`` streamer (``BaseStreamer``: ``put``/``end``) gets the prompt first,
then every newly committed token of the contiguous committed prefix, never a token that can still
change (a committed token is final in every dllm strategy). For servers, a :class:`BatchStreamer`
receives the same per row of a batch, by the row's index in the ``generate`` call or the
:class:`~dllm.decoding.decode_session.DecodeSession`.
"""

from __future__ import annotations


class BatchStreamer:
    """Receives the output of a batch, row by row; override what you need. Every method is called from
    the decoding loop's thread, right after the commit that produced it. Adding and cancelling rows is
    the caller's business (:class:`dllm.decoding.decode_session.DecodeSession`), not the streamer's."""

    def put_row(self, row: int, token_ids: list[int]) -> None:
        """New final tokens of ``row`` (EOS and anything after it are never sent)."""

    def end_row(self, row: int, finish_reason: str, num_forwards: int | None = None) -> None:
        """``row`` is finished; no more tokens will come. ``num_forwards``: the forwards it took."""


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
