"""dllm: fast, practical diffusion language models.

Public API::

    from dllm import load_model, load_tokenizer, generate_text, DiffusionGenerationConfig
"""

from .errors import CheckpointError
from .generation import DiffusionGenerationConfig, GenerationConfigError
from .loading import load_model, resolve_model_path
from .modeling import (
    CheckpointConfigError,
    DiffusionKVCache,
    DiffusionLM,
    DreamConfig,
    DreamModel,
    LLaDAConfig,
    LLaDAModelLM,
)
from .text import TextResult, generate_text
from .text import load_tokenizer_for as _load_tokenizer_for
from .version import __version__


def load_tokenizer(name_or_path):
    """The tokenizer of a bundled model name or a local checkpoint directory (offline)."""
    return _load_tokenizer_for(resolve_model_path(name_or_path))


__all__ = [
    "CheckpointConfigError", "CheckpointError", "DiffusionGenerationConfig", "DiffusionKVCache", "DiffusionLM",
    "DreamConfig", "DreamModel", "GenerationConfigError", "LLaDAConfig", "LLaDAModelLM", "TextResult",
    "__version__", "generate_text", "load_model", "load_tokenizer", "resolve_model_path",
]
