"""``model.generate(...)`` in the style of transformers, for every dllm model."""

from __future__ import annotations

from typing import Any

import torch

from dllm.decoding.config import DiffusionGenerationConfig
from dllm.decoding.engine import generate as decode
from dllm.decoding.registry import warn_unread_options

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
                loaded = DiffusionGenerationConfig(**self.default_decoding(path))
            self._diffusion_generation_config = loaded
        return self._diffusion_generation_config

    #: a format's own decoder and settings, for checkpoints whose generation_config.json has no "dllm" key
    family_decoding: dict = {}  # noqa: RUF012 - a class constant

    def default_decoding(self, path=None) -> dict:
        """Decoding defaults of a checkpoint without dllm's: the format's own decoder (``family_decoding``:
        ``sdar`` for SDAR, ``fast_dllm_v2`` for Fast-dLLM v2), else D2F for block-causal models and
        threshold decoding otherwise; a position-aligned model's block length; every EOS id that
        ``generation_config.json`` lists (chat checkpoints list the turn end, ``<|im_end|>``, and the
        document end): any of them stops a row, the first pads a finished answer."""
        import json
        from pathlib import Path

        fields = {"strategy": "d2f" if self.is_block_causal else "threshold", **self.family_decoding}
        if self.is_block_causal and getattr(self.spec, "block_alignment", "prompt") == "position":
            fields["block_length"] = self.spec.block_size
        try:
            eos = json.loads((Path(path) / "generation_config.json").read_text()).get("eos_token_id") if path else None
        except (OSError, ValueError):
            eos = None
        if isinstance(eos, list) and eos:
            ids = [int(i) for i in eos]
            fields["eos_token_id"] = ids[0] if len(ids) == 1 else ids
        return fields

    @diffusion_generation_config.setter
    def diffusion_generation_config(self, cfg: DiffusionGenerationConfig) -> None:
        self._diffusion_generation_config = cfg

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' ``save_pretrained``, then the decoding defaults under the ``"dllm"`` key of
        ``generation_config.json`` (transformers rewrites that file without them), so a saved model
        (and ``push_to_hub``, which saves through here) decodes as the original did."""
        out = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            self._keep_published_generation_config(save_directory)
            self.diffusion_generation_config.save_pretrained(save_directory)
        return out

    def _keep_published_generation_config(self, save_directory) -> None:
        """A format with a published layout (SDAR, Fast-dLLM v2) keeps the ``generation_config.json`` keys
        of the folder it was loaded from (its EOS list, sampling defaults): transformers writes one
        derived from config.json instead, with a single EOS id."""
        import json
        from pathlib import Path

        src = getattr(self.config, "_name_or_path", None)
        if not getattr(type(self.config), "KEEPS_PUBLISHED_FILES", False) or not src:
            return
        src_file, dst_file = Path(src) / "generation_config.json", Path(save_directory) / "generation_config.json"
        if not src_file.exists() or src_file.resolve() == dst_file.resolve():
            return
        try:
            published = {k: v for k, v in json.loads(src_file.read_text()).items() if k != "dllm"}
        except ValueError:
            return
        dst_file.write_text(json.dumps(published, indent=2, sort_keys=True) + "\n")

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
            warn_unread_options(cfg.strategy, request.overrides, stacklevel=4)  # past torch.no_grad
        n = request.num_return_sequences
        if n > 1:
            input_ids = input_ids.repeat_interleave(n, dim=0)
            attention_mask = None if attention_mask is None else attention_mask.repeat_interleave(n, dim=0)
        out = decode(self, input_ids, attention_mask, cfg, streamer=streamer, tokenizer=tokenizer,
                     branch_executor=branch_executor)
        return out if cfg.return_dict_in_generate else out.sequences
