"""The canvas of a batch being decoded: its rows, their committed tokens and forward counts.

Slots ``[0, P)`` hold the (left-padded) prompts, ``[P, P+G)`` the generated region. After every commit
the rows' final prefixes go to the streamers and to :class:`~dllm.decoding.stopping.Stopping`; rows that
finish (EOS with everything before it filled, ``max_new_tokens``, a stop string or criterion, a cancel)
leave the batch at :meth:`DecodeState.pop_finished`, so they stop costing compute, and their results go to
:class:`~dllm.decoding.output.Outputs` at once.

Rows may also *join* a running batch (continuous batching): :meth:`DecodeState.add_incoming` queues
prompts (``DecodeSession.add_rows``) and a loop that supports it places them at its join points
(:func:`dllm.decoding.joining.poll` -> :meth:`admit`). From the first join on, every row has its own
generated region ``[gstart[r], gstart[r] + G)`` of a canvas that grows to the right (and is trimmed on
the left when no live row uses the leading slots); its prompt sits right before ``gstart[r]`` and every
slot outside ``[prompt start, gstart[r] + G)`` is invalid for it (``key_valid`` False), so RoPE positions
and attention are those of the row run alone. A joined row gets the next row index (``batch``,
``batch + 1``, ...) and its result is part of the output.

Options that may differ per row (``Strategy.row_options``, e.g. ``threshold``) live in ``row_values``,
one value per live row; :meth:`option` returns the per-row column or the config's value.
"""

from __future__ import annotations

import torch

from .kernels.confidence import GREEDY_BELOW
from .output import DiffusionGenerateOutput, Outputs
from .stopping import EosIds, Stopping

__all__ = ["DecodeState", "DiffusionGenerateOutput"]


