"""The FastAPI app: OpenAI-compatible routes, auth, limits, SSE streaming, health and metrics.

``create_app(settings, model=None, tokenizer=None)`` builds one app; with no model it loads
``settings.model`` in the background (``/health`` answers at once, ``/ready`` once it has loaded).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from dllm.decoding.config import DiffusionGenerationConfig, GenerationConfigError

from .engine import Engine, EngineRequest
from .engine_process import ModelInfo, RemoteEngine
from .errors import ServingError, bad_request, internal, not_ready, unsupported
from .metrics import ServerMetrics
from .protocol import DIFFUSION_FIELDS, ChatCompletionRequest, CompletionRequest, rejected_values, unknown_fields, usage
from .settings import ServerSettings, apply_generation_defaults

log = logging.getLogger("dllm.serving")

MAX_LOPA_BRANCHES = 32
GREEDY_EPS = 1e-5
DISCONNECT_POLL_S = 0.1
SETTINGS_ECHOED = DIFFUSION_FIELDS + ("max_new_tokens", "temperature", "top_p")


# -- the loaded model ----------------------------------------------------------------------------
class ModelBundle:
    """The model, its tokenizer and what requests are checked against."""

    def __init__(self, model, tokenizer) -> None:
        """``model``: the loaded model, or the :class:`~dllm.serving.engine_process.ModelInfo` of one that
        lives in the engine process."""
        from dllm.special_ids import require_mask_token

        self.model = model
        self.tokenizer = tokenizer
        base = model.diffusion_generation_config
        self.base_cfg = base.replace(return_dict_in_generate=True, stop_strings=(), seed=None)
        if isinstance(model, ModelInfo):
            self.mask_id = model.mask_token_id
            rows = model.vocab_rows
        else:
            self.mask_id = base.mask_token_id if base.mask_token_id is not None else require_mask_token(model, tokenizer)
            rows = model.get_input_embeddings().weight.shape[0]
        self.vocab_size = min(rows, len(tokenizer))
        cfg = model.config
        self.context_length = getattr(cfg, "max_sequence_length", None) or getattr(cfg, "max_position_embeddings", None)
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        spec = cfg.core_spec() if hasattr(cfg, "core_spec") else None
        block_causal = bool(model.is_block_causal)
        self.facts = {  # what /v1/models reports about the model, besides its id
            "family": getattr(cfg, "model_type", None),
            "architecture": (getattr(cfg, "architectures", None) or [type(model).__name__])[0],
            "attention": "block_causal" if block_causal else "bidirectional",
            "block_size": spec.block_size if block_causal and spec is not None else None,
            "logits": "shifted" if spec is not None and spec.logit_shift else "aligned",
            "default_strategy": base.strategy,
            "mask_token_id": self.mask_id,
        }


def load_bundle(settings: ServerSettings, model=None) -> ModelBundle:
    """Load ``settings.model`` (or wrap an already loaded ``model``) with the checkpoint's tokenizer."""
    from dllm.loading import load_model, resolve_model_path
    from dllm.text import load_tokenizer_for

    path = resolve_model_path(settings.model)
    if model is None:
        model = load_model(path, dtype=settings.dtype, device=settings.device)
    apply_generation_defaults(model, settings.generation_defaults)
    return ModelBundle(model, load_tokenizer_for(path))


