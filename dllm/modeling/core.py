"""The transformer core and the checkpoint formats built on it.

``DiffusionLM.forward`` is the one seam every decoder, trainer and server talks to:

* ``model(ids, attention_mask)``: a full forward (bidirectional or block-causal, padding-aware).
* ``model(ids, kv_cache=c, cache_mode="fill")``: the same, writing every slot's K/V into ``c``.
* ``model(ids, kv_cache=c, cache_mode="prefix", cache_start=s)``: the input occupies slots
  ``[s, s+q)`` and attends to cached slots ``[0, s)`` plus itself (prefix cache, exact block cache).
* ``model(ids, kv_cache=c, cache_mode="replace", cache_start=s)``: the input's fresh K/V replace
  slots ``[s, s+q)`` in place and it attends to the whole cached canvas (dual cache).

Logit shift (Dream): the logit for slot ``i`` comes from the hidden state at ``i-1``; the first
input slot has no predecessor in the input, so it gets its own hidden state (Dream's convention for
position 0). Cached decoders that need a correct shifted logit for slot ``s`` feed from ``s-1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.utils import ModelOutput

from dllm.generation.mixin import DiffusionGenerationMixin

from .attention_backends import check_backend, requested_backend
from .configuration import CoreSpec, DreamConfig, LLaDAConfig
from .kv_cache import DiffusionKVCache
from .layers import (
    LLADA_LAYER_NAMES,
    QWEN2_LAYER_NAMES,
    DecoderLayer,
    RMSNorm,
    RotaryEmbedding,
    make_context,
)
from .losses import mask_labelled, masked_diffusion_loss


@dataclass
class DiffusionLMOutput(ModelOutput):
    loss: torch.Tensor | None = None  # with ``labels``: the masked-diffusion loss (dllm.modeling.losses)
    logits: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None


class DiffusionLM(DiffusionGenerationMixin, PreTrainedModel):
    """Shared forward of every dllm format. Subclasses only lay out the modules under their names."""

    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["DecoderLayer"]
    _supports_sdpa = True
    _tied_weights_keys = None

    # Subclasses lay out modules under their format's names and define _embedding(), _blocks(),
    # _final_norm() and _head() (None when the head is tied to the embedding).

    # --- shared ----------------------------------------------------------------------------
    def _setup_core(self) -> None:
        self.spec: CoreSpec = self.config.core_spec()
        self.rotary = RotaryEmbedding(self.spec.rotary_dim or self.spec.head_dim, self.spec.rope_theta)
        self.gradient_checkpointing = False

    # --- attention backend -----------------------------------------------------------------
    _attn_backend: str | None = None

    @property
    def attention_backend(self) -> str:
        """The model's attention backend choice: ``auto`` | ``sdpa`` | ``flex`` (see ``set_attention_backend``)."""
        return self._attn_backend or check_backend(getattr(self.config, "attn_backend", None) or "auto")

    def set_attention_backend(self, name: str | None) -> DiffusionLM:
        """``auto`` (FlexAttention for CUDA inference, SDPA otherwise), ``sdpa`` or ``flex``.

        None restores the default (the config's ``attn_backend`` attribute if any, else ``auto``).
        The environment variable ``DLLM_ATTN_BACKEND`` overrides this choice; a forward's
        ``attn_backend=`` argument overrides both. Returns the model.
        """
        self._attn_backend = None if name is None else check_backend(name)
        return self

    @property
    def mask_token_id(self) -> int | None:
        return getattr(self.config, "mask_token_id", None)

    @property
    def is_block_causal(self) -> bool:
        return self.spec.attention_policy == "block_causal"

    def get_input_embeddings(self) -> nn.Embedding:
        return self._embedding()

    def get_output_embeddings(self) -> nn.Linear | None:
        return self._head()

    def _init_weights(self, module: nn.Module) -> None:
        std = getattr(self.config, "initializer_range", 0.02)
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, RMSNorm):
            nn.init.ones_(module.weight)

    def allocate_cache(
        self, key_valid: torch.Tensor, prompt_length: int, dtype: torch.dtype | None = None
    ) -> DiffusionKVCache:
        """A cache for a canvas whose slot validity (False on left padding) is ``key_valid`` [batch, slots]."""
        return DiffusionKVCache.allocate(
            num_layers=self.spec.num_layers,
            num_kv_heads=self.spec.num_kv_heads,
            head_dim=self.spec.head_dim,
            key_valid=key_valid,
            prompt_length=prompt_length,
            dtype=dtype or self._embedding().weight.dtype,
            device=self._embedding().weight.device,
        )

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        *,
        inputs_embeds: torch.Tensor | None = None,
        kv_cache: DiffusionKVCache | None = None,
        cache_mode: str | None = None,
        cache_start: int = 0,
        prompt_length: int | torch.Tensor | None = None,
        attention_policy: str | None = None,
        block_size: int | None = None,
        logits_range: tuple[int, int] | None = None,
        attn_backend: str | None = None,
        output_hidden_states: bool = False,
        return_dict: bool = True,
        labels: torch.Tensor | None = None,
        **unused,
    ) -> DiffusionLMOutput:
        """Logits [batch, q, vocab] for the input slots (``logits_range`` keeps only input columns [a, b)).

        ``labels`` (transformers convention: a target id, -100 where no loss is taken) masks the labelled
        positions at a random ratio and returns the masked-diffusion loss in ``.loss``, with the logits
        of that noised input (see ``dllm.modeling.losses``); the model's mask id must be known.

        ``attention_mask`` [batch, q] marks left padding (ignored with a cache: the cache holds the
        canvas validity). ``attention_policy``/``block_size`` override the config's for this call (a
        D2F teacher is the block-causal student's weights viewed bidirectionally). ``attn_backend``
        (``auto`` | ``sdpa`` | ``flex``) overrides the model's attention backend for this call.
        """
        masked = None
        if labels is not None:
            if input_ids is None or labels.shape != input_ids.shape:
                raise ValueError("labels need input_ids of the same shape (-100 where no loss is taken)")
            if self.mask_token_id is None:
                raise ValueError("labels need the model's mask_token_id (set it in config.json)")
            input_ids, masked, p_mask = mask_labelled(input_ids, labels, int(self.mask_token_id))
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("pass input_ids or inputs_embeds")
            inputs_embeds = self._embedding()(input_ids)
        h = inputs_embeds
        b, t, _ = h.shape
        if kv_cache is None and cache_mode is not None:
            raise ValueError(f"cache_mode={cache_mode!r} needs kv_cache")
        ctx = make_context(
            spec=self.spec,
            rope=self.rotary,
            dtype=h.dtype,
            seq_len=t,
            device=h.device,
            attention_mask=attention_mask,
            position_ids=position_ids,
            prompt_length=prompt_length,
            cache=kv_cache,
            cache_start=cache_start,
            cache_mode=cache_mode,
            attention_policy=attention_policy,
            block_size=block_size,
            attn_backend=requested_backend(self.attention_backend, attn_backend),
        )
        for layer in self._blocks():
            if self.gradient_checkpointing and self.training:
                h = torch.utils.checkpoint.checkpoint(layer, h, ctx, use_reentrant=False)
            else:
                h = layer(h, ctx)
        if kv_cache is not None and cache_mode == "fill":
            kv_cache.length = t
        h = self._final_norm()(h)
        if self.spec.logit_shift:
            h = torch.cat([h[:, :1], h[:, :-1]], dim=1)
        if logits_range is not None:
            h = h[:, logits_range[0] : logits_range[1]]
        head = self._head()
        logits = head(h) if head is not None else F.linear(h, self._embedding().weight)
        loss = None
        if masked is not None:
            if logits_range is not None:
                raise ValueError("labels and logits_range cannot be combined")
            loss = masked_diffusion_loss(logits, labels, masked, p_mask)
        return DiffusionLMOutput(loss=loss, logits=logits, last_hidden_state=h if output_hidden_states else None)

    def num_parameters_core(self) -> int:
        return sum(p.numel() for p in self.parameters())


