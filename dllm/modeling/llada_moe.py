"""LLaDA-MoE (``LLaDAMoEModelLM``, e.g. inclusionAI/LLaDA-MoE-7B-A1B): a bidirectional OLMoE-style mixture of experts.

Its ``config.json`` says ``model_type: "llada"``, as dense LLaDA's does: dllm tells them apart by
``architectures[0]`` (:func:`dllm.modeling.families.family_of`), and ``LLaDAConfig.from_dict`` hands
a LLaDA-MoE config to :class:`LLaDAMoEConfig`, so ``AutoConfig`` / ``AutoModel.from_pretrained`` load
either from a folder.

Tensor names (OLMoE's): ``model.embed_tokens``; per layer ``input_layernorm``,
``self_attn.{q,k,v,o}_proj``, ``self_attn.q_norm`` / ``k_norm`` (per-head RMSNorm before RoPE, with
``qk_layernorm``), ``post_attention_layernorm``, ``mlp`` (a dense SwiGLU where ``moe_layer_freq`` is
0, else ``mlp.gate`` + ``mlp.experts.{i}`` + ``mlp.expert_bias`` when the router has one) and, next
to a MoE ``mlp``, ``shared_expert``; ``model.norm``; ``lm_head``.

Quirks of the reference modeling code that are reproduced here: the router is a softmax over all
experts (whatever ``moe_router_score_function`` says), top-k weights are never renormalised
(``norm_topk_prob`` is hard-coded off) and ``routed_scaling_factor``, ``router_num_group`` and
``router_topk_group`` are not used; an expert bias is added to the probabilities and kept in the
weights (:func:`dllm.modeling.moe.route_softmax`). Not reproduced: the reference drops the padding
mask (every query sees every key); dllm masks left padding, as it does for dense LLaDA.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PretrainedConfig

from .configuration import CheckpointConfigError, CoreSpec
from .core import BackboneLM
from .families import Family, register
from .layers import QWEN2_LAYER_NAMES, DecoderLayer, LayerNames, RMSNorm
from .moe import ExpertLayout, Experts, SwiGLU, expert_layout, requested_path, route_softmax

LLADA_MOE_LAYER_NAMES = LayerNames(
    **{**QWEN2_LAYER_NAMES.__dict__, "q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm", "mlp": "mlp"}
)
MASK_ID = 156895
EOS_ID = 156892
_REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_experts",
             "num_experts_per_tok", "expert_intermediate_size", "rope_theta")


class LLaDAMoEConfig(PretrainedConfig):
    """Config of inclusionAI/LLaDA-MoE-7B-A1B-{Base,Instruct} under the checkpoints' field names.

    The sizes have no defaults (the reference's are -1): a ``config.json`` without one fails with a
    message naming it. ``attention_policy``, ``block_size`` and ``mask_token_id`` are ours (optional).
    """

    model_type = "llada"  # as the checkpoints ship it; shared with dense LLaDA (see the module docstring)

    def __init__(
        self,
        vocab_size: int | None = None,
        hidden_size: int | None = None,
        dense_intermediate_size: int | None = None,
        expert_intermediate_size: int | None = None,
        shared_expert_intermediate_size: int | None = None,
        num_hidden_layers: int | None = None,
        num_attention_heads: int | None = None,
        num_key_value_heads: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 4096,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-5,
        tie_word_embeddings: bool = False,
        rope_theta: float | None = None,
        partial_rotary_factor: float = 1.0,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        clip_qkv: float | None = None,
        num_experts_per_tok: int | None = None,
        num_experts: int | None = None,
        norm_topk_prob: bool | None = None,
        qk_layernorm: bool | None = None,
        moe_layer_freq: list | None = None,
        moe_router_enable_expert_bias: bool | None = None,
        moe_router_score_function: str | None = None,
        routed_scaling_factor: float = 1.0,
        pad_token_id: int | None = EOS_ID,
        eos_token_id: int | None = EOS_ID,
        bos_token_id: int | None = None,
        mask_token_id: int | None = MASK_ID,
        attention_policy: str = "bidirectional",
        block_size: int | None = None,
        use_cache: bool = False,
        **kwargs,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.dense_intermediate_size = dense_intermediate_size
        self.expert_intermediate_size = expert_intermediate_size
        self.shared_expert_intermediate_size = shared_expert_intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads if num_key_value_heads is not None else num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.partial_rotary_factor = partial_rotary_factor
        # Kept under our own name: transformers 5 rewrites a `rope_scaling` attribute into `rope_parameters`.
        self.unsupported_rope_scaling = rope_scaling if rope_scaling and rope_scaling.get(
            "rope_type", rope_scaling.get("type")) not in (None, "default") else None
        self.attention_bias = attention_bias
        self.clip_qkv = clip_qkv
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.norm_topk_prob = norm_topk_prob
        self.qk_layernorm = qk_layernorm
        self.moe_layer_freq = list(moe_layer_freq) if moe_layer_freq is not None else None
        self.moe_router_enable_expert_bias = moe_router_enable_expert_bias
        self.moe_router_score_function = moe_router_score_function
        self.routed_scaling_factor = routed_scaling_factor
        self.mask_token_id = mask_token_id
        self.attention_policy = attention_policy
        self.block_size = block_size
        self.use_cache = use_cache
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=bos_token_id,
                         tie_word_embeddings=tie_word_embeddings, **kwargs)

    def is_moe_layer(self, index: int) -> bool:
        return bool(self.moe_layer_freq[index])

    def expert_layout(self) -> ExpertLayout | None:
        return expert_layout(self, self.expert_intermediate_size)

    def core_spec(self) -> CoreSpec:
        missing = [name for name in _REQUIRED if getattr(self, name) is None]
        if missing:
            raise CheckpointConfigError(f"LLaDA-MoE config.json lacks {', '.join(missing)}")
        if self.moe_layer_freq is None or len(self.moe_layer_freq) < self.num_hidden_layers:
            raise CheckpointConfigError(
                f"LLaDA-MoE config needs moe_layer_freq: one 0 (dense) or 1 (MoE) per layer "
                f"({self.num_hidden_layers}), got {self.moe_layer_freq!r}")
        if not all(self.moe_layer_freq[:self.num_hidden_layers]) and self.dense_intermediate_size is None:
            raise CheckpointConfigError("LLaDA-MoE config has dense layers (moe_layer_freq 0) but no "
                                        "dense_intermediate_size")
        if self.hidden_act != "silu":
            raise CheckpointConfigError(f"LLaDA-MoE config has hidden_act={self.hidden_act!r}; dllm implements 'silu'")
        for flag, value in (("attention_bias", self.attention_bias), ("clip_qkv", self.clip_qkv),
                            ("rope_scaling", self.unsupported_rope_scaling)):
            if value:
                raise CheckpointConfigError(f"LLaDA-MoE config sets {flag}={value!r}, which dllm does not implement")
        head_dim = self.hidden_size // self.num_attention_heads
        return CoreSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=head_dim,
            intermediate_size=self.dense_intermediate_size or 0,
            rope_theta=float(self.rope_theta),
            rms_norm_eps=float(self.rms_norm_eps),
            qkv_bias=False,
            tie_embeddings=bool(self.tie_word_embeddings),
            logit_shift=False,
            attention_policy=self.attention_policy,
            block_size=self.block_size,
            rotary_dim=int(head_dim * self.partial_rotary_factor),
            qk_norm=bool(self.qk_layernorm),
        )


class LLaDAMoEBlock(nn.Module):
    """``mlp.gate`` (a Linear), ``mlp.experts.{i}`` and the optional ``mlp.expert_bias`` buffer."""

    def __init__(self, config: LLaDAMoEConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.expert_intermediate_size)
        if config.moe_router_enable_expert_bias:
            self.register_buffer("expert_bias", torch.zeros(config.num_experts))
        else:
            self.expert_bias = None
        self.top_k = config.num_experts_per_tok
        self.moe_path: str | None = None  # None: DLLM_MOE_PATH, else auto (see dllm.modeling.moe)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        ids, weights = route_softmax(self.gate(x), self.expert_bias, top_k=self.top_k)
        # the reference casts the weights to the model dtype and sums the k outputs in it
        out = self.experts(x, ids, weights, path=requested_path(self.moe_path), accumulate=None)
        return out.view(shape)


class _LLaDAMoELayer(DecoderLayer):
    """A decoder layer whose MoE feed-forward adds ``shared_expert`` (a sibling of ``mlp``, as in the checkpoint)."""

    def __init__(self, spec: CoreSpec, config: LLaDAMoEConfig, index: int) -> None:
        moe = config.is_moe_layer(index)
        super().__init__(spec, LLADA_MOE_LAYER_NAMES, index, mlp=LLaDAMoEBlock(config) if moe else None)
        size = config.shared_expert_intermediate_size
        self.shared_expert = SwiGLU(spec.hidden_size, size) if moe and size is not None else None

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        out = super().feed_forward(h)
        return out if self.shared_expert is None else out + self.shared_expert(h)


class _LLaDAMoEBackbone(nn.Module):
    def __init__(self, spec: CoreSpec, config: LLaDAMoEConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(_LLaDAMoELayer(spec, config, i) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class LLaDAMoEModelLM(BackboneLM):
    """LLaDA-MoE checkpoint format (see the module docstring)."""

    config_class = LLaDAMoEConfig
    _no_split_modules = ["_LLaDAMoELayer"]
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb\.inv_freq"]

    def __init__(self, config: LLaDAMoEConfig) -> None:
        super().__init__(config)
        self._setup_core()
        self._attach(_LLaDAMoEBackbone(self.spec, config))


register(Family("LLaDA-MoE", "LLaDAMoEModelLM", "llada", LLaDAMoEConfig, LLaDAMoEModelLM, MASK_ID,
                "bidirectional", "aligned"))
