"""The ``generate`` mixin every dllm model carries; the decoding config it reads lives in ``dllm.decoding.config``
and is re-exported here, where earlier releases defined it."""

from dllm.decoding.config import DiffusionGenerationConfig
from dllm.decoding.errors import GenerationConfigError

from .mixin import DiffusionGenerationMixin

__all__ = ["DiffusionGenerationConfig", "DiffusionGenerationMixin", "GenerationConfigError"]
