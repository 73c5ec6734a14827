"""OpenAI-compatible serving for dllm models: ``dllm serve`` or ``dllm.serving.create_app``."""

from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app"]


def __getattr__(name: str):
    if name == "create_app":  # FastAPI is an optional extra: import it only when asked for
        from .app import create_app

        return create_app
    raise AttributeError(name)
