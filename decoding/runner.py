"""The model runner: the only place a decoder calls the model. Counts and times every forward.

It hides two details from the loops: which cache operation a forward is, and Dream's logit shift
in cached forwards (to get the shifted logit of slot ``s`` the runner feeds from ``s - 1``).
"""

from __future__ import annotations

import time

import torch

from dllm.modeling.kv_cache import DiffusionKVCache


class ModelRunner:
    def __init__(self, model, *, prompt_length: int | torch.Tensor, key_valid: torch.Tensor, suppress_token: int | None = None) -> None:
        self.model = model
        self.suppress_token = suppress_token  # the mask id: committing [MASK] would be a no-op that loops forever
        self.prompt_length = prompt_length
        self.key_valid = key_valid  # [batch, slots] bool over the whole canvas
        self.shift = bool(model.spec.logit_shift)
        self.forward_seconds = 0.0
        self.forwards = 0
        self._sync = key_valid.device.type == "cuda"

    def _call(self, **kwargs) -> torch.Tensor:
        if self._sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            logits = self.model(**kwargs).logits
        if self._sync:
            torch.cuda.synchronize()
        self.forward_seconds += time.perf_counter() - t0
        self.forwards += 1
        if self.suppress_token is not None:
            logits[..., self.suppress_token] = float("-inf")
        return logits

    def select_rows(self, index: torch.Tensor) -> None:
        self.key_valid = self.key_valid.index_select(0, index)
        if torch.is_tensor(self.prompt_length):  # per-row prompt ends (rows joined the batch)
            self.prompt_length = self.prompt_length.index_select(0, index)

    def full(self, x: torch.Tensor, *, logits_from: int = 0, cache: DiffusionKVCache | None = None,
             key_valid: torch.Tensor | None = None, **model_kwargs) -> torch.Tensor:
        """Logits of slots [logits_from, len(x)) from a forward over the whole (prefix of the) canvas."""
        t = x.shape[1]
        if cache is not None:
            return self._call(input_ids=x, kv_cache=cache, cache_mode="fill", logits_range=(logits_from, t),
                              **model_kwargs)
        kv = (self.key_valid if key_valid is None else key_valid)[:, :t]
        return self._call(input_ids=x, attention_mask=kv, prompt_length=self.prompt_length,
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
            input_ids=x[:, feed_from:end], kv_cache=cache, cache_mode=mode, cache_start=feed_from,
            logits_range=(offset, offset + logits_end - start), **model_kwargs,
        )
