"""LLaDA2.0 / LLaDA2.1 (``model_type: "llada2_moe"``, ``LLaDA2MoeModelLM``): block-causal mixture of experts.

The layout of inclusionAI's checkpoints (BailingMoeV2-like), under their own tensor names:
``model.word_embeddings``; per layer ``input_layernorm``, ``attention.query_key_value`` (one fused
projection: all q heads, then k, then v), ``attention.query_layernorm`` / ``key_layernorm``
(per-head RMSNorm before RoPE), ``attention.dense``, ``post_attention_layernorm`` and ``mlp``: a
dense SwiGLU (``mlp.{gate,up,down}_proj``) in the first ``first_k_dense_replace`` layers, else
a MoE block (``mlp.gate.weight``, ``mlp.gate.expert_bias``, ``mlp.experts.{i}.*``,
``mlp.shared_experts.*``); ``model.norm``; ``lm_head``. RoPE rotates the first
``partial_rotary_factor`` of each head. Logits are aligned (token i from position i).

Quirks of the reference modeling code that are reproduced here:

* the router (:func:`dllm.modeling.moe.route_sigmoid_grouped`) always uses sigmoid scores and
  renormalises the top-k weights, whatever ``score_function`` and ``norm_topk_prob`` say, and always
  has an ``expert_bias`` tensor (zeros when ``moe_router_enable_expert_bias`` is false);
* the embedding has ``padding_idx = pad_token_id``, which is also the EOS id (156892): that row
  never receives a gradient in training;
* the checkpoint's blocks start at the first token of the sequence (``block_alignment =
  "position"``, as SDAR's): the published ``generate`` cuts prompt and answer into blocks of 32 from
  position 0, so the block that holds the end of the prompt also holds the first generated tokens
  (the ``edit`` strategy decodes that grid; see ``dllm.decoding.loops.editing``).

``config.json`` carries no mask id; the family's known one (156895) is the default.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from .configuration import CheckpointConfigError, CoreSpec
from .core import BackboneLM
from .families import Family, register
from .layers import DecoderLayer, LayerNames, RMSNorm
from .moe import ExpertLayout, Experts, SwiGLU, expert_layout, requested_path, route_sigmoid_grouped

LLADA2_LAYER_NAMES = LayerNames(
    attn_norm="input_layernorm", q="", k="", v="", qkv="attention.query_key_value",
    q_norm="attention.query_layernorm", k_norm="attention.key_layernorm", o="attention.dense",
    mlp_norm="post_attention_layernorm", gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj", mlp="mlp",
)
MASK_ID = 156895
EOS_ID = 156892


class LLaDA2MoeConfig(PretrainedConfig):
    """Config of inclusionAI/LLaDA2.0-{mini,flash} and LLaDA2.1-{mini,flash}, under the checkpoints' field names.

    Defaults are LLaDA2.0-mini's, so a partial config cannot silently become a different model.
    ``attention_policy``, ``block_size`` and ``mask_token_id`` are ours (optional).
    """

    model_type = "llada2_moe"

    def __init__(
        self,
        vocab_size: int = 157184,
        hidden_size: int = 2048,
        intermediate_size: int = 5120,
        num_hidden_layers: int = 20,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 4,
        head_dim: int | None = 128,
        hidden_act: str = "silu",
        use_qkv_bias: bool = False,
        use_bias: bool = False,
        use_qk_norm: bool = True,
        rms_norm_eps: float = 1e-6,
        tie_word_embeddings: bool = False,
        max_position_embeddings: int = 32768,
        rope_theta: float = 600000.0,
        rope_scaling: dict | None = None,
        partial_rotary_factor: float = 0.5,
        use_sliding_window: bool = False,
        num_experts: int | None = 256,
        num_shared_experts: int | None = 1,
        num_experts_per_tok: int = 8,
        n_group: int = 8,
        topk_group: int = 4,
        routed_scaling_factor: float = 2.5,
        moe_intermediate_size: int = 512,
        first_k_dense_replace: int = 1,
        score_function: str = "sigmoid",
        norm_topk_prob: bool = True,
        moe_router_enable_expert_bias: bool = True,
        initializer_range: float = 0.02,
        pad_token_id: int | None = EOS_ID,
        eos_token_id: int | None = EOS_ID,
        bos_token_id: int | None = None,
        mask_token_id: int | None = MASK_ID,
        attention_policy: str = "block_causal",
        block_size: int | None = 32,
        use_cache: bool = False,
        **kwargs,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        # the reference reads 0 as "as many as the attention heads"
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.hidden_act = hidden_act
        self.use_qkv_bias = use_qkv_bias
        self.use_bias = use_bias
        self.use_qk_norm = use_qk_norm
        self.rms_norm_eps = rms_norm_eps
        self.max_position_embeddings = max_position_embeddings
        self.rope_theta = rope_theta
        # Kept under our own name: transformers 5 rewrites a `rope_scaling` attribute into `rope_parameters`.
        self.unsupported_rope_scaling = rope_scaling if rope_scaling and rope_scaling.get(
            "rope_type", rope_scaling.get("type")) not in (None, "default") else None
        self.partial_rotary_factor = partial_rotary_factor
        self.use_sliding_window = use_sliding_window
        self.num_experts = num_experts
        self.num_shared_experts = num_shared_experts
        self.num_experts_per_tok = num_experts_per_tok
        self.n_group = n_group
        self.topk_group = topk_group
        self.routed_scaling_factor = routed_scaling_factor
        self.moe_intermediate_size = moe_intermediate_size
        self.first_k_dense_replace = first_k_dense_replace
        self.score_function = score_function
        self.norm_topk_prob = norm_topk_prob
        self.moe_router_enable_expert_bias = moe_router_enable_expert_bias
        self.initializer_range = initializer_range
        self.mask_token_id = mask_token_id
        self.attention_policy = attention_policy
        self.block_size = block_size
        self.use_cache = use_cache
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    def is_moe_layer(self, index: int) -> bool:
        return self.num_experts is not None and index >= self.first_k_dense_replace

    def expert_layout(self) -> ExpertLayout | None:
        return expert_layout(self, self.moe_intermediate_size)

    def core_spec(self) -> CoreSpec:
        if self.hidden_act != "silu":
            raise CheckpointConfigError(f"LLaDA2 config has hidden_act={self.hidden_act!r}; dllm implements 'silu'")
        if self.use_bias:
            raise CheckpointConfigError("LLaDA2 config sets use_bias=true (a bias on attention.dense), which dllm "
                                        "does not implement")
        if self.unsupported_rope_scaling:
            raise CheckpointConfigError(
                f"LLaDA2 config sets rope_scaling={self.unsupported_rope_scaling}, which dllm does not implement")
        if self.use_sliding_window:
            raise CheckpointConfigError("LLaDA2 config sets use_sliding_window=true, which dllm does not implement")
        if self.num_experts is not None and self.num_experts % self.n_group:
            raise CheckpointConfigError(f"num_experts={self.num_experts} is not a multiple of n_group={self.n_group}")
        return CoreSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            intermediate_size=self.intermediate_size,
            rope_theta=float(self.rope_theta),
            rms_norm_eps=float(self.rms_norm_eps),
            qkv_bias=bool(self.use_qkv_bias),
            tie_embeddings=bool(self.tie_word_embeddings),
            logit_shift=False,
            attention_policy=self.attention_policy,
            block_size=self.block_size,
            rotary_dim=int(self.head_dim * self.partial_rotary_factor),
            qk_norm=bool(self.use_qk_norm),
            block_alignment="position",
        )


class SigmoidGroupedGate(nn.Module):
    """The router: ``weight`` [experts, hidden] and the selection-only ``expert_bias`` buffer."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.num_experts, config.hidden_size))
        nn.init.normal_(self.weight, std=config.initializer_range)
        self.register_buffer("expert_bias", torch.zeros(config.num_experts))
        self.top_k = config.num_experts_per_tok
        self.n_group, self.topk_group = config.n_group, config.topk_group
        self.routed_scaling_factor = config.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = torch.nn.functional.linear(x.float(), self.weight.float())  # router_dtype fp32
        return route_sigmoid_grouped(logits, self.expert_bias, top_k=self.top_k, n_group=self.n_group,
                                     topk_group=self.topk_group, routed_scaling_factor=self.routed_scaling_factor)


