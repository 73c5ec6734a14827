"""From committed token ids to the text a client may see: incremental detokenization, stop strings, caps.

``put_row`` hands the server final tokens, but their *text* is not always final: a byte-level BPE
token can end in the middle of a UTF-8 character, and a stop string can straddle two chunks. A
:class:`RowText` therefore holds text back until it is stable:

* the detokenizer decodes a short window of tokens (offsets as in vLLM / TGI) and holds back text
  that ends in U+FFFD (an incomplete character);
* the stop matcher holds back the longest suffix that could still become a stop string, and cuts
  the text at the first stop string (the stop string itself is not returned, as in OpenAI);
* ``max_tokens`` caps the tokens used (the canvas is rounded up to whole blocks).

Everything a client receives is appended, never revised: the concatenation of the deltas is the
final text, streamed or not.
"""

from __future__ import annotations


class IncrementalDetokenizer:
    """Decode appended token ids into appended text."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: context so the window's first token decodes as in the full text
        self.read_offset = 0  # tokens whose text has been returned

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""

    def add(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        return self._step(final=False)

    def flush(self) -> str:
        """Everything not returned yet, incomplete characters included (the row is over)."""
        return self._step(final=True)

    def _step(self, final: bool) -> str:
        if self.read_offset >= len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) and not final:
            return ""  # e.g. a skipped special token: wait for text
        if new_text.endswith("\ufffd") and not final:
            return ""  # an incomplete character: the next token completes it
        delta = new_text[len(prefix_text):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return delta


class RowText:
    """One output row: tokens in, sendable text out, plus why it ended.

    ``add`` returns text safe to send now; ``finish`` flushes at the end of the row. ``finished``
    becomes ``"stop"`` (stop string) or ``"length"`` (``max_tokens``) when the server itself ends the
    row: the engine then cancels the row in the decoding batch.
    """

    def __init__(self, tokenizer, *, max_tokens: int, stop: tuple[str, ...] = ()) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.max_tokens = max_tokens
        self.stop = tuple(s for s in stop if s)
        self.text = ""  # stable text so far (sent + held back)
        self.sent = 0  # characters of ``text`` handed out
        self.n_tokens = 0
        self.finished: str | None = None
        self.stop_hit = False  # ended by a stop string

    def add(self, ids: list[int]) -> str:
        if self.finished is not None:
            return ""
        ids = list(ids)[: max(0, self.max_tokens - self.n_tokens)]
        self.n_tokens += len(ids)
        self.text += self.detok.add(ids)
        if self.n_tokens >= self.max_tokens:
            return self.finish("length")
        return self._release(final=False)

    def finish(self, reason: str) -> str:
        """End the row (``reason`` from the decoder or the cap); a stop string found now wins."""
        if self.finished is not None:
            return ""
        self.text += self.detok.flush()
        out = self._release(final=True)
        if self.finished is None:
            self.finished = reason
        return out

    def _release(self, final: bool) -> str:
        text = self.text
        if self.stop:
            cut = min((i for i in (text.find(s, self.sent) for s in self.stop) if i >= 0), default=-1)
            if cut >= 0:
                self.text = text[:cut]
                out = self.text[self.sent:]
                self.sent = cut
                self.finished = "stop"
                self.stop_hit = True
                return out
        end = len(text) if final else len(text) - self._hold(text)
        out = text[self.sent:end]
        self.sent = max(self.sent, end)
        return out

    def _hold(self, text: str) -> int:
        """Length of the longest unsent suffix of ``text`` that is a proper prefix of a stop string."""
        room = len(text) - self.sent
        hold = 0
        for s in self.stop:
            for k in range(min(len(s) - 1, room), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        return hold
