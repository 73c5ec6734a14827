"""SDAR-MoE (``SDARMoeForCausalLM``, ``model_type: "sdar_moe"``): JetLM/SDAR-30B-A3B-Chat and its kin.

SDAR's block-causal Qwen3 (:mod:`dllm.modeling.sdar`: causal across blocks of ``block_size`` positions
counted from position 0, bidirectional inside a block, per-head ``q_norm`` / ``k_norm``, an explicit
``head_dim``, aligned logits) with Qwen3-MoE's feed-forward. The family's ``modeling_sdar_moe.py`` is
transformers' ``modeling_qwen3_moe.py`` (v4.52) with SDAR's attention, so its fields and tensor names
are Qwen3-MoE's:

* layer ``i`` is a mixture of experts when ``num_experts > 0``, ``(i + 1) % decoder_sparse_step == 0``
  and ``i`` is not in ``mlp_only_layers``; otherwise a dense SwiGLU of ``intermediate_size``
  (``mlp.{gate,up,down}_proj``);
* a MoE layer has a router ``mlp.gate`` (a Linear, no bias) and ``num_experts`` SwiGLU experts of
  ``moe_intermediate_size`` (``mlp.experts.{e}.{gate,up,down}_proj``); no shared expert, no expert bias.

Routing as the reference computes it (:func:`dllm.modeling.moe.route_softmax`): a float32 softmax over
every expert, the top ``num_experts_per_tok``, renormalised to sum to 1 only when ``norm_topk_prob``
(the published 30B-A3B sets it; the field's default is off, as Qwen3-MoE's), then cast to the hidden
dtype and summed in it. JetEngine's SDAR-MoE path always renormalises, so the two agree on the
published checkpoints. Router logits for an auxiliary loss are not returned (``output_router_logits``
and ``router_aux_loss_coef`` are kept in the config, unused).
"""

from __future__ import annotations

import torch
from torch import nn

from .configuration import CheckpointConfigError, CoreSpec, _check_policy
from .core import BackboneLM
from .families import Family, register
from .layers import DecoderLayer, LayerNames, RMSNorm
from .moe import Experts, requested_path, route_softmax
from .published import PublishedLayoutConfig
from .sdar import MASK_ID, QWEN3_LAYER_NAMES, SDARForCausalLM

SDAR_MOE_LAYER_NAMES = LayerNames(**{**QWEN3_LAYER_NAMES.__dict__, "mlp": "mlp"})
# The remote-code entry points of the family's own files (``configuration_sdar_moe.py``, ``modeling_sdar_moe.py``).
AUTO_MAP = {"AutoConfig": "configuration_sdar_moe.SDARMoeConfig", "AutoModel": "modeling_sdar_moe.SDARMoeModel",
            "AutoModelForCausalLM": "modeling_sdar_moe.SDARMoeForCausalLM"}


