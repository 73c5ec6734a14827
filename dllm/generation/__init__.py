"""Generation config and the ``generate`` mixin every dllm model carries."""

from .config import DiffusionGenerationConfig, GenerationConfigError
from .mixin import DiffusionGenerationMixin

__all__ = ["DiffusionGenerationConfig", "DiffusionGenerationMixin", "GenerationConfigError"]
