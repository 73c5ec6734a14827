"""SDAR (``SDARForCausalLM``, ``model_type: "sdar"``): JetLM/SDAR-1.7B/4B/8B-Chat (+ ``-b8`` ... ``-b64``),
Gen-Verse/TraDo-4B/8B and the LightningRL-8B-b32 release, which share the architecture.

Qwen3 with a block-causal attention: causal across blocks of ``block_size`` positions, bidirectional
inside a block, blocks counted from position 0 (the prompt is cut into blocks too). Per-head
RMSNorm of q and k before RoPE (``q_norm`` / ``k_norm``), GQA, an explicit ``head_dim`` (128 in
every released size, not hidden_size / heads), aligned logits (token i from position i).

Tensor names are plain Qwen3: ``model.embed_tokens``, ``model.layers.N.{input_layernorm,
self_attn.{q,k,v,o}_proj, self_attn.{q,k}_norm, post_attention_layernorm, mlp.{gate,up,down}_proj}``,
``model.norm``, ``lm_head``. The published ``config.json`` (SDAR-4B-Chat: ``block_size`` 4,
``mask_token_id`` 151669, ``head_dim`` 128, ``rope_theta`` 1e6) loads unchanged; the keys SDAR's
training code reads and the inference path ignores (``fuse_cross_entropy``, ``micro_forward``,
``ep_size``, ...) are kept and written back. ``auto_map`` names the family's remote code files:
``save_pretrained`` keeps it, so a saved folder plus those two files loads with SDAR's own code.

Quirks of the reference modeling code, and what dllm does:

* RMSNorm goes through flash-attn's Triton ``rms_norm_fn`` (fp32 math, as dllm's);
* inference attention is flash-attn without a mask when every key is visible, SDPA with the
  block mask otherwise: the same function;
* the MoE variant (``SDARMoeForCausalLM``, SDAR-30B-A3B) is its own format: :mod:`dllm.modeling.sdar_moe`.
"""

from __future__ import annotations

from torch import nn

from .configuration import CheckpointConfigError, CoreSpec, _check_policy
from .core import BackboneLM
from .families import Family, register
from .layers import QWEN2_LAYER_NAMES, DecoderLayer, LayerNames, RMSNorm
from .published import PublishedLayoutConfig

QWEN3_LAYER_NAMES = LayerNames(**{**QWEN2_LAYER_NAMES.__dict__, "q_norm": "self_attn.q_norm",
                                  "k_norm": "self_attn.k_norm"})
MASK_ID = 151669
# The remote-code entry points of the published folders (kept so SDAR's own code finds its classes).
AUTO_MAP = {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
            "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"}
# Keys of the published config.json that only SDAR's own code reads (its training path reads
# `fuse_cross_entropy` unconditionally): a config built here gets the published values, so a saved
# folder loads with that code too.
PUBLISHED_EXTRAS = {"auto_map": AUTO_MAP, "attn_implementation": "flex_attention", "debug": False, "ep_size": 1,
                    "fuse_cross_entropy": True, "micro_forward": False, "skip_checkpoint": False, "use_deepep": False}


class SDARConfig(PublishedLayoutConfig):
    """Config of SDAR / TraDo / LightningRL checkpoints under their own field names.

    Defaults are those of SDAR's ``configuration_sdar.py`` (plus the published ``block_size`` and
    ``mask_token_id``), so a partial config means what it means to SDAR's own code.
    ``attention_policy`` is ours (``"block_causal"``; ``"bidirectional"`` views the weights
    without the block mask) and is written only when changed.
    """

    model_type = "sdar"
    OURS = {"attention_policy": "block_causal"}
    #: keys only the family's own code reads, given their published values when a config lacks them
    PUBLISHED_EXTRAS = PUBLISHED_EXTRAS
    FAMILY = "SDAR"  # names the family in this config's errors

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 4096,
        intermediate_size: int = 22016,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 32,
        head_dim: int = 128,
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
        block_size: int = 4,
        mask_token_id: int | None = MASK_ID,
        attention_policy: str = "block_causal",
        **kwargs,
    ) -> None:
        for key, value in self.PUBLISHED_EXTRAS.items():
            kwargs.setdefault(key, value)
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
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.attention_policy = attention_policy
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.use_cache = use_cache
        _check_policy(attention_policy, block_size)

    def core_spec(self) -> CoreSpec:
        if self.hidden_act != "silu":
            raise CheckpointConfigError(f"{self.FAMILY} config has hidden_act={self.hidden_act!r}; dllm implements 'silu'")
        if self.attention_bias:
            raise CheckpointConfigError(f"{self.FAMILY} config sets attention_bias=true, which dllm does not implement")
        if self.use_sliding_window:
            raise CheckpointConfigError(f"{self.FAMILY} config sets use_sliding_window=true, which dllm does not implement")
        self.unsupported_rope()
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
            qkv_bias=False,
            tie_embeddings=bool(self.tie_word_embeddings),
            logit_shift=False,
            attention_policy=self.attention_policy,
            block_size=self.block_size,
            qk_norm=True,
            block_alignment="position",
        )


class QwenBackbone(nn.Module):
    """``model.embed_tokens``, ``model.layers``, ``model.norm`` under the given layer names; ``mlp_for(i)``
    gives layer i's feed-forward module (None: the dense SwiGLU under the names)."""

    def __init__(self, spec: CoreSpec, names: LayerNames, mlp_for=None) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec, names, i, mlp=mlp_for(i) if mlp_for else None)
                                    for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)


class QwenFormatLM(BackboneLM):
    """A Qwen-format checkpoint (``model.*`` + ``lm_head``); subclasses set ``config_class`` and ``layer_names``,
    and a mixture-of-experts format overrides :meth:`layer_mlp`."""

    layer_names: LayerNames = QWEN2_LAYER_NAMES

    def __init__(self, config) -> None:
        super().__init__(config)
        self._setup_core()
        self._attach(QwenBackbone(self.spec, self.layer_names, self.layer_mlp))

    def layer_mlp(self, index: int) -> nn.Module | None:
        """Layer ``index``'s feed-forward module; None: a dense SwiGLU."""
        return None


class SDARForCausalLM(QwenFormatLM):
    """SDAR checkpoint format (see the module docstring)."""

    config_class = SDARConfig
    layer_names = QWEN3_LAYER_NAMES
    # SDAR's generate.py defaults: denoising_steps = block length, dynamic remasking above 0.85
    family_decoding = {"strategy": "sdar", "unmasking": "low_confidence_dynamic", "threshold": 0.85}  # noqa: RUF012


register(Family("SDAR", "SDARForCausalLM", "sdar", SDARConfig, SDARForCausalLM, MASK_ID, "block_causal", "aligned"))
