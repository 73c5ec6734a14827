"""dllm: fast, practical diffusion language models."""

from .modeling import (
    CheckpointConfigError,
    DiffusionKVCache,
    DiffusionLM,
    DreamConfig,
    DreamModel,
    LLaDAConfig,
    LLaDAModelLM,
)

__version__ = "0.1.0"