class LLaDA2MoeBlock(nn.Module):
    """Routed experts + shared experts: ``mlp.gate``, ``mlp.experts.{i}``, ``mlp.shared_experts``."""

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        self.gate = SigmoidGroupedGate(config)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        shared = config.num_shared_experts or 0
        self.shared_experts = SwiGLU(config.hidden_size, config.moe_intermediate_size * shared) if shared else None
        self.moe_path: str | None = None  # None: DLLM_MOE_PATH, else auto (see dllm.modeling.moe)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        ids, weights = self.gate(x)
        out = self.experts(x, ids, weights, path=requested_path(self.moe_path), accumulate=torch.float32)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out.view(shape)


class _LLaDA2Backbone(nn.Module):
    def __init__(self, spec: CoreSpec, config: LLaDA2MoeConfig) -> None:
        super().__init__()
        pad = config.pad_token_id if config.pad_token_id is not None and config.pad_token_id < spec.vocab_size else None
        self.word_embeddings = nn.Embedding(spec.vocab_size, spec.hidden_size, padding_idx=pad)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, LLADA2_LAYER_NAMES, i, mlp=LLaDA2MoeBlock(config) if config.is_moe_layer(i) else None)
            for i in range(spec.num_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class LLaDA2MoeModelLM(BackboneLM):
    """LLaDA2.x checkpoint format (see the module docstring)."""

    config_class = LLaDA2MoeConfig
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb\.inv_freq"]
    # The published decoders, for a checkpoint whose generation_config.json has no "dllm" key: blocks of the
    # checkpoint's size from position 0, threshold 0.95 (both published generate functions' default), and
    # editing off. That is LLaDA2.0's generate; LLaDA2.1 checkpoints edit with editing_threshold=0.9 (its
    # generate's default), which a 2.0 checkpoint, never trained to edit, must not get by default.
    family_decoding = {"strategy": "edit", "threshold": 0.95, "editing_threshold": 1.0}  # noqa: RUF012

    embedding_name = "word_embeddings"

    def __init__(self, config: LLaDA2MoeConfig) -> None:
        super().__init__(config)
        self._setup_core()
        self._attach(_LLaDA2Backbone(self.spec, config))

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, SigmoidGroupedGate):
            nn.init.normal_(module.weight, std=getattr(self.config, "initializer_range", 0.02))


register(Family("LLaDA2", "LLaDA2MoeModelLM", "llada2_moe", LLaDA2MoeConfig, LLaDA2MoeModelLM, MASK_ID,
                "block_causal", "aligned"))
