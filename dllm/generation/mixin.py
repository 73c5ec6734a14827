"""``model.generate(...)`` in the style of transformers, for every dllm model."""

from __future__ import annotations

from typing import Any

import torch

from dllm.decoding.config import DiffusionGenerationConfig
from dllm.decoding.engine import generate as decode


class DiffusionGenerationMixin:
    """Adds ``generate`` and a per-model default :class:`DiffusionGenerationConfig`."""

    _diffusion_generation_config: DiffusionGenerationConfig | None = None

    @property
    def diffusion_generation_config(self) -> DiffusionGenerationConfig:
        """The model's defaults: set explicitly, else ``generation_config.json`` beside the checkpoint."""
        if self._diffusion_generation_config is None:
            path = getattr(self.config, "_name_or_path", None)
            loaded = DiffusionGenerationConfig.from_pretrained(path) if path else None
            if loaded is None:
                loaded = DiffusionGenerationConfig(strategy="d2f" if self.is_block_causal else "threshold")
            self._diffusion_generation_config = loaded
        return self._diffusion_generation_config

    @diffusion_generation_config.setter
    def diffusion_generation_config(self, cfg: DiffusionGenerationConfig) -> None:
        self._diffusion_generation_config = cfg

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained``, then the decoding defaults under the ``"dllm"`` key of
        ``generation_config.json`` (transformers rewrites that file without them), so a saved model
        (and ``push_to_hub``, which saves through here) decodes as the original did."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            self.diffusion_generation_config.save_pretrained(save_directory)
        return out

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, **kwargs: Any) -> dict:
        """The transformers hook wrappers such as PEFT's causal-LM model expect; a diffusion canvas needs
        no per-step input preparation, so the inputs pass through."""
        return {"input_ids": input_ids, **kwargs}

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        generation_config: DiffusionGenerationConfig | None = None,
        streamer=None,
        tokenizer=None,
        **overrides: Any,
    ):
        """Decode completions for left-padded prompts.

        Returns prompt + completion ids [batch, prompt + max_new_tokens] (the tail after EOS is EOS),
        or a :class:`dllm.decoding.state.DiffusionGenerateOutput` with ``return_dict_in_generate=True``.
        Keyword overrides replace fields of the config for this call only.
        """
        cfg = generation_config or self.diffusion_generation_config
        if overrides:
            cfg = cfg.replace(**overrides)
        out = decode(self, input_ids, attention_mask, cfg, streamer=streamer, tokenizer=tokenizer)
        return out if cfg.return_dict_in_generate else out.sequences