# -- app state ------------------------------------------------------------------------------------
class ServerState:
    def __init__(self, settings: ServerSettings, bundle: ModelBundle | None) -> None:
        self.settings = settings
        self.metrics = ServerMetrics()
        self.bundle = bundle
        self.engine: Engine | None = None
        self.created = int(time.time())
        self.load_error: str | None = None
        self.generate_fn = None  # a branch-parallel executor's generate, when one runs

    def start_engine(self) -> None:
        b = self.bundle
        s = self.settings
        self.engine = Engine(b.model, b.tokenizer, max_batch_size=s.max_batch_size, max_queue=s.max_queue,
                             batch_wait_ms=s.batch_wait_ms, stream_interval_ms=s.stream_interval_ms,
                             join=s.join, join_max_spread_blocks=s.join_max_spread,
                             metrics=self.metrics, generate_fn=self.generate_fn)
        self.engine.start()

    def engine_spec(self) -> dict:
        """What the engine process needs (``settings.engine_process``)."""
        s = self.settings
        return {"model": s.model, "dtype": s.dtype, "device": s.device, "num_threads": s.num_threads,
                "branch_parallel": s.branch_parallel, "generation_defaults": dict(s.generation_defaults),
                "engine": {"max_batch_size": s.max_batch_size, "max_queue": s.max_queue,
                           "batch_wait_ms": s.batch_wait_ms, "stream_interval_ms": s.stream_interval_ms,
                           "join": s.join, "join_max_spread_blocks": s.join_max_spread}}

    def load_remote(self) -> None:
        """Start the engine process, wait for its model, load the tokenizer here (blocking)."""
        from dllm.loading import resolve_model_path
        from dllm.text import load_tokenizer_for

        tokenizer = load_tokenizer_for(resolve_model_path(self.settings.model))  # a bad path fails before the spawn
        engine = RemoteEngine(self.engine_spec(), max_queue=self.settings.max_queue, metrics=self.metrics)
        info = engine.start()
        try:
            self.bundle = ModelBundle(info, tokenizer)
        except Exception:
            engine.stop()
            raise
        self.engine = engine

    @property
    def ready(self) -> bool:
        return self.engine is not None


def create_app(settings: ServerSettings | None = None, *, model=None, tokenizer=None, generate_fn=None,
               engine: RemoteEngine | None = None) -> FastAPI:
    """The FastAPI app.

    * ``model`` + ``tokenizer``: serve an already loaded model with a decoding thread in this process;
    * ``engine`` (a started :class:`~dllm.serving.engine_process.RemoteEngine`) + ``tokenizer``: the model
      lives in the engine process (what ``dllm serve`` does by default);
    * neither: load ``settings.model`` in the background (``settings.engine_process`` picks where).
    """
    settings = settings or ServerSettings()
    if engine is not None:
        if tokenizer is None or model is not None:
            raise ValueError("with engine=, pass the tokenizer and no model (the model lives in the engine process)")
        model = engine.info
    elif (model is None) != (tokenizer is None):
        raise ValueError("pass both model and tokenizer, or neither (then settings.model is loaded)")
    state = ServerState(settings, ModelBundle(model, tokenizer) if model is not None else None)
    state.generate_fn = generate_fn
    if engine is not None:
        engine.metrics = state.metrics
        state.engine = engine

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        loader = None
        if state.bundle is None:
            async def load() -> None:
                try:
                    if settings.engine_process:
                        await asyncio.to_thread(state.load_remote)
                    else:
                        state.bundle = await asyncio.to_thread(load_bundle, settings)
                        state.start_engine()
                except Exception as err:  # /ready stays 503 and says why
                    log.exception("loading %s failed", settings.model)
                    state.load_error = f"{type(err).__name__}: {err}"
            loader = asyncio.create_task(load())
        elif state.engine is None:
            state.start_engine()
        try:
            yield
        finally:
            if loader is not None:
                loader.cancel()
            if state.engine is not None:
                await asyncio.to_thread(state.engine.stop)

    app = FastAPI(title="dllm OpenAI-compatible server", version="0.1.0", lifespan=lifespan)
    app.state.dllm = state
    _install_error_handlers(app, state)
    _install_routes(app, state)
    return app


# -- errors -----------------------------------------------------------------------------------------
def _install_error_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(ServingError)
    async def _serving_error(request: Request, err: ServingError):
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return ServingError(err.status_code, str(err.detail), code=code, headers=getattr(err, "headers", None)).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return internal("internal server error; see the server log").response()


# -- request plumbing -----------------------------------------------------------------------------
def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def _read_json(request: Request, limit: int) -> dict:
    length = request.headers.get("content-length")
    if length and length.isdigit() and int(length) > limit:
        raise ServingError(413, f"request body is {length} bytes; the limit is {limit}", code="request_too_large")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ServingError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise bad_request(f"the request body is not valid JSON ({str(err)[:200]})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", code="invalid_json")
    return body


