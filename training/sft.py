"""LLaDA-style masked-diffusion SFT (bidirectional), and block-diffusion SFT for block-causal models."""

from __future__ import annotations

from pathlib import Path

import torch

from dllm.tokenization import EMPTY_DIGIT, TAG_CLOSE, TAG_OPEN

from .config import ConfigError, SFTConfig, to_dict
from .data import Batch
from .engine import Trainer
from .models import export_model, generation_defaults, init_model, load_tokenizer_for
from .objectives import result_slots, sft_loss, sft_noise


def result_token_ids(tokenizer, triggers: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Ids of the vocabulary's trigger tokens (text, word-start marker removed, in ``triggers``) and
    of its number tokens (digits, the empty-digit pad and number tags, so a result's tag is masked
    with its digits rather than left to give them away); ConfigError when either set is empty."""
    trig, num = [], []
    for text, i in tokenizer.get_vocab().items():
        bare = text.lstrip("\u2581\u0120")  # SentencePiece / byte-level word-start markers
        if bare in triggers:
            trig.append(i)
        elif bare and all(c in NUMBER_CHARS for c in bare):
            num.append(i)
    if not trig or not num:
        raise ConfigError(f"result_mask_prob: the tokenizer has no {'trigger' if not trig else 'number'} tokens "
                         f"(result_triggers={triggers})")
    return torch.tensor(sorted(trig)), torch.tensor(sorted(num))


NUMBER_CHARS = frozenset("0123456789" + EMPTY_DIGIT + TAG_OPEN + TAG_CLOSE)


class SFTTrainer(Trainer):
    """Answer tokens masked i.i.d. with p = (1-eps) t + eps, CE / p normalised by answer length.

    With ``model.attention_policy=block_causal`` (or a block-causal checkpoint) the same objective
    runs under the block-causal mask with ``prompt_length=P`` (block-diffusion SFT); answers are then
    padded to whole blocks.
    """

    config_class = SFTConfig
    name = "sft"

    def setup_models(self) -> None:
        self.tokenizer = load_tokenizer_for(self.cfg.model, self.cfg.data.files, self.dataset_texts())
        self.model = init_model(self.cfg.model, self.tokenizer)
        self._result_ids = None
        if self.cfg.result_mask_prob > 0:  # fail before training, not at the first step
            self._result_ids = result_token_ids(self.tokenizer, self.cfg.result_triggers)

    def block_size(self) -> int | None:
        spec = self.model.spec
        return spec.block_size if spec.attention_policy == "block_causal" else None

    def pad_multiple(self) -> int:
        return self.block_size() or 1

    def eval_block_size(self) -> int | None:
        return self.block_size()

    def compute_loss(self, model, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        slots = None
        if self.cfg.result_mask_prob > 0:
            triggers, numbers = self._result_ids
            slots = result_slots(batch.input_ids, triggers.to(batch.input_ids.device),
                                 numbers.to(batch.input_ids.device))
        noisy, masked, p_mask = sft_noise(batch.input_ids, batch.answer_mask, self.mask_id(), generator,
                                          self.cfg.mask_eps, self.cfg.full_mask_prob, self.cfg.t_min,
                                          self.cfg.prefix_prob, self.cfg.result_mask_prob, slots)
        p = batch.prompt_length
        logits = model(noisy, attention_mask=batch.attention_mask, prompt_length=p,
                       logits_range=(p, noisy.shape[1])).logits
        answer_lengths = batch.answer_mask.sum(dim=1)
        return sft_loss(logits, batch.input_ids[:, p:], masked[:, p:], p_mask[:, p:], answer_lengths,
                        self.cfg.token_weight_gamma)

    def export(self, model, out_dir: Path) -> None:
        info = {"trainer": self.name, "steps": self.cfg.max_steps, "config": to_dict(self.cfg)}
        export_model(model, self.tokenizer, out_dir,
                     generation_defaults(self.tokenizer, self.cfg.data.max_new_tokens, self.block_size(),
                                         start=self.cfg.model.path), info,
                     state_dict=self.export_state_dict)
