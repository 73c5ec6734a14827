"""Checkpoint configs for the formats dllm loads (LLaDA, Dream) and the one spec the core reads.

Each format keeps its checkpoint's own field names so a real ``config.json`` loads unchanged; the
``core_spec()`` method translates it into :class:`CoreSpec`, the only thing the transformer core
knows about. Two fields are ours and optional in every format: ``attention_policy``
(``"bidirectional"`` or ``"block_causal"``) and ``block_size`` (for block-causal students, D2F).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PretrainedConfig

ATTENTION_POLICIES = ("bidirectional", "block_causal")
# dllm.modeling.families.family_of, set when that module loads (it imports this one, so this one
# cannot import it): LLaDAConfig.from_dict dispatches other families' "llada" configs through it
_FAMILY_LOOKUP: list = []
# Where a block-causal model's block grid starts: "prompt" (dllm's D2F students: the prompt is one
# bidirectional block, generated blocks start at the prompt end) or "position" (SDAR, Fast-dLLM v2:
# blocks of block_size from position 0, the prompt included, as those checkpoints are trained).
BLOCK_ALIGNMENTS = ("prompt", "position")


class CheckpointConfigError(ValueError):
    """A checkpoint's config asks for something the core does not implement, or is inconsistent."""


@dataclass(frozen=True)
class CoreSpec:
    vocab_size: int  # rows of the embedding / LM head (LLaDA: embedding_size, may exceed the tokenizer)
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_norm_eps: float
    qkv_bias: bool
    tie_embeddings: bool
    logit_shift: bool  # Dream: the logit at position i comes from the hidden state at i-1
    attention_policy: str
    block_size: int | None
    rotary_dim: int | None = None  # dims of each head that RoPE rotates (partial RoPE); None: all head_dim
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (LLaDA2, LLaDA-MoE)
    block_alignment: str = "prompt"  # block-causal only; see BLOCK_ALIGNMENTS

    def __post_init__(self) -> None:
        if self.attention_policy not in ATTENTION_POLICIES:
            raise CheckpointConfigError(
                f"attention_policy={self.attention_policy!r}; valid: {', '.join(ATTENTION_POLICIES)}"
            )
        if self.attention_policy == "block_causal" and (self.block_size is None or self.block_size < 1):
            raise CheckpointConfigError("attention_policy='block_causal' needs a positive block_size in config.json")
        if self.num_heads % self.num_kv_heads:
            raise CheckpointConfigError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.block_alignment not in BLOCK_ALIGNMENTS:
            raise CheckpointConfigError(
                f"block_alignment={self.block_alignment!r}; valid: {', '.join(BLOCK_ALIGNMENTS)}"
            )
        if self.rotary_dim is not None and not (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise CheckpointConfigError(
                f"rotary dims {self.rotary_dim} must be even and in (0, head_dim={self.head_dim}]"
            )


def _check_policy(policy: str, block_size: int | None) -> None:
    if policy not in ATTENTION_POLICIES:
        raise CheckpointConfigError(f"attention_policy={policy!r}; valid: {', '.join(ATTENTION_POLICIES)}")
    if policy == "block_causal" and not block_size:
        raise CheckpointConfigError("attention_policy='block_causal' needs block_size (e.g. 16)")


class LLaDAConfig(PretrainedConfig):
    """Config of GSAI-ML/LLaDA-8B-{Base,Instruct} and LLaDA-1.5 (``model_type: "llada"``).

    Defaults are those of the released 8B checkpoints, not the OLMo ``ModelConfig`` defaults the
    reference code starts from, so a partial config cannot silently become a different model.
    """

    model_type = "llada"

    def __init__(
        self,
        d_model: int = 4096,
        n_layers: int = 32,
        n_heads: int = 32,
        n_kv_heads: int | None = None,
        mlp_hidden_size: int | None = 12288,
        mlp_ratio: int = 4,
        vocab_size: int = 126464,
        embedding_size: int | None = 126464,
        max_sequence_length: int = 4096,
        rope: bool = True,
        rope_theta: float = 500000.0,
        rope_full_precision: bool = True,
        rms_norm_eps: float = 1e-5,
        block_type: str = "llama",
        activation_type: str = "silu",
        layer_norm_type: str = "rms",
        alibi: bool = False,
        include_bias: bool = False,
        include_qkv_bias: bool = False,
        weight_tying: bool = False,
        scale_logits: bool = False,
        input_emb_norm: bool = False,
        attention_layer_norm: bool = False,
        mask_token_id: int | None = 126336,
        eos_token_id: int | None = 126081,
        pad_token_id: int | None = 126081,
        bos_token_id: int | None = None,
        attention_policy: str = "bidirectional",
        block_size: int | None = None,
        use_cache: bool = False,
        **kwargs,
    ) -> None:
        self.d_model = d_model
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads if n_kv_heads is not None else n_heads
        self.mlp_hidden_size = mlp_hidden_size
        self.mlp_ratio = mlp_ratio
        self.embedding_size = embedding_size
        self.max_sequence_length = max_sequence_length
        self.rope = rope
        self.rope_theta = rope_theta
        self.rope_full_precision = rope_full_precision
        self.rms_norm_eps = rms_norm_eps
        self.block_type = block_type
        self.activation_type = activation_type
        self.layer_norm_type = layer_norm_type
        self.alibi = alibi
        self.include_bias = include_bias
        self.include_qkv_bias = include_qkv_bias
        self.weight_tying = weight_tying
        self.scale_logits = scale_logits
        self.input_emb_norm = input_emb_norm
        self.attention_layer_norm = attention_layer_norm
        self.mask_token_id = mask_token_id
        self.attention_policy = attention_policy
        self.block_size = block_size
        self.use_cache = use_cache
        kwargs["tie_word_embeddings"] = weight_tying
        super().__init__(
            vocab_size=vocab_size,
            eos_token_id=eos_token_id,
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            **kwargs,
        )
        self.vocab_size = vocab_size
        _check_policy(attention_policy, block_size)

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):
        """A ``config.json`` of another family that also says ``model_type: "llada"`` (LLaDA-MoE) gets
        that family's config class, chosen by ``architectures[0]``: ``AutoConfig`` and ``AutoModel``
        then load it as ``dllm.load_model`` does."""
        if cls is LLaDAConfig and _FAMILY_LOOKUP:
            architectures = config_dict.get("architectures") or []
            if architectures and architectures[0] != "LLaDAModelLM":
                owner = _FAMILY_LOOKUP[0](config_dict).config_class
                if owner is not cls:
                    return owner.from_dict(config_dict, **kwargs)
        return super().from_dict(config_dict, **kwargs)

    @property
    def hidden_size(self) -> int:  # lets accelerate/peft helpers that read hidden_size work
        return self.d_model

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layers

    @property
    def num_attention_heads(self) -> int:
        return self.n_heads

    def core_spec(self) -> CoreSpec:
        unsupported = {
            "block_type": (self.block_type, "llama"),
            "activation_type": (self.activation_type, "silu"),
            "layer_norm_type": (self.layer_norm_type, "rms"),
        }
        for name, (got, want) in unsupported.items():
            if got != want:
                raise CheckpointConfigError(f"LLaDA config has {name}={got!r}; dllm implements only {want!r}")
        for flag in ("alibi", "include_bias", "scale_logits", "input_emb_norm", "attention_layer_norm"):
            if getattr(self, flag):
                raise CheckpointConfigError(f"LLaDA config sets {flag}=true, which dllm does not implement")
        if not self.rope:
            raise CheckpointConfigError("LLaDA config sets rope=false; dllm implements RoPE positions only")
        hidden = self.mlp_hidden_size or self.mlp_ratio * self.d_model
        return CoreSpec(
            vocab_size=self.embedding_size or self.vocab_size,
            hidden_size=self.d_model,
            num_layers=self.n_layers,
            num_heads=self.n_heads,
            num_kv_heads=self.n_kv_heads,
            head_dim=self.d_model // self.n_heads,
            intermediate_size=hidden,
            rope_theta=float(self.rope_theta),
            rms_norm_eps=float(self.rms_norm_eps),
            qkv_bias=bool(self.include_qkv_bias),
            tie_embeddings=bool(self.weight_tying),
            logit_shift=False,
            attention_policy=self.attention_policy,
            block_size=self.block_size,
        )