class DecodeState:
    def __init__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cfg,
        *,
        mask_id: int,
        eos_ids: int | tuple[int, ...] | list[int] | None,
        tokenizer=None,
        streamer=None,
        strategy=None,
        criteria=(),
        row_values: dict[str, torch.Tensor] | None = None,
    ) -> None:
        b, p = input_ids.shape
        g = cfg.canvas_tokens  # whole blocks; the answer is the first ``limit`` slots of it
        self.limit = cfg.max_new_tokens
        dev = input_ids.device
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        self.cfg = cfg
        self.strategy = strategy
        self.P, self.G = p, g
        self.mask_id = mask_id
        # Every id that ends an answer (``eos.tensor`` holds them on the canvas's device; ``eos.match(x)``
        # tests a tensor); ``eos_id`` is the first, the one that pads a finished answer (None: no EOS).
        self.eos = EosIds((eos_ids,) if isinstance(eos_ids, int) else (eos_ids or ()), device=dev)
        self.eos_id = self.eos.first
        self.tokenizer = tokenizer
        self.x = torch.cat([input_ids, torch.full((b, g), mask_id, dtype=input_ids.dtype, device=dev)], 1)
        self.key_valid = torch.cat([attention_mask.bool(), torch.ones(b, g, dtype=torch.bool, device=dev)], 1)
        self.rows = torch.arange(b, device=dev)  # original index of each live row
        self.nfe = torch.zeros(b, dtype=torch.long, device=dev)
        self.forward_calls = 0  # count_forward calls: an upper bound of every row's nfe, known on the host
        self.step_map = torch.full((b, g), -1, dtype=torch.long, device=dev)
        self.row_values = {k: torch.as_tensor(v, device=dev).reshape(b) for k, v in (row_values or {}).items()}
        # some row samples (temperature > 0): set once, from the host values, so no step syncs to ask
        self.may_sample = _samples(cfg.temperature, (row_values or {}).get("temperature"))
        from .streaming import BatchStreamer

        self.batch_streamer = streamer if isinstance(streamer, BatchStreamer) else None
        self.streamer = None if self.batch_streamer is not None else streamer
        self.streamed = torch.zeros(b, dtype=torch.long, device=dev)  # tokens already streamed, per live row
        self.stopping = Stopping(cfg, limit=self.limit, eos=self.eos, tokenizer=tokenizer, criteria=criteria)
        self.pending_done: torch.Tensor | None = None
        self.cancelled: torch.Tensor | None = None
        # Per live row, how many leading generated slots are final (None: every committed token is).
        # Token editing may still change committed tokens of the current block (see set_final).
        self.final_len: torch.Tensor | None = None
        self.outputs = Outputs(self.x, self.step_map, prompt_length=p, limit=self.limit, eos=self.eos,
                               mask_id=mask_id, fill_id=self.fill_id)
        # continuous batching (see admit): whether this call's loop takes new rows, and those waiting
        self.joining = False
        # a joinable loop's answer, at each yield: do rows added now join before the next forward? (False while
        # a loop that takes rows at block boundaries is inside a block)
        self.join_ready = True
        self.join_max_spread_blocks: float | None = None
        self.incoming: list[tuple[list[int], dict]] = []
        self.gstart: torch.Tensor | None = None
        self.num_rows = b  # rows so far, joined ones included (the next joined row gets this index)
        if self.streamer is not None:
            if b != 1:
                raise ValueError("a streamer needs batch size 1 (as in transformers)")
            streamer.put(input_ids[0].cpu())

    # -- queries -------------------------------------------------------------------------
    @property
    def live(self) -> int:
        return self.x.shape[0]

    def masked(self, start: int, end: int) -> torch.Tensor:
        return self.x[:, start:end] == self.mask_id

    def temperature(self):
        """The sampling temperature: the config's, or a [live, 1] column where rows set their own and one
        of them samples (a batch of greedy rows keeps the plain argmax, with no noise drawn)."""
        t = self.option("temperature")
        return t if not torch.is_tensor(t) or self.may_sample else 0.0

    def option(self, name: str):
        """``name``'s value: a [live, 1] column where rows have their own values, else the config's."""
        values = self.row_values.get(name)
        return getattr(self.cfg, name) if values is None else values[:, None]

    # -- updates -------------------------------------------------------------------------
    def count_forward(self, rows: torch.Tensor | None = None) -> None:
        """One forward for the rows flagged (default: all live rows)."""
        self.nfe += 1 if rows is None else rows.long()
        self.forward_calls += 1

    def commit(self, start: int, transfer: torch.Tensor, tokens: torch.Tensor) -> None:
        """Write ``tokens`` where ``transfer`` is set, in slots [start, start + transfer.shape[1])."""
        end = start + transfer.shape[1]
        span = self.x[:, start:end]
        self.x[:, start:end] = torch.where(transfer, tokens.to(span.dtype), span)
        if self.gstart is not None:  # rows joined: each row's generated region starts elsewhere
            gi = torch.arange(start, end, device=self.x.device)[None, :] - self.gstart[:, None]
            hit = transfer & (gi >= 0) & (gi < self.G)
            r, c = hit.nonzero(as_tuple=True)
            self.step_map[r, gi[r, c]] = self.nfe[r]
        else:
            skip = max(0, self.P - start)  # a span may begin inside the prompt (D2F's first forward)
            g0, g1 = start + skip - self.P, end - self.P
            sm = self.step_map[:, g0:g1]
            self.step_map[:, g0:g1] = torch.where(transfer[:, skip:], self.nfe[:, None].expand_as(sm), sm)
        self._after_commit()

    def set_final(self, final_len: torch.Tensor) -> None:
        """Per live row, the number of leading generated slots that are final, for a strategy that may
        still change committed tokens (token editing changes them inside the current block). Stopping
        (EOS, stop strings, ``max_new_tokens``) and streaming then only look at final slots."""
        self.final_len = final_len
        self._after_commit()

    def extend_canvas(self, slots: int) -> None:
        """Append ``slots`` masked slots to every row, before anything is committed: a strategy whose
        blocks do not start at the first generated slot needs the canvas to reach its last block's end."""
        if slots <= 0:
            return
        b, dev = self.x.shape[0], self.x.device
        self.x = torch.cat([self.x, torch.full((b, slots), self.mask_id, dtype=self.x.dtype, device=dev)], 1)
        self.key_valid = torch.cat([self.key_valid, torch.ones(b, slots, dtype=torch.bool, device=dev)], 1)
        self.step_map = torch.cat([self.step_map, torch.full((b, slots), -1, dtype=torch.long, device=dev)], 1)
        self.outputs.widen(self.x, self.step_map)
        self.G += slots

    def _gen(self) -> torch.Tensor:
        """The generated region of every live row [live, G]."""
        if self.gstart is None:
            return self.x[:, self.P:]
        return self.x.gather(1, self.gstart[:, None] + torch.arange(self.G, device=self.x.device)[None, :])

    def _gen_start(self, r: int) -> int:
        return self.P if self.gstart is None else int(self.gstart[r])

    def _after_commit(self) -> None:
        gen = self._gen()
        filled = gen != self.mask_id
        prefix_len = torch.where(filled.all(-1), self.G, (~filled).long().argmax(-1))  # contiguous committed prefix
        if self.final_len is not None:
            prefix_len = torch.minimum(prefix_len, self.final_len)
        if self.streamer is not None or self.batch_streamer is not None:
            self._stream(gen, prefix_len)
        self.pending_done, self.cancelled = self.stopping.check(gen, prefix_len, self.rows)

    def _stream(self, gen: torch.Tensor, prefix_len: torch.Tensor) -> None:
        # Every row at once: each row's streamable end (its final prefix, up to the answer's length and its
        # first EOS), then one host copy of the ends and starts, and a host loop only over rows with new tokens.
        end = prefix_len.clamp(max=self.limit)
        if self.eos:
            is_eos = self.eos.match(gen)
            end = torch.minimum(end, torch.where(is_eos.any(-1), is_eos.long().argmax(-1), gen.shape[1]))
        end = end.to(self.streamed.dtype)
        new = end > self.streamed
        moved = new.nonzero().flatten().tolist()
        if not moved:
            return
        ends, starts, rows = end.tolist(), self.streamed.tolist(), self.rows.tolist()
        for r in moved:
            start, stop = starts[r], ends[r]
            if self.streamer is not None:
                self.streamer.put(gen[r, start:stop].cpu())
            else:
                self.batch_streamer.put_row(rows[r], gen[r, start:stop].tolist())
        self.streamed = torch.where(new, end, self.streamed)

    def pop_finished(self) -> torch.Tensor | None:
        """Retire rows that finished at the last commit, and stuck rows (see :meth:`stuck`).

        Returns the kept local indices, or None if no row left.
        """
        no = torch.zeros(self.live, dtype=torch.bool, device=self.x.device)
        done, self.pending_done = self.pending_done, None
        cancelled, self.cancelled = self.cancelled, None
        done = no if done is None else done
        cancelled = no if cancelled is None else cancelled  # already part of done
        stuck = self.stuck() & ~done
        if not bool((done | stuck).any()):
            return None
        keep = torch.arange(self.live, device=self.x.device)
        for rows, reason in ((cancelled, "cancelled"), (done & ~cancelled, "stop"), (stuck, "step_limit")):
            rows = rows[keep]
            if bool(rows.any()):
                keep = keep[self.retire(rows, reason=reason)]
        return keep

    def stuck(self) -> torch.Tensor:
        """Live rows that used their ``cfg.step_limit()`` forwards and still have masked slots.

        A row gets there only when its forwards stop committing real tokens (a model whose argmax
        is ``[MASK]``, with ``suppress_mask_token=False``); it then ends ``"step_limit"`` while the
        other rows go on, where the references would loop (the D2F one until its 10,001-step cap).
        """
        cap = self.cfg.step_limit()
        if self.forward_calls < cap:  # no row can be there yet: skip the device round trip
            return torch.zeros(self.live, dtype=torch.bool, device=self.x.device)
        return (self.nfe >= cap) & (self._gen() == self.mask_id).any(-1)

    def retire(self, done: torch.Tensor, reason: str) -> torch.Tensor:
        """Move finished rows to the outputs; returns the kept local indices (for caches etc.)."""
        idx = done.nonzero().flatten()
        gone = []
        for r in idx.tolist():
            orig = int(self.rows[r])
            row_reason = self.outputs.store(orig, self.x[r].clone(), self._gen_start(r), self.nfe[r], self.step_map[r],
                                            reason, own_regions=self.gstart is not None)
            gone.append(orig)
            if self.batch_streamer is not None:
                self.batch_streamer.end_row(orig, row_reason, num_forwards=int(self.nfe[r]))
        self.stopping.forget(gone)
        keep = (~done).nonzero().flatten()
        self.x = self.x[keep]
        self.key_valid = self.key_valid[keep]
        self.rows = self.rows[keep]
        self.nfe = self.nfe[keep]
        self.step_map = self.step_map[keep]
        self.streamed = self.streamed[keep]
        self.row_values = {k: v[keep] for k, v in self.row_values.items()}
        if self.gstart is not None:
            self.gstart = self.gstart[keep]
        if self.final_len is not None:
            self.final_len = self.final_len[keep]
        return keep

    # -- continuous batching -------------------------------------------------------------
    def add_incoming(self, prompts: list[list[int]], values: dict | None = None) -> range:
        """Queue rows for the loop's next join point; returns their row indices."""
        first = self.num_rows + len(self.incoming)
        self.incoming += [(list(p), dict(values or {})) for p in prompts]
        return range(first, first + len(prompts))

    def row_spans(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per live row: its first valid slot and the end of its generated region."""
        first = self.key_valid.long().argmax(-1)
        g0 = self.gstart if self.gstart is not None else torch.full_like(first, self.P)
        return first, g0 + self.G

    @property
    def fill_id(self) -> int:
        """Token for slots no row uses (never the mask token: masked slots are decoding candidates)."""
        for tok in (self.cfg.pad_token_id, self.eos_id):
            if tok is not None and tok != self.mask_id:
                return int(tok)
        return 0 if self.mask_id != 0 else 1

    def admit(self, place_at: int) -> tuple[int, int]:
        """Place the incoming rows with prompts ending at slot ``place_at`` (their generated regions start there).

        The canvas is re-laid out to cover exactly the live rows' spans: slots no live row uses are
        dropped on the left, invalid slots are added where a new prompt or region needs them.
        Returns ``(rows added, shift d)``: old slot ``s`` is now ``s - d`` (callers move their slot
        indices, caches and plans by it). New rows start with no forwards counted.
        """
        incoming, self.incoming = self.incoming, []
        if not incoming:
            return 0, 0
        prompts = [p for p, _ in incoming]
        dev = self.x.device
        n, g = len(prompts), self.G
        lengths = [len(p) for p in prompts]
        width = self.x.shape[1]
        if self.gstart is None:
            self.gstart = torch.full((self.live,), self.P, dtype=torch.long, device=dev)
        left, right = place_at - max(lengths), place_at + g
        if self.live:
            first, ends = self.row_spans()
            left, right = min(left, int(first.min())), max(right, int(ends.max()))
        new_w = right - left
        x = torch.full((self.live + n, new_w), self.fill_id, dtype=self.x.dtype, device=dev)
        kv = torch.zeros((self.live + n, new_w), dtype=torch.bool, device=dev)
        lo, hi = max(left, 0), min(right, width)  # the old slots kept
        x[: self.live, lo - left: hi - left] = self.x[:, lo:hi]
        kv[: self.live, lo - left: hi - left] = self.key_valid[:, lo:hi]
        g_new = place_at - left
        for i, p in enumerate(prompts):
            r = self.live + i
            x[r, g_new - len(p): g_new] = torch.tensor(p, dtype=self.x.dtype, device=dev)
            x[r, g_new: g_new + g] = self.mask_id
            kv[r, g_new - len(p): g_new + g] = True
        self.outputs.add_rows(self.num_rows, prompts)
        self.x, self.key_valid = x, kv
        self.gstart = torch.cat([self.gstart - left, torch.full((n,), g_new, dtype=torch.long, device=dev)])
        self.rows = torch.cat([self.rows, torch.arange(self.num_rows, self.num_rows + n, device=dev)])
        zeros = torch.zeros(n, dtype=torch.long, device=dev)
        self.nfe = torch.cat([self.nfe, zeros])
        self.streamed = torch.cat([self.streamed, zeros])
        self.step_map = torch.cat([self.step_map, torch.full((n, g), -1, dtype=torch.long, device=dev)])
        for name, values in self.row_values.items():
            new = [v.get(name, getattr(self.cfg, name)) for _, v in incoming]
            self.row_values[name] = torch.cat([values, torch.tensor(new, dtype=values.dtype, device=dev)])
            if name == "temperature":
                self.may_sample = self.may_sample or _samples(0.0, new)
        self.num_rows += n
        return n, left

    def finish(self, *, total_seconds: float, forward_seconds: float, stats: dict | None = None) -> DiffusionGenerateOutput:
        if self.live:
            self.retire(torch.ones(self.live, dtype=torch.bool, device=self.x.device), reason="length")
        if self.streamer is not None:
            self.streamer.end()
        return self.outputs.result(total_seconds=total_seconds, forward_seconds=forward_seconds, stats=stats)


def _samples(default: float, values) -> bool:
    """Whether a batch with config temperature ``default`` and per-row ``values`` (host numbers, a tensor on
    the host, or None) samples any row."""
    if values is None:
        return default >= GREEDY_BELOW
    return any(float(v) >= GREEDY_BELOW for v in (values.tolist() if torch.is_tensor(values) else values))
