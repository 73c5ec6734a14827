"""The model runner: the only place a decoder calls the model. Counts and times every forward.

It hides three details from the loops: which cache operation a forward is, Dream's logit shift in
cached forwards (to get the shifted logit of slot ``s`` the runner feeds from ``s - 1``), and the
rules every strategy's choices obey (:class:`LogitRules`), applied to the logits once, where they
leave the model.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from dllm.modeling.kv_cache import DiffusionKVCache, padding_memo, recalled_padding


@dataclass(frozen=True)
class LogitRules:
    """What no strategy may choose, applied to every forward's logits (picklable: ranks get a copy).

    * ``banned``: token ids never committed: ``[MASK]`` (committing it would be a no-op that loops
      forever; ``suppress_mask_token``) and every EOS id with ``ignore_eos``;
    * the EOS ids (``eos_ids``, or the one ``eos_id``) before ``min_tokens``: no EOS id is chosen in the
      first ``min_tokens`` slots of an answer;
    * ``min_p``: tokens whose probability is below ``min_p`` times the top token's are dropped, so
      sampling and confidences see the distribution renormalised over the rest (vLLM's min_p).
    """

    banned: tuple[int, ...] = ()
    eos_id: int | None = None
    min_tokens: int = 0
    min_p: float | None = None
    eos_ids: tuple[int, ...] = ()  # every EOS id; given alone, ``eos_id`` is the one

    def __post_init__(self) -> None:
        if not self.eos_ids and self.eos_id is not None:
            object.__setattr__(self, "eos_ids", (int(self.eos_id),))
        elif self.eos_ids and self.eos_id is None:
            object.__setattr__(self, "eos_id", self.eos_ids[0])

    @classmethod
    def from_config(cls, cfg, mask_id: int, eos_ids) -> LogitRules:
        """``eos_ids``: the batch's EOS ids (an :class:`~dllm.decoding.stopping.EosIds`, a sequence, an id or None)."""
        ids = (eos_ids,) if isinstance(eos_ids, int) else tuple(getattr(eos_ids, "ids", eos_ids) or ())
        banned = ((mask_id,) if cfg.suppress_mask_token else ()) + (ids if cfg.ignore_eos else ())
        return cls(banned, ids[0] if ids else None, cfg.min_tokens if ids else 0, cfg.min_p or None, ids)

    def apply(self, logits: torch.Tensor, first_slot: int, prompt_length: int | torch.Tensor) -> None:
        """In place, for logits [b, q, V] of slots [first_slot, first_slot + q)."""
        vocab = logits.shape[-1]  # an EOS id past it can never be chosen: nothing to suppress
        banned = [i for i in self.banned if i < vocab]
        if banned:
            logits[..., banned] = float("-inf")
        if self.min_tokens:
            slots = first_slot + torch.arange(logits.shape[1], device=logits.device)
            start = prompt_length[:, None] if torch.is_tensor(prompt_length) else prompt_length
            early = (slots[None, :] - start) < self.min_tokens  # [b or 1, q]
            ids = [i for i in self.eos_ids if i < vocab]
            if len(ids) == 1:
                eos = logits[..., ids[0]]
                logits[..., ids[0]] = torch.where(early, torch.full_like(eos, float("-inf")), eos)
            elif ids:
                eos = logits[..., ids]  # [b, q, number of EOS ids]
                logits[..., ids] = torch.where(early[..., None], torch.full_like(eos, float("-inf")), eos)
        if self.min_p:
            floor = logits.amax(-1, keepdim=True) + math.log(self.min_p)
            logits.masked_fill_(logits < floor, float("-inf"))


class ModelRunner:
    def __init__(self, model, *, prompt_length: int | torch.Tensor, key_valid: torch.Tensor,
                 rules: LogitRules | None = None) -> None:
        self.model = model
        self.rules = rules or LogitRules()
        self.prompt_length = prompt_length
        self.key_valid = key_valid  # [batch, slots] bool over the whole canvas
        self._padding: tuple | None = None  # (key_valid, its version, whether it holds padding)
        self.shift = bool(model.spec.logit_shift)
        self.forward_seconds = 0.0
        self.forwards = 0
        self._sync = key_valid.device.type == "cuda"

    def _call(self, first_slot: int, **kwargs) -> torch.Tensor:
        """Logits of one forward, whose columns are the canvas slots from ``first_slot`` on."""
        if self._sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = self.model(**kwargs).logits
        if self._sync:
            torch.cuda.synchronize()
        self.forward_seconds += time.perf_counter() - t0
        self.forwards += 1
        self.rules.apply(logits, first_slot, self.prompt_length)
        return logits

    def _has_padding(self) -> bool:
        """Whether the canvas holds left padding, asked once per ``key_valid`` tensor rather than once per
        forward (on a GPU the answer is a host synchronisation)."""
        known = recalled_padding(self._padding, self.key_valid)
        if known is None:
            self._padding = padding_memo(self.key_valid)
            known = self._padding[2]
        return known

    def select_rows(self, index: torch.Tensor) -> None:
        self.key_valid = self.key_valid.index_select(0, index)
        if torch.is_tensor(self.prompt_length):  # per-row prompt ends (rows joined the batch)
            self.prompt_length = self.prompt_length.index_select(0, index)

    def full(self, x: torch.Tensor, *, logits_from: int = 0, cache: DiffusionKVCache | None = None,
             key_valid: torch.Tensor | None = None, **model_kwargs) -> torch.Tensor:
        """Logits of slots [logits_from, len(x)) from a forward over the whole (prefix of the) canvas."""
        t = x.shape[1]
        if cache is not None:
            return self._call(logits_from, input_ids=x, kv_cache=cache, cache_mode="fill",
                              logits_range=(logits_from, t), **model_kwargs)
        kv = self.key_valid if key_valid is None else key_valid
        if (kv is self.key_valid or kv._base is self.key_valid) and not self._has_padding():
            kv = None  # rows of an unpadded canvas: no mask to build and no padding check in the model
        else:
            kv = kv[:, :t]
        return self._call(logits_from, input_ids=x, attention_mask=kv, prompt_length=self.prompt_length,
                          logits_range=(logits_from, t), **model_kwargs)

    def cached(self, x: torch.Tensor, *, start: int, end: int, cache: DiffusionKVCache, mode: str,
               logits_end: int | None = None, **model_kwargs) -> torch.Tensor:
        """Logits of slots [start, logits_end or end) from a cached forward of input slots [start, end).

        ``mode`` is ``prefix`` (attend to cached [0, start) + the input) or ``replace`` (the input
        overwrites its slots in the cache; attend to the whole cached canvas).
        """
        logits_end = end if logits_end is None else logits_end
        feed_from = start - 1 if self.shift and start > 0 else start
        offset = start - feed_from
        return self._call(
            start, input_ids=x[:, feed_from:end], kv_cache=cache, cache_mode=mode, cache_start=feed_from,
            logits_range=(offset, offset + logits_end - start), **model_kwargs,
        )
