"""LLaDA-style masked-diffusion SFT (bidirectional), and block-diffusion SFT for block-causal models."""

from __future__ import annotations

from pathlib import Path

import torch

from .config import SFTConfig, to_dict
from .data import Batch
from .engine import Trainer
from .models import export_model, generation_defaults, init_model, load_tokenizer_for
from .objectives import sft_loss, sft_noise


class SFTTrainer(Trainer):
    """Answer tokens masked i.i.d. with p = (1-eps) t + eps, CE / p normalised by answer length.

    With ``model.attention_policy=block_causal`` (or a block-causal checkpoint) the same objective
    runs under the block-causal mask with ``prompt_length=P`` (block-diffusion SFT); answers are then
    padded to whole blocks.
    """

    config_class = SFTConfig
    name = "sft"

    def setup_models(self) -> None:
        self.tokenizer = load_tokenizer_for(self.cfg.model)
        self.model = init_model(self.cfg.model, self.tokenizer)

    def block_size(self) -> int | None:
        spec = self.model.spec
        return spec.block_size if spec.attention_policy == "block_causal" else None

    def pad_multiple(self) -> int:
        return self.block_size() or 1

    def eval_block_size(self) -> int | None:
        return self.block_size()

    def compute_loss(self, model, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        noisy, masked, p_mask = sft_noise(batch.input_ids, batch.answer_mask, self.mask_id(), generator,
                                          self.cfg.mask_eps, self.cfg.full_mask_prob, self.cfg.t_min,
                                          self.cfg.prefix_prob)
        p = batch.prompt_length
        logits = model(noisy, attention_mask=batch.attention_mask, prompt_length=p,
                       logits_range=(p, noisy.shape[1])).logits
        answer_lengths = batch.answer_mask.sum(dim=1)
        return sft_loss(logits, batch.input_ids[:, p:], masked[:, p:], p_mask[:, p:], answer_lengths)

    def export(self, model, out_dir: Path) -> None:
        info = {"trainer": self.name, "steps": self.cfg.max_steps, "config": to_dict(self.cfg)}
        export_model(model, self.tokenizer, out_dir,
                     generation_defaults(self.tokenizer, self.cfg.data.max_new_tokens, self.block_size()), info,
                     state_dict=self.export_state_dict)
