"""LLaDA-style masked-diffusion SFT (bidirectional), and block-diffusion SFT for block-causal models."""

from __future__ import annotations

from pathlib import Path

import torch

from dllm.tokenization import EMPTY_DIGIT, TAG_CLOSE, TAG_OPEN, special_token_ids

from .config import ConfigError, SFTConfig, to_dict
from .data import Batch
from .engine import Trainer
from .models import export_model, generation_defaults, init_model, load_tokenizer_for, lora_targets
from .objectives import result_slots, sft_loss, sft_noise, t2t_corrupt, t2t_loss


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
        raise ConfigError(f"result_mask_prob / result_cut_prob: the tokenizer has no {'trigger' if not trig else 'number'} tokens "
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
    shards_global_batch = True

    def setup_models(self) -> None:
        self.tokenizer = load_tokenizer_for(self.cfg.model, self.cfg.data.files, self.dataset_texts())
        self.check_memory()
        self.model = init_model(self.cfg.model, self.tokenizer)
        self.core = self.model
        if self.cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            lo = self.cfg.lora
            self.model = get_peft_model(self.model, LoraConfig(
                r=lo.r, lora_alpha=lo.alpha, lora_dropout=lo.dropout, bias="none",
                target_modules=lora_targets(self.core, lo.target_modules)))
        self._result_ids = None
        if self.cfg.result_mask_prob > 0 or self.cfg.result_cut_prob > 0:  # fail before training, not at step 1
            self._result_ids = result_token_ids(self.tokenizer, self.cfg.result_triggers)

    def memory_plan(self):
        return [self.model_cost(self.cfg.model, trainable=not self.cfg.lora.enabled)]

    def block_size(self) -> int | None:
        spec = self.core.spec
        return spec.block_size if spec.attention_policy == "block_causal" else None

    def pad_multiple(self) -> int:
        return self.block_size() or 1

    def eval_block_size(self) -> int | None:
        return self.block_size()

    def compute_loss(self, model, batch: Batch, generator: torch.Generator, rows: slice | None = None) -> torch.Tensor:
        """The loss of ``batch``; ``rows``: the noise is drawn for the whole batch and the loss is that of
        these rows (a process's share of a global batch, ``shard_global_batch``)."""
        slots = None
        if self.cfg.result_mask_prob > 0 or self.cfg.result_cut_prob > 0:
            triggers, numbers = self._result_ids
            slots = result_slots(batch.input_ids, triggers.to(batch.input_ids.device),
                                 numbers.to(batch.input_ids.device))
        noisy, masked, p_mask = sft_noise(batch.input_ids, batch.answer_mask, self.mask_id(), generator,
                                          self.cfg.mask_eps, self.cfg.full_mask_prob, self.cfg.t_min,
                                          self.cfg.prefix_prob, self.cfg.result_mask_prob, slots,
                                          self.cfg.result_cut_prob)
        visible = None
        if self.cfg.t2t_corrupt_prob > 0:
            noisy, visible = t2t_corrupt(noisy, masked, batch.answer_mask, self.cfg.t2t_corrupt_prob,
                                         len(self.tokenizer), self.mask_id(), generator)
        if rows is not None:
            batch, noisy, masked, p_mask = batch.select(rows), noisy[rows], masked[rows], p_mask[rows]
            visible = None if visible is None else visible[rows]
        p = batch.prompt_length
        if self.two_streams(model):
            logits = two_stream_logits(model, noisy, batch.input_ids, batch.attention_mask, p)
        else:
            logits = model(noisy, attention_mask=batch.attention_mask, prompt_length=p,
                           logits_range=(p, noisy.shape[1])).logits
        answer_lengths = batch.answer_mask.sum(dim=1)
        loss = sft_loss(logits, batch.input_ids[:, p:], masked[:, p:], p_mask[:, p:], answer_lengths,
                        self.cfg.token_weight_gamma)
        if visible is not None and self.cfg.t2t_loss_weight > 0:
            loss = loss + self.cfg.t2t_loss_weight * t2t_loss(logits, batch.input_ids[:, p:], visible[:, p:],
                                                              answer_lengths)
        return loss

    def two_streams(self, model=None) -> bool:
        """SDAR / Fast-dLLM v2 (block-causal on a position grid) train as their checkpoints were trained:
        the noised answer beside a clean copy (``two_stream_logits``). ``model``: the one to ask when
        the trainer has not built its own (a loss computed on a model handed in)."""
        spec = getattr(self, "core", model).spec
        return spec.attention_policy == "block_causal" and getattr(spec, "block_alignment", "prompt") == "position"

    def export(self, model, out_dir: Path) -> None:
        info = {"trainer": self.name, "steps": self.cfg.max_steps, "config": to_dict(self.cfg)}
        state_dict = self.export_state_dict
        if self.cfg.lora.enabled:  # the adapter beside the merged model, as the distillation trainer ships them
            import copy

            model.save_pretrained(str(out_dir / "adapter"))
            model, state_dict = copy.deepcopy(model).merge_and_unload(), None
        if self.two_streams():  # keep the format's own decoder (sdar, fast_dllm_v2) as the default
            gen = {"dllm": {**model.default_decoding(), "max_new_tokens": self.cfg.data.max_new_tokens,
                            **special_token_ids(self.tokenizer), "temperature": 0.0}}
        else:
            gen = generation_defaults(self.tokenizer, self.cfg.data.max_new_tokens, self.block_size(),
                                      start=self.cfg.model.path)
        export_model(model, self.tokenizer, out_dir, gen, info, state_dict=state_dict)


def two_stream_logits(model, noisy: torch.Tensor, clean: torch.Tensor, attention_mask: torch.Tensor,
                      prompt_length: int) -> torch.Tensor:
    """Logits of the answer slots [b, T - P, V] from SDAR's block-diffusion training forward.

    The input is ``[noisy | clean]``: two copies of the sequence with the same positions. Under the
    ``block_diffusion`` mask (``dllm.modeling.attention_masks``) a noised block sees itself and the
    *clean* earlier blocks, so every block is trained in the state the decoder meets it in (earlier
    blocks final); the clean copy gives those blocks' keys and values, with gradients, in the same
    forward. Blocks are the model's, counted from position 0, prompt included.
    """
    valid = attention_mask.long()
    positions = (valid.cumsum(-1) - 1).clamp(min=0) * valid
    t = noisy.shape[1]
    out = model(torch.cat([noisy, clean], 1), attention_mask=torch.cat([attention_mask, attention_mask], 1),
                position_ids=torch.cat([positions, positions], 1), attention_policy="block_diffusion",
                logits_range=(prompt_length, t))
    return out.logits

