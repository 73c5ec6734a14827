"""Output assembly: each finished row's result, by its original index, and the call's
:class:`DiffusionGenerateOutput`."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .stopping import EosIds


@dataclass
class DiffusionGenerateOutput:
    sequences: torch.Tensor  # [batch, P + G]: prompt + completion (tail after EOS filled with the first EOS id)
    num_forwards: torch.Tensor  # [batch] forwards this row took part in (a LoPA round counts once)
    generated_tokens: torch.Tensor  # [batch] tokens up to and including the first EOS (any EOS id)
    tpf: torch.Tensor  # [batch] generated_tokens / num_forwards
    step_map: torch.Tensor  # [batch, G]: the row's forward (1-based) that committed each slot; -1 never
    finish_reason: list[str]  # "stop" (EOS / stop string), "length", "step_limit" (max_steps), "cancelled"
    timings: dict = field(default_factory=dict)  # total_seconds, forward_seconds
    stats: dict = field(default_factory=dict)  # strategy-specific counters (e.g. LoPA winners)
    eos_token_ids: tuple[int, ...] = ()  # the EOS ids the rows stopped at (any of them), the first the padding

    def __getitem__(self, key: str):
        return getattr(self, key)


class Outputs:
    """Results of finished rows. Rows of the first batch keep its layout (prompt slots ``[0, P)``); rows that
    joined later are assembled at the end with every prompt left-padded to the longest."""

    def __init__(self, x: torch.Tensor, step_map: torch.Tensor, *, prompt_length: int, limit: int,
                 eos: EosIds, mask_id: int, fill_id: int) -> None:
        self.P, self.G, self.limit = prompt_length, step_map.shape[1], limit
        self.eos, self.mask_id, self.fill_id = eos, mask_id, fill_id
        self.x = x.clone()
        self.step_map = step_map.clone()
        self.nfe = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        self.finish_reason = ["length"] * x.shape[0]
        self.joined_prompts: dict[int, list[int]] = {}
        self.joined_gen: dict[int, torch.Tensor] = {}

    def widen(self, x: torch.Tensor, step_map: torch.Tensor) -> None:
        """The canvas grew before anything was committed (see ``DecodeState.extend_canvas``)."""
        self.x, self.step_map, self.G = x.clone(), step_map.clone(), step_map.shape[1]

    def add_rows(self, first: int, prompts: list[list[int]]) -> None:
        n, dev = len(prompts), self.nfe.device
        for i, p in enumerate(prompts):
            self.joined_prompts[first + i] = list(p)
        self.nfe = torch.cat([self.nfe, torch.zeros(n, dtype=torch.long, device=dev)])
        self.step_map = torch.cat([self.step_map, torch.full((n, self.G), -1, dtype=torch.long, device=dev)])
        self.finish_reason += ["length"] * n

    def store(self, orig: int, row: torch.Tensor, gen_start: int, nfe: torch.Tensor, step_map: torch.Tensor,
              reason: str, own_regions: bool) -> str:
        """Keep row ``orig``'s result (``row``: its canvas, which is modified); returns its finish reason.

        ``own_regions``: rows have their own generated regions (some row joined), so only the region is kept.
        """
        gen = row[gen_start: gen_start + self.G]
        # The padding id is the first EOS id whichever one ended the row: one fixed id for every
        # finished tail (and for one EOS id, that id, as before); the committed EOS itself stays.
        pad = self.eos.first
        if reason == "stop" and pad is not None:
            eos = self.eos.match(gen).nonzero()
            if len(eos):
                gen[int(eos[0]) + 1:] = pad
            else:  # stopped by a string or a criterion: nothing after the committed prefix
                masked = (gen == self.mask_id).nonzero()
                if len(masked):
                    gen[int(masked[0]):] = pad
        # the answer is gen[:limit]; slots past it only round the canvas up to whole blocks
        has_eos = pad is not None and bool(self.eos.match(gen[: self.limit]).any())
        if reason == "length" and has_eos:
            reason = "stop"  # ran to the end of its budget, but the text did end with EOS
        elif reason == "stop" and self.limit < self.G and not has_eos:
            reason = "length"  # filled its max_new_tokens slots, or ended only past them
        gen[gen == self.mask_id] = pad if pad is not None else self.mask_id
        if not own_regions:
            self.x[orig] = row
        elif orig < self.x.shape[0]:
            self.x[orig, self.P:] = gen
        else:
            self.joined_gen[orig] = gen.clone()
        self.nfe[orig] = nfe
        self.step_map[orig] = step_map
        self.finish_reason[orig] = reason
        return reason

    def result(self, *, total_seconds: float, forward_seconds: float, stats: dict | None = None) -> DiffusionGenerateOutput:
        if self.joined_prompts:
            self._assemble_joined()
        x, step_map = self.x, self.step_map
        if self.limit < self.G:  # cut the canvas back to max_new_tokens
            x = x[:, : x.shape[1] - self.G + self.limit]
            step_map = step_map[:, : self.limit]
        gen = x[:, -self.limit:]
        full = torch.full((gen.shape[0],), self.limit, dtype=torch.long, device=gen.device)
        if self.eos:
            is_eos = self.eos.match(gen)
            first = torch.where(is_eos.any(-1), is_eos.long().argmax(-1) + 1, full)
        else:
            first = full
        return DiffusionGenerateOutput(
            sequences=x, num_forwards=self.nfe, generated_tokens=first,
            tpf=first.double() / self.nfe.clamp(min=1).double(), step_map=step_map,
            finish_reason=self.finish_reason,
            timings={"total_seconds": total_seconds, "forward_seconds": forward_seconds}, stats=stats or {},
            eos_token_ids=self.eos.ids,
        )

    def _assemble_joined(self) -> None:
        """Output rows for every row, joined ones included: prompts left-padded to the longest."""
        b0, rows = self.x.shape[0], len(self.finish_reason)
        p_out = max([self.P] + [len(p) for p in self.joined_prompts.values()])
        out = torch.full((rows, p_out + self.G), self.fill_id, dtype=self.x.dtype, device=self.x.device)
        out[:b0, p_out - self.P:] = self.x
        for orig, prompt in self.joined_prompts.items():
            out[orig, p_out - len(prompt): p_out] = torch.tensor(prompt, dtype=out.dtype, device=out.device)
            out[orig, p_out:] = self.joined_gen[orig]
        self.x = out
