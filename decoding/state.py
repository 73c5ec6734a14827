"""The canvas of a batch being decoded, its bookkeeping, stopping, and the output object.

Slots ``[0, P)`` hold the (left-padded) prompts, ``[P, P+G)`` the generated region. Rows that
finish (EOS with everything before it filled, or a stop string) leave the batch so they stop
costing compute; their results are written to the output buffers at once.

Rows may also *join* a running batch (continuous batching, :meth:`DecodeState.admit`, driven by
``BatchStreamer.admit_rows`` in the loops that support it). From the first join on, every row has
its own generated region ``[gstart[r], gstart[r] + G)`` of a canvas that grows to the right (and
is trimmed on the left when no live row uses the leading slots); its prompt sits right before
``gstart[r]`` and every slot outside ``[prompt start, gstart[r] + G)`` is invalid for it
(``key_valid`` False), so RoPE positions and attention are those of the row run alone. A joined
row gets the next row index (``batch``, ``batch + 1``, ...) and its result is part of the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dllm.decoding.config import DiffusionGenerationConfig


@dataclass
class DiffusionGenerateOutput:
    sequences: torch.Tensor  # [batch, P + G]: prompt + completion (tail after EOS filled with EOS)
    num_forwards: torch.Tensor  # [batch] forwards this row took part in (a LoPA round counts once)
    generated_tokens: torch.Tensor  # [batch] tokens up to and including the first EOS
    tpf: torch.Tensor  # [batch] generated_tokens / num_forwards
    step_map: torch.Tensor  # [batch, G]: the row's forward (1-based) that committed each slot; -1 never
    finish_reason: list[str]  # "stop" (EOS / stop string), "length", "step_limit" (max_steps), "cancelled"
    timings: dict = field(default_factory=dict)  # total_seconds, forward_seconds
    stats: dict = field(default_factory=dict)  # strategy-specific counters (e.g. LoPA winners)

    def __getitem__(self, key: str):
        return getattr(self, key)


class DecodeState:
    def __init__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cfg: DiffusionGenerationConfig,
        *,
        mask_id: int,
        eos_id: int | None,
        tokenizer=None,
        streamer=None,
    ) -> None:
        b, p = input_ids.shape
        g = cfg.canvas_tokens  # whole blocks; the answer is the first ``limit`` slots of it
        self.limit = cfg.max_new_tokens
        dev = input_ids.device
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        self.cfg = cfg
        self.P, self.G = p, g
        self.mask_id, self.eos_id = mask_id, eos_id
        self.tokenizer = tokenizer
        self.x = torch.cat([input_ids, torch.full((b, g), mask_id, dtype=input_ids.dtype, device=dev)], 1)
        self.key_valid = torch.cat([attention_mask.bool(), torch.ones(b, g, dtype=torch.bool, device=dev)], 1)
        self.rows = torch.arange(b, device=dev)  # original index of each live row
        self.nfe = torch.zeros(b, dtype=torch.long, device=dev)
        self.forward_calls = 0  # count_forward calls: an upper bound of every row's nfe, known on the host
        self.step_map = torch.full((b, g), -1, dtype=torch.long, device=dev)
        from dllm.decoding.streaming import BatchStreamer

        self.batch_streamer = streamer if isinstance(streamer, BatchStreamer) else None
        self.streamer = None if self.batch_streamer is not None else streamer
        self.streamed = torch.zeros(b, dtype=torch.long, device=dev)  # tokens already streamed, per live row
        self.pending_done: torch.Tensor | None = None
        self.cancelled: torch.Tensor | None = None
        self._stop_checked = torch.zeros(b, dtype=torch.long, device=dev)
        # outputs, indexed by original row
        self.out_x = self.x.clone()
        self.out_nfe = torch.zeros(b, dtype=torch.long, device=dev)
        self.out_step_map = self.step_map.clone()
        self.finish_reason = ["length"] * b
        # continuous batching (see admit): per-row generation start, joined rows' prompts and results
        self.gstart: torch.Tensor | None = None
        self.num_rows = b  # rows so far, joined ones included (the next joined row gets this index)
        self.joined_prompts: dict[int, list[int]] = {}
        self.joined_gen: dict[int, torch.Tensor] = {}
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
            self._after_commit()
            return
        skip = max(0, self.P - start)  # a span may begin inside the prompt (D2F's first forward)
        g0, g1 = start + skip - self.P, end - self.P
        sm = self.step_map[:, g0:g1]
        self.step_map[:, g0:g1] = torch.where(transfer[:, skip:], self.nfe[:, None].expand_as(sm), sm)
        self._after_commit()

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
        done = torch.zeros(self.live, dtype=torch.bool, device=self.x.device)
        if self.limit < self.G:  # the slots past max_new_tokens only round the canvas up to whole blocks
            done |= prefix_len >= self.limit
        if self.eos_id is not None and self.cfg.stop_at_eos:
            is_eos = gen == self.eos_id
            has = is_eos.any(-1)
            first = is_eos.long().argmax(-1)
            eos_done = has & (prefix_len > first)
            done |= eos_done
        if self.cfg.stop_strings and self.tokenizer is not None:
            for r in range(self.live):
                if done[r] or prefix_len[r] == self._stop_checked[r]:
                    continue
                self._stop_checked[r] = prefix_len[r]
                text = self.tokenizer.decode(gen[r, : int(prefix_len[r])].tolist(), skip_special_tokens=True)
                if any(s in text for s in self.cfg.stop_strings):
                    done[r] = True
        if self.streamer is not None or self.batch_streamer is not None:
            self._stream(prefix_len)
        if self.batch_streamer is not None:
            cancelled = self.batch_streamer.cancelled_rows()
            if cancelled:
                self.cancelled = torch.tensor([int(r) in cancelled for r in self.rows], device=self.x.device)
                done |= self.cancelled
        self.pending_done = done

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

    def _stream(self, prefix_len: torch.Tensor) -> None:
        for r in range(self.live):
            end = min(int(prefix_len[r]), self.limit)
            g0 = self._gen_start(r)
            gen = self.x[r, g0 : g0 + self.G]
            if self.eos_id is not None:
                eos = (gen[:end] == self.eos_id).nonzero()
                if len(eos):
                    end = int(eos[0])
            start = int(self.streamed[r])
            if end > start:
                if self.streamer is not None:
                    self.streamer.put(gen[start:end].cpu())
                else:
                    self.batch_streamer.put_row(int(self.rows[r]), gen[start:end].tolist())
                self.streamed[r] = end

    def retire(self, done: torch.Tensor, reason: str) -> torch.Tensor:
        """Move finished rows to the outputs; returns the kept local indices (for caches etc.)."""
        idx = done.nonzero().flatten()
        for r in idx.tolist():
            orig = int(self.rows[r])
            row = self.x[r].clone()
            g0 = self._gen_start(r)
            gen = row[g0 : g0 + self.G]
            if reason == "stop" and self.eos_id is not None:
                eos = (gen == self.eos_id).nonzero()
                if len(eos):
                    gen[int(eos[0]):] = self.eos_id
                elif self.cfg.stop_strings:  # stopped by a string: nothing after the committed prefix
                    masked = (gen == self.mask_id).nonzero()
                    if len(masked):
                        gen[int(masked[0]):] = self.eos_id
            row_reason = reason
            ended = gen[: self.limit]  # the answer; slots past it only round the canvas up to whole blocks
            if reason == "length" and self.eos_id is not None and bool((ended == self.eos_id).any()):
                row_reason = "stop"  # ran to the end of its budget, but the text did end with EOS
            elif reason == "stop" and self.limit < self.G and not (
                    self.eos_id is not None and bool((ended == self.eos_id).any())):
                row_reason = "length"  # filled its max_new_tokens slots, or ended only past them
            gen[gen == self.mask_id] = self.eos_id if self.eos_id is not None else self.mask_id
            if self.gstart is None:
                self.out_x[orig] = row
            elif orig < self.out_x.shape[0]:
                self.out_x[orig, self.P:] = gen
            else:
                self.joined_gen[orig] = gen.clone()
            self.out_nfe[orig] = self.nfe[r]
            self.out_step_map[orig] = self.step_map[r]
            self.finish_reason[orig] = row_reason
            if self.batch_streamer is not None:
                self.batch_streamer.end_row(orig, row_reason, num_forwards=int(self.nfe[r]))
        keep = (~done).nonzero().flatten()
        self.x = self.x[keep]
        self.key_valid = self.key_valid[keep]
        self.rows = self.rows[keep]
        self.nfe = self.nfe[keep]
        self.step_map = self.step_map[keep]
        self._stop_checked = self._stop_checked[keep]
        self.streamed = self.streamed[keep]
        if self.gstart is not None:
            self.gstart = self.gstart[keep]
        return keep

    # -- continuous batching -------------------------------------------------------------
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

    def admit(self, prompts: list[list[int]], place_at: int) -> int:
        """Add rows whose prompts end at slot ``place_at`` (their generated regions start there).

        The canvas is re-laid out to cover exactly the live rows' spans: slots no live row uses are
        dropped on the left, invalid slots are added where a new prompt or region needs them.
        Returns the shift ``d`` of the slot numbering: old slot ``s`` is now ``s - d`` (callers move
        their slot indices, caches and plans by it). New rows start with no forwards counted.
        """
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
        x[: self.live, lo - left : hi - left] = self.x[:, lo:hi]
        kv[: self.live, lo - left : hi - left] = self.key_valid[:, lo:hi]
        g_new = place_at - left
        for i, p in enumerate(prompts):
            r = self.live + i
            x[r, g_new - len(p) : g_new] = torch.tensor(p, dtype=self.x.dtype, device=dev)
            x[r, g_new : g_new + g] = self.mask_id
            kv[r, g_new - len(p) : g_new + g] = True
            self.joined_prompts[self.num_rows + i] = list(p)
        self.x, self.key_valid = x, kv
        self.gstart = torch.cat([self.gstart - left, torch.full((n,), g_new, dtype=torch.long, device=dev)])
        new_idx = torch.arange(self.num_rows, self.num_rows + n, device=dev)
        self.rows = torch.cat([self.rows, new_idx])
        zeros = torch.zeros(n, dtype=torch.long, device=dev)
        self.nfe = torch.cat([self.nfe, zeros])
        self.streamed = torch.cat([self.streamed, zeros])
        self._stop_checked = torch.cat([self._stop_checked, zeros])
        self.step_map = torch.cat([self.step_map, torch.full((n, g), -1, dtype=torch.long, device=dev)])
        self.out_nfe = torch.cat([self.out_nfe, zeros])
        self.out_step_map = torch.cat([self.out_step_map, torch.full((n, g), -1, dtype=torch.long, device=dev)])
        self.finish_reason += ["length"] * n
        self.num_rows += n
        return left

    def finish(self, *, total_seconds: float, forward_seconds: float, stats: dict | None = None) -> DiffusionGenerateOutput:
        if self.live:
            self.retire(torch.ones(self.live, dtype=torch.bool, device=self.x.device), reason="length")
        if self.streamer is not None:
            self.streamer.end()
        if self.joined_prompts:
            self._assemble_joined()
        if self.limit < self.G:  # cut the canvas back to max_new_tokens
            self.out_x = self.out_x[:, : self.out_x.shape[1] - self.G + self.limit]
            self.out_step_map = self.out_step_map[:, : self.limit]
        gen = self.out_x[:, -self.limit:]
        if self.eos_id is not None:
            is_eos = gen == self.eos_id
            first = torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1,
                                torch.full_like(is_eos[:, 0], self.limit, dtype=torch.long))
        else:
            first = torch.full((gen.shape[0],), self.limit, dtype=torch.long, device=gen.device)
        tpf = first.double() / self.out_nfe.clamp(min=1).double()
        return DiffusionGenerateOutput(
            sequences=self.out_x,
            num_forwards=self.out_nfe,
            generated_tokens=first,
            tpf=tpf,
            step_map=self.out_step_map,
            finish_reason=self.finish_reason,
            timings={"total_seconds": total_seconds, "forward_seconds": forward_seconds},
            stats=stats or {},
        )

    def _assemble_joined(self) -> None:
        """Output rows for every row, joined ones included: prompts left-padded to the longest."""
        b0 = self.out_x.shape[0]
        p_out = max([self.P] + [len(p) for p in self.joined_prompts.values()])
        out = torch.full((self.num_rows, p_out + self.G), self.fill_id, dtype=self.out_x.dtype, device=self.out_x.device)
        out[:b0, p_out - self.P:] = self.out_x
        for orig, prompt in self.joined_prompts.items():
            out[orig, p_out - len(prompt) : p_out] = torch.tensor(prompt, dtype=out.dtype, device=out.device)
            out[orig, p_out:] = self.joined_gen[orig]
        self.out_x = out
