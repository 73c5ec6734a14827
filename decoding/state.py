"""The canvas of a batch being decoded, its bookkeeping, stopping, and the output object.

Slots ``[0, P)`` hold the (left-padded) prompts, ``[P, P+G)`` the generated region. Rows that
finish (EOS with everything before it filled, or a stop string) leave the batch so they stop
costing compute; their results are written to the output buffers at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dllm.generation.config import DiffusionGenerationConfig


@dataclass
class DiffusionGenerateOutput:
    sequences: torch.Tensor  # [batch, P + G]: prompt + completion (tail after EOS filled with EOS)
    num_forwards: torch.Tensor  # [batch] forwards this row took part in (a LoPA round counts once)
    generated_tokens: torch.Tensor  # [batch] tokens up to and including the first EOS
    tpf: torch.Tensor  # [batch] generated_tokens / num_forwards
    step_map: torch.Tensor  # [batch, G]: the row's forward (1-based) that committed each slot; -1 never
    finish_reason: list[str]  # "stop" (EOS / stop string) or "length"
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
        g = cfg.max_new_tokens
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
        self.step_map = torch.full((b, g), -1, dtype=torch.long, device=dev)
        from decoding.streaming import BatchStreamer

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

    def commit(self, start: int, transfer: torch.Tensor, tokens: torch.Tensor) -> None:
        """Write ``tokens`` where ``transfer`` is set, in slots [start, start + transfer.shape[1])."""
        end = start + transfer.shape[1]
        span = self.x[:, start:end]
        self.x[:, start:end] = torch.where(transfer, tokens.to(span.dtype), span)
        skip = max(0, self.P - start)  # a span may begin inside the prompt (D2F's first forward)
        g0, g1 = start + skip - self.P, end - self.P
        sm = self.step_map[:, g0:g1]
        self.step_map[:, g0:g1] = torch.where(transfer[:, skip:], self.nfe[:, None].expand_as(sm), sm)
        self._after_commit()

    def _after_commit(self) -> None:
        gen = self.x[:, self.P:]
        filled = gen != self.mask_id
        prefix_len = torch.where(filled.all(-1), self.G, (~filled).long().argmax(-1))  # contiguous committed prefix
        done = torch.zeros(self.live, dtype=torch.bool, device=self.x.device)
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
        """Retire rows that finished at the last commit; returns kept local indices, or None if none left."""
        done, self.pending_done = self.pending_done, None
        if done is None or not bool(done.any()):
            return None
        cancelled, self.cancelled = self.cancelled, None
        if cancelled is not None and bool(cancelled.any()):
            keep = self.retire(cancelled, reason="cancelled")
            done = done[keep]
            if not bool(done.any()):
                return keep
            return keep[self.retire(done, reason="stop")]
        return self.retire(done, reason="stop")

    def _stream(self, prefix_len: torch.Tensor) -> None:
        for r in range(self.live):
            end = int(prefix_len[r])
            gen = self.x[r, self.P:]
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
            gen = row[self.P:]
            if reason == "stop" and self.eos_id is not None:
                eos = (gen == self.eos_id).nonzero()
                if len(eos):
                    gen[int(eos[0]):] = self.eos_id
                elif self.cfg.stop_strings:  # stopped by a string: nothing after the committed prefix
                    masked = (gen == self.mask_id).nonzero()
                    if len(masked):
                        gen[int(masked[0]):] = self.eos_id
            row_reason = reason
            if reason == "length" and self.eos_id is not None and bool((gen == self.eos_id).any()):
                row_reason = "stop"  # ran to the end of its budget, but the text did end with EOS
            gen[gen == self.mask_id] = self.eos_id if self.eos_id is not None else self.mask_id
            self.out_x[orig] = row
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
        return keep

    def finish(self, *, total_seconds: float, forward_seconds: float, stats: dict | None = None) -> DiffusionGenerateOutput:
        if self.live:
            self.retire(torch.ones(self.live, dtype=torch.bool, device=self.x.device), reason="length")
        if self.streamer is not None:
            self.streamer.end()
        gen = self.out_x[:, self.P:]
        if self.eos_id is not None:
            is_eos = gen == self.eos_id
            first = torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1, torch.full_like(is_eos[:, 0], self.G, dtype=torch.long))
        else:
            first = torch.full((gen.shape[0],), self.G, dtype=torch.long, device=gen.device)
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
