"""Model configs, the transformer core, the KV cache and Auto-class registration."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

from .attention_masks import block_ids, build_attention_mask
from .configuration import ATTENTION_POLICIES, CheckpointConfigError, CoreSpec, DreamConfig, LLaDAConfig
from .core import DiffusionLM, DiffusionLMOutput, DreamModel, LLaDAModelLM
from .kv_cache import CACHE_MODES, DiffusionKVCache, positions_from_mask

MODEL_TYPES = {"llada": (LLaDAConfig, LLaDAModelLM), "Dream": (DreamConfig, DreamModel)}


def _register() -> None:
    for model_type, (config_cls, model_cls) in MODEL_TYPES.items():
        AutoConfig.register(model_type, config_cls, exist_ok=True)
        for auto in (AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM):
            auto.register(config_cls, model_cls, exist_ok=True)


_register()

__all__ = [
    "ATTENTION_POLICIES", "CACHE_MODES", "CheckpointConfigError", "CoreSpec", "DiffusionKVCache",
    "DiffusionLM", "DiffusionLMOutput", "DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM",
    "MODEL_TYPES", "block_ids", "build_attention_mask", "positions_from_mask",
]
