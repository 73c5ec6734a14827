"""D2F asymmetric distillation (spec d2f-lopa §1).

Student: the model viewed block-causally (blocks of ``block_size`` after the prompt), trained with
LoRA or on full weights. Teacher: a frozen bidirectional model, either a separate checkpoint
(``teacher``) or the student's own base with the adapter disabled (LoRA, no second copy), or, for
full-weight training without a teacher path, a frozen copy of the starting weights.

Both see the same noisy sequence (monotone per-block mask ratios); the loss is the soft CE from
the teacher's distribution to the student's on masked answer tokens, / p_mask, averaged over them.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import torch
import torch.nn.functional as F

from dllm.loading import load_model

from .config import ConfigError, DistillConfig, to_dict
from .data import Batch
from .engine import Trainer
from .models import export_model, generation_defaults, init_model, load_tokenizer_for
from .objectives import d2f_noise, distill_loss


class DistillTrainer(Trainer):
    config_class = DistillConfig
    name = "distill"

    def setup_models(self) -> None:
        cfg: DistillConfig = self.cfg
        self.tokenizer = load_tokenizer_for(cfg.model, cfg.data.files, self.dataset_texts())
        self.check_memory()
        student = init_model(cfg.model, self.tokenizer, attention_policy="block_causal", block_size=cfg.block_size)
        self.teacher = None
        if cfg.teacher:
            self.teacher = load_model(cfg.teacher, dtype=cfg.model.dtype, attention_policy="bidirectional")
            rows = (self.teacher.get_input_embeddings().weight.shape[0], student.get_input_embeddings().weight.shape[0])
            if rows[0] != rows[1]:
                raise ConfigError(f"the teacher ({cfg.teacher}) has {rows[0]} token rows and the student {rows[1]}: "
                                  "distillation needs both on the same tokenizer (train the teacher with it first)")
        elif not cfg.lora.enabled:
            self.teacher = copy.deepcopy(student)
        if self.teacher is not None:
            self.teacher.requires_grad_(False).eval()
        if cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            lora = LoraConfig(r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout,
                              target_modules=list(cfg.lora.target_modules), bias="none")
            student = get_peft_model(student, lora)
        self.model = student

    def memory_plan(self):
        """The student (its adapters alone train under LoRA) and the frozen teacher: a checkpoint of its own,
        a copy of the student (full weights without one), or none (LoRA: the base with the adapter off)."""
        cfg: DistillConfig = self.cfg
        student = self.model_cost(cfg.model, trainable=not cfg.lora.enabled, label="the student",
                                  attention_policy="block_causal", block_size=cfg.block_size)
        if cfg.teacher:
            teacher = self.model_cost(cfg.model, trainable=False, label="the teacher", path=cfg.teacher)
        elif not cfg.lora.enabled and student is not None:
            teacher = dataclasses.replace(student, label="the teacher (a frozen copy)", trainable=False)
        else:
            teacher = None
        return [student, teacher]

    def pad_multiple(self) -> int:
        return self.cfg.block_size

    def eval_block_size(self) -> int | None:
        return self.cfg.block_size

    def _teacher_logits(self, model, noisy: torch.Tensor, batch: Batch) -> torch.Tensor:
        p = batch.prompt_length
        kwargs = dict(attention_mask=batch.attention_mask, prompt_length=p, attention_policy="bidirectional",
                      logits_range=(p, noisy.shape[1]))
        with torch.no_grad():
            if self.teacher is not None:
                if next(self.teacher.parameters()).device != noisy.device:
                    self.teacher.to(noisy.device)
                return self.teacher(noisy, **kwargs).logits
            peft_model = self.accelerator.unwrap_model(model)
            was_training = peft_model.training
            peft_model.eval()  # the teacher is the frozen base: no adapter, no dropout
            try:
                with peft_model.disable_adapter():
                    return peft_model(noisy, **kwargs).logits
            finally:
                peft_model.train(was_training)

    def compute_loss(self, model, batch: Batch, generator: torch.Generator) -> torch.Tensor:
        cfg: DistillConfig = self.cfg
        p = batch.prompt_length
        noisy, masked, p_mask = d2f_noise(batch.input_ids, p, cfg.block_size, batch.answer_mask, self.mask_id(),
                                          generator, cfg.pmask_low, cfg.pmask_high)
        teacher = self._teacher_logits(model, noisy, batch)
        student = model(noisy, attention_mask=batch.attention_mask, prompt_length=p, attention_policy="block_causal",
                        block_size=cfg.block_size, logits_range=(p, noisy.shape[1])).logits
        m, pm = masked[:, p:], p_mask[:, p:]
        loss = distill_loss(student, teacher, m, pm)
        if cfg.hard_label_weight and bool(m.any()):
            ce = F.cross_entropy(student[m].float(), batch.input_ids[:, p:][m], reduction="none")
            loss = loss + cfg.hard_label_weight * (ce / pm[m].float()).mean()
        return loss

    def export(self, model, out_dir: Path) -> None:
        cfg: DistillConfig = self.cfg
        info = {"trainer": self.name, "steps": cfg.max_steps, "config": to_dict(cfg)}
        gen = generation_defaults(self.tokenizer, cfg.data.max_new_tokens, cfg.block_size, start=cfg.model.path)
        state_dict = self.export_state_dict
        if cfg.lora.enabled:
            # D2F ships adapters for the unmodified base; we also write the merged block-causal model.
            # (Merging needs whole weights: the LoRA recipes use ZeRO-2, which does not partition them.)
            model.save_pretrained(str(out_dir / "adapter"))
            merged, state_dict = copy.deepcopy(model).merge_and_unload(), None
        else:
            merged = model
        merged.config.attention_policy = "block_causal"
        merged.config.block_size = cfg.block_size
        export_model(merged, self.tokenizer, out_dir, gen, info, state_dict=state_dict)
