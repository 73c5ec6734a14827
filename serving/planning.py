"""Turning a validated request into decoding work (:class:`Plan`): the decoding config, prompts as token
ids, stop strings and caps, with a 400 that names the field for anything the server cannot do."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dllm.decoding.budget import branch_factor
from dllm.decoding.config import DiffusionGenerationConfig, GenerationConfigError

from .errors import ServingError, bad_request, unsupported
from .protocol import DIFFUSION_FIELDS, ChatCompletionRequest, CompletionRequest, rejected_values
from .state import ServerState

MAX_LOPA_BRANCHES = 32
GREEDY_EPS = 1e-5


@dataclass
class Plan:
    """Everything the engine and the response need from one validated request."""

    prompts: list[list[int]]  # token ids, one list per prompt
    n: int
    cfg: DiffusionGenerationConfig  # the batch key: requests share a generate call only with equal configs
    max_tokens: int  # the cap on returned tokens (the canvas is rounded up to whole blocks)
    stop: tuple[str, ...]
    isolated: bool  # seeded sampling: runs in a batch of its own
    echo_texts: list[str] | None = None

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def choices(self) -> int:
        return len(self.prompts) * self.n


def _guess_param(message: str, candidates) -> str | None:
    """The request field a GenerationConfigError is about (its message names the config field)."""
    public = {"max_new_tokens": "max_tokens"}
    names = sorted(candidates, key=len, reverse=True)
    for test in (lambda n: message.startswith(n), lambda n: f" {n}" in message or f"{n}=" in message):
        for name in names:
            if test(name):
                return public.get(name, name)
    return None


def _build_config(state: ServerState, req, max_tokens: int) -> tuple[DiffusionGenerationConfig, bool]:
    from dllm.decoding.registry import StrategyError, check_compatible, get_strategy, unread_options_error

    b = state.bundle
    s = state.settings
    overrides: dict[str, Any] = {k: getattr(req, k) for k in DIFFUSION_FIELDS if getattr(req, k) is not None}
    asked = list(overrides)  # the knobs the client set, each of which must act
    if "top_k" in overrides and overrides["top_k"] >= b.vocab_size:
        overrides["top_k"] = None  # no-op filter
    if req.temperature is not None:
        # Below 1e-5, logits / T overflows to inf; such a temperature is greedy decoding anyway (as in vLLM).
        overrides["temperature"] = float(req.temperature) if req.temperature >= GREEDY_EPS else 0.0
    if req.top_p is not None:
        if req.top_p <= 0:
            raise bad_request("top_p must be in (0, 1]", param="top_p")
        overrides["top_p"] = None if req.top_p >= 1 else float(req.top_p)
    if "lopa_branches" in overrides and overrides["lopa_branches"] > MAX_LOPA_BRANCHES:
        raise bad_request(f"lopa_branches must be <= {MAX_LOPA_BRANCHES}", param="lopa_branches")
    block = overrides.get("block_length", b.base_cfg.block_length)
    if isinstance(block, int) and block > s.max_tokens_cap:
        raise bad_request(f"block_length must be <= {s.max_tokens_cap}", param="block_length")
    if (overrides.get("min_tokens") or 0) > max_tokens:
        raise bad_request(f"min_tokens={overrides['min_tokens']} exceeds max_tokens={max_tokens}", param="min_tokens")
    canvas = max_tokens if not block or block < 1 else math.ceil(max_tokens / block) * block
    overrides["max_new_tokens"] = canvas
    if "steps" in overrides and overrides["steps"] > canvas:
        raise bad_request(f"steps={overrides['steps']} exceeds the number of tokens to decode ({canvas})", param="steps")
    temperature = overrides.get("temperature", b.base_cfg.temperature)
    isolated = req.seed is not None and temperature > 0
    overrides["seed"] = req.seed if isolated else None
    try:
        cfg = b.base_cfg.replace(**overrides)
        strategy = get_strategy(cfg.strategy)
        if (unread := unread_options_error(cfg.strategy, asked)) is not None:
            raise bad_request(f"{unread}; leave it out, or set strategy to one that reads it",
                              param=strategy.unread(asked)[0])
        check_compatible(strategy, b.model, cfg)
    except StrategyError as err:
        raise bad_request(str(err), param="strategy") from None
    except (GenerationConfigError, TypeError, ValueError) as err:
        raise bad_request(str(err), param=_guess_param(str(err), overrides)) from None
    if s.branch_parallel > 1 and strategy.branches and (cfg.temperature > 0 or cfg.remasking != "low_confidence"):
        raise bad_request(f"with --branch-parallel, strategy {cfg.strategy!r} decodes greedily only (temperature 0, "
                          "remasking 'low_confidence'): every rank must make the same choices", param="temperature")
    return cfg, isolated


def _stop_strings(state: ServerState, stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else list(stop)
    s = state.settings
    if len(stops) > s.max_stop:
        raise bad_request(f"at most {s.max_stop} stop strings", param="stop")
    if any(len(x) > s.max_stop_length for x in stops):
        raise bad_request(f"stop strings must be at most {s.max_stop_length} characters", param="stop")
    return tuple(x for x in stops if x)


def _common_checks(state: ServerState, req, n_prompts: int) -> None:
    s = state.settings
    if req.n > s.max_n:
        raise bad_request(f"n must be <= {s.max_n}", param="n")
    if n_prompts > s.max_prompts:
        raise bad_request(f"at most {s.max_prompts} prompts per request", param="prompt")
    if n_prompts * req.n > s.max_rows_per_request:
        raise bad_request(f"prompts x n must be <= {s.max_rows_per_request}", param="n")
    if req.presence_penalty:
        raise unsupported("presence_penalty", "a non-zero presence penalty")
    if req.frequency_penalty:
        raise unsupported("frequency_penalty", "a non-zero frequency penalty")
    if req.logit_bias:
        raise unsupported("logit_bias", "logit_bias")
    for name, what in rejected_values(req):
        raise unsupported(name, what)


def _check_prompt_ids(state: ServerState, ids: list[int], param: str = "prompt") -> list[int]:
    b = state.bundle
    if not ids:
        raise bad_request("the prompt is empty", param=param)
    limit = state.settings.max_prompt_tokens
    if len(ids) > limit:
        raise ServingError(413, f"the prompt has {len(ids)} tokens; the limit is {limit}", param=param,
                           code="prompt_too_long")
    for t in ids:
        if not 0 <= t < b.vocab_size:
            raise bad_request(f"token id {t} is outside the vocabulary [0, {b.vocab_size})", param=param)
        if t == b.mask_id:
            raise bad_request(f"token id {t} is the mask token, which prompts cannot contain", param=param)
    return list(ids)


def _encode_text(state: ServerState, text: str, param: str = "prompt") -> list[int]:
    limit = state.settings.max_prompt_tokens
    if len(text) > 64 * limit:  # cheap early refusal before tokenizing
        raise ServingError(413, f"the prompt is {len(text)} characters; the limit is {limit} tokens", param=param,
                           code="prompt_too_long")
    return _check_prompt_ids(state, list(state.bundle.tokenizer(text, add_special_tokens=True)["input_ids"]), param)


def _check_context(state: ServerState, prompts: list[list[int]], cfg: DiffusionGenerationConfig) -> None:
    ctx = state.bundle.context_length
    if ctx and max(len(p) for p in prompts) + cfg.max_new_tokens > ctx:
        longest = max(len(p) for p in prompts)
        raise ServingError(400, f"this model's context is {ctx} tokens; the prompt ({longest}) plus the decoding "
                                f"canvas ({cfg.max_new_tokens}, max_tokens rounded up to whole blocks) exceed it",
                           param="max_tokens", code="context_length_exceeded")


def _check_cost(state: ServerState, prompts: list[list[int]], n: int, cfg: DiffusionGenerationConfig) -> None:
    """400 when one request would decode more canvas slots than the server allows (bounded memory and time
    per request: rows x LoPA branches x (longest prompt + canvas))."""
    branches = branch_factor(cfg)
    slots = max(len(p) for p in prompts) + cfg.canvas_tokens
    cost = len(prompts) * n * branches * slots
    limit = state.settings.max_request_tokens or state.bundle.max_request_tokens
    if cost > limit:
        per = f"{len(prompts) * n} rows" + (f" x {branches} LoPA branches" if branches > 1 else "") + f" x {slots} slots"
        raise ServingError(400, f"this request would decode {cost:,} canvas slots ({per}); this server's limit is "
                                f"{limit:,} (--max-request-tokens): lower n, lopa_branches or max_tokens",
                           param="n" if n > 1 else ("lopa_branches" if branches > 1 else "max_tokens"),
                           code="request_too_costly")


def plan_completion(state: ServerState, req: CompletionRequest) -> Plan:
    p = req.prompt
    if isinstance(p, str):
        texts, token_prompts = [p], None
    elif not p:
        raise bad_request("prompt must not be empty", param="prompt")
    elif isinstance(p[0], str):
        texts, token_prompts = list(p), None
    elif isinstance(p[0], int):
        texts, token_prompts = None, [list(p)]
    else:
        texts, token_prompts = None, [list(x) for x in p]
    _common_checks(state, req, len(texts or token_prompts))
    if req.logprobs is not None:
        raise unsupported("logprobs", "logprobs")
    if req.suffix:
        raise unsupported("suffix", "suffix (insertion)")
    if req.best_of is not None and req.best_of != req.n:
        raise unsupported("best_of", "best_of different from n")
    max_tokens = req.max_tokens if req.max_tokens is not None else 16
    if max_tokens > state.settings.max_tokens_cap:
        raise bad_request(f"max_tokens must be <= {state.settings.max_tokens_cap}", param="max_tokens")
    stop = _stop_strings(state, req.stop)
    cfg, isolated = _build_config(state, req, max_tokens)
    if texts is not None:
        prompts = [_encode_text(state, t) for t in texts]
    else:
        prompts = [_check_prompt_ids(state, ids) for ids in token_prompts]
    _check_context(state, prompts, cfg)
    _check_cost(state, prompts, req.n, cfg)
    echo = None
    if req.echo:
        tok = state.bundle.tokenizer
        echo = texts if texts is not None else [tok.decode(ids, skip_special_tokens=False) for ids in prompts]
    return Plan(prompts, req.n, cfg, max_tokens, stop, isolated, echo)


def plan_chat(state: ServerState, req: ChatCompletionRequest) -> Plan:
    b = state.bundle
    _common_checks(state, req, 1)
    if req.logprobs:
        raise unsupported("logprobs", "logprobs")
    if req.top_logprobs:
        raise unsupported("top_logprobs", "top_logprobs")
    if req.tools:
        raise unsupported("tools", "tool calling")
    if req.response_format is not None and req.response_format.type != "text":
        raise unsupported("response_format", f"response_format type {req.response_format.type!r}")
    if not b.has_chat_template:
        raise bad_request("this model has no chat template; use /v1/completions", param="messages")
    default = min(b.base_cfg.max_new_tokens, state.settings.max_tokens_cap)
    max_tokens = req.max_completion_tokens or req.max_tokens or default
    if max_tokens > state.settings.max_tokens_cap:
        param = "max_completion_tokens" if req.max_completion_tokens else "max_tokens"
        raise bad_request(f"{param} must be <= {state.settings.max_tokens_cap}", param=param)
    stop = _stop_strings(state, req.stop)
    cfg, isolated = _build_config(state, req, max_tokens)
    messages = []
    total_chars = 0
    for m in req.messages:
        content = m.content if isinstance(m.content, str) else "".join(p.text for p in (m.content or []))
        total_chars += len(content)
        messages.append({"role": "system" if m.role == "developer" else m.role, "content": content})
    limit = state.settings.max_prompt_tokens
    if total_chars > 64 * limit:
        raise ServingError(413, f"the messages hold {total_chars} characters; the limit is {limit} tokens",
                           param="messages", code="prompt_too_long")
    try:
        ids = b.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    except Exception as err:  # noqa: BLE001  (jinja TemplateError, raise_exception in the template, ...)
        raise bad_request(f"the messages do not fit this model's chat template: {err}", param="messages") from None
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    prompts = [_check_prompt_ids(state, list(ids), "messages")]
    _check_context(state, prompts, cfg)
    _check_cost(state, prompts, req.n, cfg)
    return Plan(prompts, req.n, cfg, max_tokens, stop, isolated)


# -- responses -------------------------------------------------------------------------------------