class _LLaDATransformer(nn.Module):
    def __init__(self, spec: CoreSpec) -> None:
        super().__init__()
        modules = {
            "wte": nn.Embedding(spec.vocab_size, spec.hidden_size),
            "blocks": nn.ModuleList(DecoderLayer(spec, LLADA_LAYER_NAMES, i) for i in range(spec.num_layers)),
            "ln_f": RMSNorm(spec.hidden_size, spec.rms_norm_eps),
        }
        if not spec.tie_embeddings:
            modules["ff_out"] = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.transformer = nn.ModuleDict(modules)


class LLaDAModelLM(DiffusionLM):
    """LLaDA checkpoint format: tensors ``model.transformer.{wte,blocks.N.*,ln_f,ff_out}``."""

    config_class = LLaDAConfig

    def __init__(self, config: LLaDAConfig) -> None:
        super().__init__(config)
        self._setup_core()
        self.model = _LLaDATransformer(self.spec)
        self.post_init()

    def _embedding(self) -> nn.Embedding:
        return self.model.transformer["wte"]

    def _blocks(self) -> nn.ModuleList:
        return self.model.transformer["blocks"]

    def _final_norm(self) -> RMSNorm:
        return self.model.transformer["ln_f"]

    def _head(self) -> nn.Linear | None:
        return self.model.transformer["ff_out"] if "ff_out" in self.model.transformer else None


class BackboneLM(DiffusionLM):
    """The ``model.*`` + ``lm_head`` layout of the Qwen-style formats (Dream, SDAR, Fast-dLLM v2, the MoE
    formats): a subclass builds its backbone with :meth:`_attach`; the backbone holds the embedding
    (``embedding_name``), ``layers`` and ``norm``."""

    embedding_name = "embed_tokens"

    def _attach(self, backbone: nn.Module) -> None:
        self.model = backbone
        self.lm_head = None if self.spec.tie_embeddings else nn.Linear(
            self.spec.hidden_size, self.spec.vocab_size, bias=False
        )
        self.post_init()

    def _embedding(self) -> nn.Embedding:
        return getattr(self.model, self.embedding_name)

    def _blocks(self) -> nn.ModuleList:
        return self.model.layers

    def _final_norm(self) -> RMSNorm:
        return self.model.norm

    def _head(self) -> nn.Linear | None:
        return self.lm_head


class _Qwen2Backbone(nn.Module):
    def __init__(self, spec: CoreSpec) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, QWEN2_LAYER_NAMES, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class DreamModel(BackboneLM):
    """Dream checkpoint format: Qwen2 tensor names, q/k/v bias, GQA and the logit shift."""

    config_class = DreamConfig

    def __init__(self, config: DreamConfig) -> None:
        super().__init__(config)
        self._setup_core()
        self._attach(_Qwen2Backbone(self.spec))
