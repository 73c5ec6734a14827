"""``model.generate(...)`` in the style of transformers, for every dllm model."""

from __future__ import annotations

from typing import Any

import torch

from dllm.decoding.config import DiffusionGenerationConfig
from dllm.decoding.engine import generate as decode

from .hf_compat import translate


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
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        generation_config=None,
        streamer=None,
        tokenizer=None,
        branch_executor=None,
        **kwargs: Any,
    ):
        """Decode completions for left-padded prompts.

        Returns prompt + completion ids [batch, prompt + max_new_tokens] (the tail after EOS is EOS),
        or a :class:`dllm.decoding.state.DiffusionGenerateOutput` with ``return_dict_in_generate=True``.
        ``generation_config`` is a :class:`DiffusionGenerationConfig` (default: the model's) or a
        ``transformers.GenerationConfig``; keyword arguments replace fields for this call only, in dllm's
        names or transformers' (``do_sample``, ``max_length``, ``num_return_sequences``, ...; see
        :mod:`dllm.generation.hf_compat`). ``max_new_tokens`` may be any size: whole blocks are decoded
        and the answer is cut back. With ``num_return_sequences=n`` row i's answers are rows i*n..i*n+n-1.
        ``branch_executor``: where strategies with branches (LoPA) evaluate them (a factory with
        :func:`dllm.decoding.lopa.local_executor`'s signature; default: this process).
        """
        if input_ids is None:
            input_ids = kwargs.pop("inputs", None)
        if input_ids is None:
            raise ValueError("generate needs input_ids [batch, prompt_length]")
        hf_config = None
        if generation_config is None or isinstance(generation_config, DiffusionGenerationConfig):
            cfg = generation_config or self.diffusion_generation_config
        elif hasattr(generation_config, "to_dict") and hasattr(generation_config, "do_sample"):
            cfg, hf_config = self.diffusion_generation_config, generation_config
        else:
            raise TypeError(f"generation_config must be a DiffusionGenerationConfig or a transformers "
                            f"GenerationConfig, got {type(generation_config).__name__}")
        request = translate(input_ids.shape[1], hf_config, **kwargs)
        if request.overrides:
            cfg = cfg.replace(**request.overrides)
        n = request.num_return_sequences
        if n > 1:
            input_ids = input_ids.repeat_interleave(n, dim=0)
            attention_mask = None if attention_mask is None else attention_mask.repeat_interleave(n, dim=0)
        out = decode(self, input_ids, attention_mask, cfg, streamer=streamer, tokenizer=tokenizer,
                     branch_executor=branch_executor)
        return out if cfg.return_dict_in_generate else out.sequences