def _parse(model: type[BaseModel], body: dict) -> Any:
    if unknown := unknown_fields(model, body):
        raise bad_request(f"unknown field(s): {'; '.join(unknown)}. Diffusion options: "
                          f"{', '.join(DIFFUSION_FIELDS)}", param=unknown[0].split(" ")[0], code="unknown_parameter")
    try:
        return model.model_validate(body)
    except ValidationError as err:
        errors = err.errors(include_url=False, include_input=False)
        parts = []
        for e in errors[:5]:
            loc = ".".join(str(x) for x in e["loc"]) or "body"
            parts.append(f"{loc}: {e['msg']}")
        first = errors[0]["loc"] if errors else ()
        param = str(first[0]) if first else None
        more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
        raise bad_request("invalid request: " + "; ".join(parts) + more, param=param) from None


def _check_auth(state: ServerState, request: Request) -> None:
    key = state.settings.api_key
    if not key:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
        raise ServingError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


def _require_ready(state: ServerState) -> ModelBundle:
    if not state.ready:
        if state.load_error:
            raise ServingError(503, f"the model failed to load: {state.load_error}", type="server_error",
                               code="model_load_failed")
        raise not_ready()
    return state.bundle


def _check_model(state: ServerState, name: str) -> None:
    if name != state.settings.model_name:
        raise ServingError(404, f"the model '{name}' does not exist; this server serves '{state.settings.model_name}'",
                           param="model", code="model_not_found")


# -- turning a request into decoding work --------------------------------------------------------
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
    from dllm.decoding.registry import StrategyError, check_compatible, get_strategy

    b = state.bundle
    s = state.settings
    overrides: dict[str, Any] = {k: getattr(req, k) for k in DIFFUSION_FIELDS if getattr(req, k) is not None}
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
        check_compatible(get_strategy(cfg.strategy), b.model)
    except StrategyError as err:
        raise bad_request(str(err), param="strategy") from None
    except (GenerationConfigError, TypeError, ValueError) as err:
        raise bad_request(str(err), param=_guess_param(str(err), overrides)) from None
    if s.branch_parallel > 1 and cfg.strategy == "lopa" and (cfg.temperature > 0 or cfg.remasking != "low_confidence"):
        raise bad_request("with --branch-parallel, strategy 'lopa' decodes greedily only (temperature 0, remasking "
                          "'low_confidence'): every rank must make the same choices", param="temperature")
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


def _plan_completion(state: ServerState, req: CompletionRequest) -> Plan:
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
    echo = None
    if req.echo:
        tok = state.bundle.tokenizer
        echo = texts if texts is not None else [tok.decode(ids, skip_special_tokens=False) for ids in prompts]
    return Plan(prompts, req.n, cfg, max_tokens, stop, isolated, echo)


def _plan_chat(state: ServerState, req: ChatCompletionRequest) -> Plan:
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
    return Plan(prompts, req.n, cfg, max_tokens, stop, isolated)


# -- responses -------------------------------------------------------------------------------------
def _dllm_summary(cfg: DiffusionGenerationConfig, stats: dict[int, dict]) -> dict:
    per = [{"index": i, **_rounded(info)} for i, info in sorted(stats.items())]
    nfe = [p["num_forwards"] for p in per]
    tokens = sum(p["completion_tokens"] for p in per)
    return {
        "strategy": cfg.strategy,
        "num_forwards": max(nfe) if nfe else 0,
        "tpf": round(tokens / sum(nfe), 4) if sum(nfe) else 0.0,
        "settings": {k: getattr(cfg, k) for k in SETTINGS_ECHOED if hasattr(cfg, k)},
        "choices": per,
    }


class _Collector:
    """Accumulates engine events (the same code path for streamed and non-streamed answers)."""

    def __init__(self, n_choices: int) -> None:
        self.texts = [""] * n_choices
        self.tokens: dict[int, int] = {}
        self.reasons: dict[int, str] = {}
        self.stats: dict[int, dict] = {}  # per choice: num_forwards, completion_tokens, tpf

    def add(self, ev) -> None:
        if ev.kind == "delta":
            self.texts[ev.index] += ev.text
        elif ev.kind == "finish":
            self.tokens[ev.index] = ev.info["completion_tokens"]
            self.reasons[ev.index] = ev.finish_reason
        elif ev.kind == "stats":
            self.stats[ev.index] = ev.info

    @property
    def completion_tokens(self) -> int:
        return sum(self.tokens.values())