class SDARMoeConfig(PublishedLayoutConfig):
    """Config of SDAR-MoE checkpoints under their own (Qwen3-MoE) field names.

    Defaults are Qwen3-MoE's (transformers v4.52, the base of the family's configuration file) plus
    SDAR's ``block_size`` and ``mask_token_id``. ``attention_policy`` is ours (``"block_causal"``;
    ``"bidirectional"`` views the weights without the block mask) and is written only when changed.
    """

    model_type = "sdar_moe"
    OURS = {"attention_policy": "block_causal"}

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 2048,
        intermediate_size: int = 6144,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 4,
        head_dim: int | None = None,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        attention_bias: bool = False,
        use_sliding_window: bool = False,
        sliding_window: int | None = 4096,
        max_window_layers: int = 28,
        attention_dropout: float = 0.0,
        decoder_sparse_step: int = 1,
        moe_intermediate_size: int = 768,
        num_experts_per_tok: int = 8,
        num_experts: int = 128,
        norm_topk_prob: bool = False,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        mlp_only_layers: list[int] | None = None,
        block_size: int = 4,
        mask_token_id: int | None = MASK_ID,
        attention_policy: str = "block_causal",
        **kwargs,
    ) -> None:
        kwargs.setdefault("auto_map", AUTO_MAP)
        self._keep_published(rope_scaling=rope_scaling, use_cache=use_cache, kwargs=kwargs)
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window
        self.max_window_layers = max_window_layers
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.head_dim = head_dim
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.attention_bias = attention_bias
        self.attention_dropout = attention_dropout
        self.decoder_sparse_step = decoder_sparse_step
        self.moe_intermediate_size = moe_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.mlp_only_layers = [] if mlp_only_layers is None else list(mlp_only_layers)
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.attention_policy = attention_policy
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.use_cache = use_cache
        _check_policy(attention_policy, block_size)

    def is_moe_layer(self, index: int) -> bool:
        """Qwen3-MoE's rule (see the module docstring)."""
        return (index not in self.mlp_only_layers and self.num_experts > 0
                and (index + 1) % self.decoder_sparse_step == 0)

    def core_spec(self) -> CoreSpec:
        if self.hidden_act != "silu":
            raise CheckpointConfigError(f"SDAR-MoE config has hidden_act={self.hidden_act!r}; dllm implements 'silu'")
        if self.attention_bias:
            raise CheckpointConfigError("SDAR-MoE config sets attention_bias=true, which dllm does not implement")
        if self.use_sliding_window:
            raise CheckpointConfigError("SDAR-MoE config sets use_sliding_window=true, which dllm does not implement")
        if self.num_experts > 0 and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise CheckpointConfigError(f"SDAR-MoE config has num_experts_per_tok={self.num_experts_per_tok} "
                                        f"for {self.num_experts} experts")
        if self.decoder_sparse_step < 1:
            raise CheckpointConfigError(f"SDAR-MoE config has decoder_sparse_step={self.decoder_sparse_step}; "
                                        "it must be at least 1")
        self.unsupported_rope()
        return CoreSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim or self.hidden_size // self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            rope_theta=float(self.rope_theta),
            rms_norm_eps=float(self.rms_norm_eps),
            qkv_bias=False,
            tie_embeddings=bool(self.tie_word_embeddings),
            logit_shift=False,
            attention_policy=self.attention_policy,
            block_size=self.block_size,
            qk_norm=True,
            block_alignment="position",
        )


class SDARMoeBlock(nn.Module):
    """``mlp.gate`` (the router) and ``mlp.experts.{e}``: Qwen3-MoE's sparse feed-forward."""

    def __init__(self, config: SDARMoeConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(config.hidden_size, config.num_experts, bias=False)
        self.experts = Experts(config.num_experts, config.hidden_size, config.moe_intermediate_size)
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = bool(config.norm_topk_prob)
        self.moe_path: str | None = None  # None: DLLM_MOE_PATH, else auto (see dllm.modeling.moe)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        shape = h.shape
        x = h.reshape(-1, shape[-1])
        ids, weights = route_softmax(self.gate(x), None, top_k=self.top_k, norm_topk_prob=self.norm_topk_prob)
        # the reference casts the weights to the hidden dtype and sums the k outputs in it
        out = self.experts(x, ids, weights, path=requested_path(self.moe_path), accumulate=None)
        return out.view(shape)


class _SDARMoeBackbone(nn.Module):
    def __init__(self, spec: CoreSpec, config: SDARMoeConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, SDAR_MOE_LAYER_NAMES, i, mlp=SDARMoeBlock(config) if config.is_moe_layer(i) else None)
            for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class SDARMoeForCausalLM(BackboneLM):
    """SDAR-MoE checkpoint format (see the module docstring)."""

    config_class = SDARMoeConfig
    _no_split_modules = ["DecoderLayer"]
    _keys_to_ignore_on_load_unexpected = [r"rotary_emb\.inv_freq"]
    family_decoding = SDARForCausalLM.family_decoding  # SDAR's generate.py, shared by the family

    def __init__(self, config: SDARMoeConfig) -> None:
        super().__init__(config)
        self._setup_core()
        self._attach(_SDARMoeBackbone(self.spec, config))


register(Family("SDAR-MoE", "SDARMoeForCausalLM", "sdar_moe", SDARMoeConfig, SDARMoeForCausalLM, MASK_ID,
                "block_causal", "aligned"))
