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
(Qwen3-30B-A3B, the base of SDAR-30B-A3B, sets it; the field's default is off, as Qwen3-MoE's), then
cast to the hidden dtype and summed in it. JetEngine's SDAR-MoE path always renormalises, so the two
agree wherever the field is set. Router logits for an auxiliary loss are not returned (``output_router_logits``
and ``router_aux_loss_coef`` are kept in the config, unused).
"""

from __future__ import annotations

import torch
from torch import nn

from .configuration import CheckpointConfigError, CoreSpec
from .families import Family, register
from .layers import LayerNames
from .moe import ExpertLayout, Experts, expert_layout, requested_path, route_softmax
from .sdar import MASK_ID, QWEN3_LAYER_NAMES, SDARConfig, SDARForCausalLM

SDAR_MOE_LAYER_NAMES = LayerNames(**{**QWEN3_LAYER_NAMES.__dict__, "mlp": "mlp"})
# The remote-code entry points of the family's own files (``configuration_sdar_moe.py``, ``modeling_sdar_moe.py``).
AUTO_MAP = {"AutoConfig": "configuration_sdar_moe.SDARMoeConfig", "AutoModel": "modeling_sdar_moe.SDARMoeModel",
            "AutoModelForCausalLM": "modeling_sdar_moe.SDARMoeForCausalLM"}


class SDARMoeConfig(SDARConfig):
    """Config of SDAR-MoE checkpoints under their own (Qwen3-MoE) field names: SDAR's fields, with
    Qwen3-MoE's sizes as defaults (transformers v4.52, the base of the family's configuration file, where
    ``head_dim`` defaults to hidden_size / num_attention_heads), plus the mixture-of-experts fields.
    """

    model_type = "sdar_moe"
    PUBLISHED_EXTRAS = {"auto_map": AUTO_MAP}  # noqa: RUF012 - a class constant, as SDARConfig's
    FAMILY = "SDAR-MoE"

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 2048,
        intermediate_size: int = 6144,
        num_hidden_layers: int = 24,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 4,
        head_dim: int | None = None,
        decoder_sparse_step: int = 1,
        moe_intermediate_size: int = 768,
        num_experts_per_tok: int = 8,
        num_experts: int = 128,
        norm_topk_prob: bool = False,
        output_router_logits: bool = False,
        router_aux_loss_coef: float = 0.001,
        mlp_only_layers: list[int] | None = None,
        **kwargs,
    ) -> None:
        self.decoder_sparse_step = decoder_sparse_step
        self.moe_intermediate_size = moe_intermediate_size
        self.num_experts_per_tok = num_experts_per_tok
        self.num_experts = num_experts
        self.norm_topk_prob = norm_topk_prob
        self.output_router_logits = output_router_logits
        self.router_aux_loss_coef = router_aux_loss_coef
        self.mlp_only_layers = [] if mlp_only_layers is None else list(mlp_only_layers)
        # written out, never null: the family's own code reads getattr(config, "head_dim", default)
        head_dim = head_dim or hidden_size // num_attention_heads
        super().__init__(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate_size,
                         num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                         num_key_value_heads=num_key_value_heads, head_dim=head_dim, **kwargs)

    def is_moe_layer(self, index: int) -> bool:
        """Qwen3-MoE's rule (see the module docstring)."""
        return (index not in self.mlp_only_layers and self.num_experts > 0
                and (index + 1) % self.decoder_sparse_step == 0)

    def expert_layout(self) -> ExpertLayout | None:
        return expert_layout(self, self.moe_intermediate_size)

    def core_spec(self) -> CoreSpec:
        if self.num_experts > 0 and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise CheckpointConfigError(f"SDAR-MoE config has num_experts_per_tok={self.num_experts_per_tok} "
                                        f"for {self.num_experts} experts")
        if self.decoder_sparse_step < 1:
            raise CheckpointConfigError(f"SDAR-MoE config has decoder_sparse_step={self.decoder_sparse_step}; "
                                        "it must be at least 1")
        return super().core_spec()


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


class SDARMoeForCausalLM(SDARForCausalLM):
    """SDAR-MoE checkpoint format (see the module docstring); decodes with SDAR's own decoder."""

    config_class = SDARMoeConfig
    layer_names = SDAR_MOE_LAYER_NAMES

    def layer_mlp(self, index: int) -> nn.Module | None:
        return SDARMoeBlock(self.config) if self.config.is_moe_layer(index) else None


register(Family("SDAR-MoE", "SDARMoeForCausalLM", "sdar_moe", SDARMoeConfig, SDARMoeForCausalLM, MASK_ID,
                "block_causal", "aligned"))