async def _collect(handle: EngineRequest, request: Request, n_choices: int, on_text) -> _Collector:
    """Wait for every row; cancel the work if the client disconnects meanwhile.

    The disconnect check runs every ``DISCONNECT_POLL_S`` whether or not events keep arriving.
    """
    col = _Collector(n_choices)
    events = handle.events().__aiter__()
    loop = asyncio.get_running_loop()
    last_check = loop.time()
    try:
        while True:
            nxt = asyncio.ensure_future(events.__anext__())
            while not nxt.done():
                await asyncio.wait({nxt}, timeout=DISCONNECT_POLL_S)
                if loop.time() - last_check >= DISCONNECT_POLL_S:
                    last_check = loop.time()
                    if await request.is_disconnected():
                        nxt.cancel()
                        raise _ClientGone()
            try:
                ev = nxt.result()
            except StopAsyncIteration:
                return col
            if ev.kind == "error":
                raise ev.error
            if ev.kind == "delta" and ev.text:
                on_text()
            col.add(ev)
    finally:
        handle.cancel()


class _ClientGone(Exception):
    pass


def _sse(payload: Any) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


# -- routes ----------------------------------------------------------------------------------------
def _install_routes(app: FastAPI, state: ServerState) -> None:
    metrics = state.metrics
    settings = state.settings

    def fail(endpoint: str, err: ServingError) -> JSONResponse:
        metrics.errors.labels(endpoint, str(err.status)).inc()
        return err.response()

    @app.get("/health")
    async def health():
        if state.engine is not None and not state.engine.alive:
            return JSONResponse({"status": "error", "detail": "the decoding worker stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        if state.ready:
            return {"status": "ready", "model": settings.model_name}
        body = {"status": "loading" if state.load_error is None else "failed"}
        if state.load_error:
            body["detail"] = state.load_error
        return JSONResponse(body, status_code=503)

    @app.get("/metrics")
    async def metrics_route():
        data, ctype = metrics.render()
        return Response(data, media_type=ctype)

    def _model_card() -> dict:
        # max_model_len as vLLM reports it; the model's facts under "dllm" (once it has loaded)
        card = {"id": settings.model_name, "object": "model", "created": state.created, "owned_by": "dllm",
                "root": settings.model}
        if state.ready:
            card["max_model_len"] = state.bundle.context_length
            card["dllm"] = dict(state.bundle.facts)
        return card

    @app.get("/v1/models")
    async def list_models(request: Request):
        metrics.requests.labels("models").inc()
        try:
            _check_auth(state, request)
        except ServingError as err:
            return fail("models", err)
        return {"object": "list", "data": [_model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request):
        metrics.requests.labels("models").inc()
        try:
            _check_auth(state, request)
            _check_model(state, model_id)
        except ServingError as err:
            return fail("models", err)
        return _model_card()

    async def handle(endpoint: str, request: Request, chat: bool):
        t0 = time.perf_counter()
        metrics.requests.labels(endpoint).inc()
        try:
            _check_auth(state, request)
            body = await _read_json(request, settings.max_body_bytes)
            req = _parse(ChatCompletionRequest if chat else CompletionRequest, body)
            _check_model(state, req.model)
            _require_ready(state)
            plan = _plan_chat(state, req) if chat else _plan_completion(state, req)
            handle_ = state.engine.submit(plan.prompts, n=plan.n, cfg=plan.cfg, max_tokens=plan.max_tokens,
                                          stop=plan.stop, isolated=plan.isolated)
        except ServingError as err:
            return fail(endpoint, err)
        metrics.prompt_tokens.inc(plan.prompt_tokens)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        first = []

        def on_text() -> None:
            if not first:
                first.append(True)
                metrics.ttft.labels(endpoint).observe(time.perf_counter() - t0)

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            return StreamingResponse(
                _finish_stream(_sse_stream(handle_, plan, rid, created, req.model, include_usage, on_text, chat),
                               endpoint, t0, handle_, metrics),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            col = await _collect(handle_, request, plan.choices, on_text)
        except _ClientGone:
            return Response(status_code=499)
        except ServingError as err:
            return fail(endpoint, err)
        payload = _chat_response(plan, col, rid, created, req.model) if chat else \
            _completion_response(plan, col, rid, created, req.model)
        metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)
        return JSONResponse(payload)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await handle("completions", request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await handle("chat", request, chat=True)


def _completion_response(plan: Plan, col: _Collector, rid: str, created: int, model: str) -> dict:
    choices = []
    for i in range(plan.choices):
        text = col.texts[i]
        if plan.echo_texts is not None:
            text = plan.echo_texts[i // plan.n] + text
        choices.append({"index": i, "text": text, "logprobs": None, "finish_reason": col.reasons.get(i)})
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": usage(plan.prompt_tokens, col.completion_tokens), "system_fingerprint": None,
            "dllm": _dllm_summary(plan.cfg, col.stats)}


def _chat_response(plan: Plan, col: _Collector, rid: str, created: int, model: str) -> dict:
    choices = [{"index": i, "message": {"role": "assistant", "content": col.texts[i]}, "logprobs": None,
                "finish_reason": col.reasons.get(i)} for i in range(plan.choices)]
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "choices": choices,
            "usage": usage(plan.prompt_tokens, col.completion_tokens), "system_fingerprint": None,
            "dllm": _dllm_summary(plan.cfg, col.stats)}


async def _finish_stream(gen: AsyncIterator[str], endpoint: str, t0: float, handle: EngineRequest, metrics):
    ok = False
    try:
        async for item in gen:
            yield item
        ok = True
    finally:
        handle.cancel()  # client gone mid-stream (or done): stop any remaining work
        if ok:
            metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)


async def _sse_stream(handle: EngineRequest, plan: Plan, rid: str, created: int, model: str, include_usage: bool,
                      on_text, chat: bool):
    """The SSE body of a streamed completion (``chat``: chat.completion.chunk, else text_completion)."""
    col = _Collector(plan.choices)
    base = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": model}
    if chat:
        base["system_fingerprint"] = None
    head = "data: " + json.dumps(base, separators=(",", ":"))[:-1] + ',"choices":['

    def chunk(index: int, text: str | None = None, finish: str | None = None, role: bool = False) -> str:
        if chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        return head + json.dumps(choice, separators=(",", ":"), ensure_ascii=False) + "]}\n\n"

    opening = []
    if chat:
        opening = [chunk(i, role=True) for i in range(plan.choices)]
    elif plan.echo_texts is not None:
        opening = [chunk(i, text=plan.echo_texts[i // plan.n]) for i in range(plan.choices)]
    if opening:
        yield "".join(opening)
    # Without a usage chunk the stream ends when the last row ends; the usage chunk also carries the
    # forward counts, which may come only when the batch's generate call returns.
    async for batch in handle.event_batches(until="stats" if include_usage else "finish"):
        texts: dict[int, str] = {}  # one chunk per choice and wake-up: a choice's deltas in order, merged
        finishes, error = [], None
        for ev in batch:
            if ev.kind == "error":
                error = ev.error
                break
            col.add(ev)
            if ev.kind == "delta" and ev.text:
                texts[ev.index] = texts.get(ev.index, "") + ev.text
            elif ev.kind == "finish":
                finishes.append(ev)
        if texts:
            on_text()
        out = [chunk(i, text=t) for i, t in texts.items()] + [chunk(ev.index, finish=ev.finish_reason)
                                                                for ev in finishes]
        if error is not None:
            yield "".join(out) + _sse(error.body()) + "data: [DONE]\n\n"
            return
        if out:
            yield "".join(out)
    if include_usage:
        yield _sse({**base, "choices": [], "usage": usage(plan.prompt_tokens, col.completion_tokens),
                    "dllm": _dllm_summary(plan.cfg, col.stats)})
    yield "data: [DONE]\n\n"


def _rounded(info: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in info.items()}


__all__ = ["ModelBundle", "ServerState", "create_app", "load_bundle"]
