"""Model configs, the transformer core, the KV cache and Auto-class registration."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

from .attention_masks import block_ids, build_attention_mask
from .configuration import ATTENTION_POLICIES, CheckpointConfigError, CoreSpec, DreamConfig, LLaDAConfig
from .core import DiffusionLM, DiffusionLMOutput, DreamModel, LLaDAModelLM
from .families import FAMILIES, Family, family_of
from .fast_dllm_v2 import Fast_dLLM_QwenForCausalLM, FastDLLMQwenConfig  # registers Fast-dLLM v2
from .kv_cache import CACHE_MODES, DiffusionKVCache, positions_from_mask
from .llada2_moe import LLaDA2MoeConfig, LLaDA2MoeModelLM  # registers the LLaDA2 family
from .llada_moe import LLaDAMoEConfig, LLaDAMoEModelLM  # registers the LLaDA-MoE family
from .sdar import SDARConfig, SDARForCausalLM  # registers the SDAR family (SDAR, TraDo, LightningRL)
from .sdar_moe import SDARMoeConfig, SDARMoeForCausalLM  # registers SDAR's mixture-of-experts variant


def _register() -> None:
    """Each family's config and model class with the transformers Auto classes (the first family of a
    model_type owns it there; dllm.load_model dispatches on architectures[0] itself)."""
    seen = set()
    for family in FAMILIES:
        if family.model_type not in seen:
            seen.add(family.model_type)
            AutoConfig.register(family.model_type, family.config_class, exist_ok=True)
        # a later family of a shared model_type (LLaDA-MoE) is reached through its config class, which
        # the first family's config class hands it (LLaDAConfig.from_dict dispatches on architectures[0])
        for auto in (AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM):
            auto.register(family.config_class, family.model_class, exist_ok=True)


_register()

__all__ = [
    "ATTENTION_POLICIES", "CACHE_MODES", "CheckpointConfigError", "CoreSpec", "DiffusionKVCache", "DiffusionLM",
    "DiffusionLMOutput", "DreamConfig", "DreamModel", "LLaDAConfig", "LLaDAModelLM", "FAMILIES", "Family",
    "LLaDA2MoeConfig", "LLaDA2MoeModelLM", "LLaDAMoEConfig", "LLaDAMoEModelLM", "SDARConfig", "SDARForCausalLM",
    "SDARMoeConfig", "SDARMoeForCausalLM", "FastDLLMQwenConfig", "Fast_dLLM_QwenForCausalLM", "block_ids",
    "build_attention_mask", "family_of", "positions_from_mask",
]