class DreamConfig(PretrainedConfig):
    """Config of Dream-org/Dream-v0-{Base,Instruct}-7B (``model_type: "Dream"``, Qwen2 field names)."""

    model_type = "Dream"

    def __init__(
        self,
        vocab_size: int = 152064,
        hidden_size: int = 3584,
        intermediate_size: int = 18944,
        num_hidden_layers: int = 28,
        num_attention_heads: int = 28,
        num_key_value_heads: int = 4,
        hidden_act: str = "silu",
        max_position_embeddings: int = 131072,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 1000000.0,
        rope_scaling: dict | None = None,
        tie_word_embeddings: bool = False,
        use_sliding_window: bool = False,
        attention_dropout: float = 0.0,
        mask_token_id: int | None = 151666,
        pad_token_id: int | None = 151643,
        bos_token_id: int | None = 151643,
        eos_token_id: int | None = 151643,
        attention_policy: str = "bidirectional",
        block_size: int | None = None,
        use_cache: bool = False,
        **kwargs,
    ) -> None:
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads or num_attention_heads
        self.hidden_act = hidden_act
        self.max_position_embeddings = max_position_embeddings
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        # Kept under our own name: transformers 5 rewrites a `rope_scaling` attribute into `rope_parameters`.
        self.unsupported_rope_scaling = rope_scaling if rope_scaling and rope_scaling.get("rope_type", rope_scaling.get("type")) not in (None, "default") else None
        self.use_sliding_window = use_sliding_window
        self.attention_dropout = attention_dropout
        self.mask_token_id = mask_token_id
        self.attention_policy = attention_policy
        self.block_size = block_size
        self.use_cache = use_cache
        super().__init__(
            vocab_size=vocab_size,
            pad_token_id=pad_token_id,
            bos_token_id=bos_token_id,
            eos_token_id=eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **kwargs,
        )
        self.vocab_size = vocab_size
        _check_policy(attention_policy, block_size)

    def core_spec(self) -> CoreSpec:
        if self.hidden_act != "silu":
            raise CheckpointConfigError(f"Dream config has hidden_act={self.hidden_act!r}; dllm implements 'silu'")
        if self.unsupported_rope_scaling:
            raise CheckpointConfigError(
                f"Dream config sets rope_scaling={self.unsupported_rope_scaling}, which dllm does not implement"
            )
        if self.use_sliding_window:
            raise CheckpointConfigError("Dream config sets use_sliding_window=true, which dllm does not implement")
        return CoreSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.hidden_size // self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            rope_theta=float(self.rope_theta),
            rms_norm_eps=float(self.rms_norm_eps),
            qkv_bias=True,
            tie_embeddings=bool(self.tie_word_embeddings),
            logit_shift=True,
            attention_policy=self.attention_policy,
            block_size=self.block_size,
        )
