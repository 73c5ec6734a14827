"""Request models and response shapes.

A request's top-level fields must each be known here (``unknown_fields``: the server answers 400 naming
any other, so a typo such as ``skip_treshold`` never silently falls back to a default). Known fields are
either honoured or, where a value would change the answer and the server cannot honour it, refused with
a 400 that names them (``rejected_values``). Nested objects (messages, content parts) ignore extra keys,
as the OpenAI API tolerates provider-specific message fields.
"""

from __future__ import annotations

import difflib
from typing import Any, Literal

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
    d2f_confidence: str | None = None
    entropy_threshold: float | None = None
    lopa_branches: int | None = None
    lopa_alpha: float | None = None
    lopa_rho: float | None = None
    lopa_confidence: str | None = None
    editing_threshold: float | None = None
    max_post_steps: int | None = None
    denoising_steps: int | None = None  # sdar
    unmasking: str | None = None  # sdar
    sub_block_length: int | None = None  # fast_dllm_v2
    remasking: str | None = None
    refresh_interval: int | None = None
    cache_delay: int | None = None
    top_k: int | None = None
    # vLLM / SGLang sampling extras, honoured by every strategy (dllm.decoding.runner.LogitRules)
    min_p: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None


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
    user: str | None = None  # an end-user id for the client's own records; it does not change the answer
    # OpenAI fields a diffusion server cannot honour: accepted only at values that change nothing
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    # vLLM / SGLang extras (extra_body=) with no meaning here: accepted only at values that change nothing
    repetition_penalty: float | None = Field(None, gt=0)
    skip_special_tokens: bool | None = None
    guided_json: Any = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


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
    parallel_tool_calls: bool | None = None
    functions: list[dict] | None = None
    function_call: str | dict | None = None
    response_format: ResponseFormat | None = None
    modalities: list[str] | None = None
    audio: dict | None = None
    prediction: dict | None = None
    reasoning_effort: str | None = None
    web_search_options: dict | None = None


def unknown_fields(model: type[BaseModel], body: dict) -> list[str]:
    """Top-level names of ``body`` that ``model`` does not define, each with a close known name if any
    (``"skip_treshold (did you mean skip_threshold?)"``)."""
    known = list(model.model_fields)
    out = []
    for name in body:
        if name not in model.model_fields:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.8)
            out.append(f"{name} (did you mean {close[0]}?)" if close else str(name))
    return out


# field -> (the values that change nothing, what the server cannot do); any other value is a 400
_INERT = {
    "metadata": ((None, {}), "storing completions with metadata"),
    "store": ((None, False), "storing completions"),
    "service_tier": ((None, "auto", "default"), "service tiers"),
    "repetition_penalty": ((None, 1.0), "a repetition penalty (tokens are committed in parallel, so no token "
                                        "is generated after the ones it would penalise)"),
    "skip_special_tokens": ((None, True), "returning special tokens"),
    "guided_json": ((None,), "guided decoding"),
    "guided_regex": ((None,), "guided decoding"),
    "guided_choice": ((None,), "guided decoding"),
    "guided_grammar": ((None,), "guided decoding"),
    "functions": ((None, []), "function calling"),
    "function_call": ((None, "none"), "function calling"),
    "modalities": ((None, ["text"]), "output modalities other than text"),
    "audio": ((None,), "audio output"),
    "prediction": ((None,), "predicted outputs"),
    "reasoning_effort": ((None,), "reasoning effort"),
    "web_search_options": ((None,), "web search"),
}


def rejected_values(req: BaseModel) -> list[tuple[str, str]]:
    """``(field, what is not supported)`` for each known field set to a value this server cannot honour."""
    return [(name, what) for name, (inert, what) in _INERT.items()
            if name in type(req).model_fields and getattr(req, name) not in inert]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}
