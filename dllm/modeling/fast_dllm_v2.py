"""Fast-dLLM v2 (``Fast_dLLM_QwenForCausalLM``, ``model_type: "Fast_dLLM_Qwen"``):
Efficient-Large-Model/Fast_dLLM_v2_7B and _1.5B.

Qwen2.5 (q/k/v bias, GQA) fine-tuned into a block-diffusion model: causal across blocks of
``bd_size`` (32) positions counted from position 0, bidirectional inside a block. Its logits are
*shifted*, as an autoregressive model's: the token at position i is read from the hidden state at
i - 1 (the reference decoder concatenates ``logits[:, :1]`` and ``logits[:, :-1]``; dllm's forward
returns the shifted logits directly, as it does for Dream).

Tensor names are plain Qwen2 (``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``
(+ biases of q/k/v), ``mlp.{gate,up,down}_proj``, norms, ``lm_head``). The published
``config.json`` has no ``mask_token_id``: the reference's decoders hard-code 151665, which is the
fallback here; it is written to a saved ``config.json`` only when it differs from that.

Quirks of the reference modeling code, and what dllm does:

* training runs RoPE separately on the two halves of a ``[noisy | clean]`` input (both halves carry
  the same positions, so this is ordinary RoPE on each copy): dllm's two-stream training forward
  (``attention_policy="block_diffusion"``) gives both copies the same positions;
* ``sliding_window`` layers are not implemented: a ``layer_types`` entry other than
  ``full_attention`` fails loading with a message.
"""

from __future__ import annotations

from .configuration import CheckpointConfigError, CoreSpec, _check_policy
from .families import Family, register
from .layers import QWEN2_LAYER_NAMES
from .published import PublishedLayoutConfig
from .sdar import QwenFormatLM

MASK_ID = 151665
# Keys of the published config.json that only the family's own code reads: a config built here gets
# the published values, so a saved folder loads with that code too.
PUBLISHED_EXTRAS = {"auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig",
                                 "AutoModel": "modeling.Fast_dLLM_QwenModel",
                                 "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
                    "conplemenrary_mask": True}  # (sic: the published spelling)


class FastDLLMQwenConfig(PublishedLayoutConfig):
    """Config of Fast-dLLM v2 checkpoints (Qwen2 field names + ``bd_size``).

    Defaults are those of the reference ``configuration.py``. ``block_size`` (dllm's name for a
    block-causal model's block) is an alias of ``bd_size``; ``mask_token_id`` and
    ``attention_policy`` are ours and are written only when they differ from the published values.
    """

    model_type = "Fast_dLLM_Qwen"
    OURS = {"attention_policy": "block_causal", "mask_token_id": MASK_ID}

    def __init__(
        self,
        vocab_size: int = 151936,
        hidden_size: int = 4096,
        intermediate_size: int = 22016,
        num_hidden_layers: int = 32,
        num_attention_heads: int = 32,
        num_key_value_heads: int | None = 32,
        hidden_act: str = "silu",
        max_position_embeddings: int = 32768,
        initializer_range: float = 0.02,
        rms_norm_eps: float = 1e-6,
        use_cache: bool = True,
        tie_word_embeddings: bool = False,
        rope_theta: float = 10000.0,
        rope_scaling: dict | None = None,
        use_sliding_window: bool = False,
        sliding_window: int | None = 4096,
        max_window_layers: int = 28,
        layer_types: list | None = None,
        attention_dropout: float = 0.0,
        bd_size: int = 32,
        mask_token_id: int | None = MASK_ID,
        attention_policy: str = "block_causal",
        block_size: int | None = None,
        **kwargs,
    ) -> None:
        for key, value in PUBLISHED_EXTRAS.items():
            kwargs.setdefault(key, value)
        self._keep_published(rope_scaling=rope_scaling, use_cache=use_cache, kwargs=kwargs)
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.use_sliding_window = use_sliding_window
        self.sliding_window = sliding_window if use_sliding_window else None
        self.max_window_layers = max_window_layers
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.hidden_act = hidden_act
        self.initializer_range = initializer_range
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.attention_dropout = attention_dropout
        self.layer_types = layer_types or ["full_attention"] * num_hidden_layers
        self.bd_size = int(block_size or bd_size)
        self.mask_token_id = mask_token_id
        self.attention_policy = attention_policy
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        self.use_cache = use_cache
        _check_policy(attention_policy, self.bd_size)

    @property
    def block_size(self) -> int:
        return self.bd_size

    def core_spec(self) -> CoreSpec:
        if self.hidden_act != "silu":
            raise CheckpointConfigError(f"Fast-dLLM v2 config has hidden_act={self.hidden_act!r}; dllm implements 'silu'")
        if self.use_sliding_window or any(t != "full_attention" for t in self.layer_types):
            raise CheckpointConfigError("Fast-dLLM v2 config uses sliding-window layers, which dllm does not implement")
        self.unsupported_rope()
        head_dim = getattr(self, "head_dim", None) or self.hidden_size // self.num_attention_heads
        return CoreSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=head_dim,
            intermediate_size=self.intermediate_size,
            rope_theta=float(self.rope_theta),
            rms_norm_eps=float(self.rms_norm_eps),
            qkv_bias=True,
            tie_embeddings=bool(self.tie_word_embeddings),
            logit_shift=True,
            attention_policy=self.attention_policy,
            block_size=self.bd_size,
            block_alignment="position",
        )


class Fast_dLLM_QwenForCausalLM(QwenFormatLM):  # noqa: N801 - the checkpoints' architecture name
    """Fast-dLLM v2 checkpoint format (see the module docstring)."""

    config_class = FastDLLMQwenConfig
    layer_names = QWEN2_LAYER_NAMES
    # v2/eval.py's defaults: threshold 0.9, sub-blocks of 8, no sub-block cache
    family_decoding = {"strategy": "fast_dllm_v2", "threshold": 0.9, "sub_block_length": 8}  # noqa: RUF012


register(Family("Fast-dLLM v2", "Fast_dLLM_QwenForCausalLM", "Fast_dLLM_Qwen", FastDLLMQwenConfig,
                Fast_dLLM_QwenForCausalLM, MASK_ID, "block_causal", "shifted"))
