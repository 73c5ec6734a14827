"""Request models (pydantic, ``extra="ignore"``: clients send fields we do not use) and response shapes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Model):
    include_usage: bool | None = False


class DiffusionOptions(_Model):
    """Diffusion knobs, as extra top-level fields (``extra_body=`` in the openai client).

    Each maps onto the field of the same name of ``DiffusionGenerationConfig``; values are checked
    there (an invalid one is a 400 that names the field).
    """

    strategy: str | None = None
    threshold: float | None = None
    block_length: int | None = None
    cache: str | None = None
    steps: int | None = None
    factor: float | None = None
    block_add_threshold: float | None = None
    decoded_token_threshold: float | None = None
    skip_threshold: float | None = None
    entropy_threshold: float | None = None
    lopa_branches: int | None = None
    lopa_alpha: float | None = None
    lopa_rho: float | None = None
    lopa_confidence: str | None = None
    remasking: str | None = None
    refresh_interval: int | None = None
    cache_delay: int | None = None
    top_k: int | None = None


DIFFUSION_FIELDS = tuple(DiffusionOptions.model_fields)


class SamplingRequest(DiffusionOptions):
    model: StrictStr
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=SEED_MIN, le=SEED_MAX)
    stop: StrictStr | list[StrictStr] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None


Prompt = StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]


class CompletionRequest(SamplingRequest):
    prompt: Prompt
    max_tokens: int | None = Field(16, ge=1)
    echo: bool | None = False
    logprobs: int | None = Field(None, ge=0, le=20)
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None


class TextPart(_Model):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | list[TextPart] | None = None
    name: str | None = None


class ResponseFormat(_Model):
    type: str = "text"


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(..., min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: ResponseFormat | None = None


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
