"""What the server holds: the loaded model (or what the API process knows of one in the engine process),
the engine that decodes, metrics, and the checks every route makes against them."""

from __future__ import annotations

import hmac
import time

from fastapi import Request

from .engine import Engine
from .engine_process import ModelInfo, RemoteEngine, memory_slot_budget
from .errors import ServingError, not_ready
from .metrics import ServerMetrics
from .settings import ServerSettings, apply_generation_defaults

DEFAULT_REQUEST_TOKENS = 65_536  # 64 rows of 1,024 slots: ServerSettings.max_request_tokens when unset


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
        # canvas slots one request may decode (planning checks rows x branches x (prompt + canvas))
        budget = model.slot_budget if isinstance(model, ModelInfo) else memory_slot_budget(model)
        self.max_request_tokens = min(DEFAULT_REQUEST_TOKENS, budget)
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


class ServerState:
    def __init__(self, settings: ServerSettings, bundle: ModelBundle | None) -> None:
        self.settings = settings
        self.metrics = ServerMetrics()
        self.bundle = bundle
        self.engine: Engine | None = None
        self.created = int(time.time())
        self.load_error: str | None = None
        self.branch_executor = None  # a branch-parallel executor's factory, when one runs
        self.session_factory = None  # the engine's batches (tensor-parallel serving mirrors them on every rank)
        self.draining = False  # shutdown has begun (begin_drain)
        self.restarts = 0  # engines restarted after one stopped

    def start_engine(self) -> None:
        b = self.bundle
        s = self.settings
        self.engine = Engine(b.model, b.tokenizer, max_batch_size=s.max_batch_size, max_queue=s.max_queue,
                             batch_wait_ms=s.batch_wait_ms, stream_interval_ms=s.stream_interval_ms,
                             join=s.join, join_max_spread_blocks=s.join_max_spread,
                             metrics=self.metrics, branch_executor=self.branch_executor,
                             max_batches=s.max_batches, session_factory=self.session_factory)
        self.engine.start()

    def engine_spec(self) -> dict:
        """What the engine process needs (``settings.engine_process``)."""
        s = self.settings
        return {"model": s.model, "dtype": s.dtype, "device": s.device, "num_threads": s.num_threads,
                "branch_parallel": s.branch_parallel, "generation_defaults": dict(s.generation_defaults),
                "engine": {"max_batch_size": s.max_batch_size, "max_queue": s.max_queue,
                           "batch_wait_ms": s.batch_wait_ms, "stream_interval_ms": s.stream_interval_ms,
                           "join": s.join, "join_max_spread_blocks": s.join_max_spread,
                           "max_batches": s.max_batches}}

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
        return self.engine is not None and self.engine.alive and not self.draining

    def status(self) -> str:
        """What /ready says while not ready: loading, failed, restarting, draining."""
        if self.draining:
            return "draining"
        if self.load_error is not None:
            return "failed"
        if self.engine is not None and not self.engine.alive:
            return "engine_stopped"
        return "restarting" if self.restarts else "loading"

    def begin_drain(self) -> None:
        """Shutdown starts: no new requests (503 ``shutting_down``), queued ones answered 503 now, running
        ones finish (the server waits ``drain_timeout_s`` for them); /ready turns 503."""
        self.draining = True
        if self.engine is not None:
            self.engine.drain()

    def check_auth(self, request: Request) -> None:
        """401 unless the request carries the API key (when one is set). Compared as bytes in constant
        time: the header's raw bytes (HTTP headers arrive as latin-1) against the key's UTF-8 bytes, so a
        non-ASCII key works when the client sends it UTF-8 encoded."""
        key = self.settings.api_key
        if not key:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        try:
            sent = token.strip().encode("latin-1")
        except UnicodeEncodeError:
            sent = b""
        if scheme.lower() != "bearer" or not hmac.compare_digest(sent, key.encode("utf-8")):
            raise ServingError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                               code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    def require_ready(self) -> ModelBundle:
        """The loaded model, or 503 while it loads (or after it failed to), restarts or drains."""
        if not self.ready:
            if self.draining:
                raise ServingError(503, "the server is shutting down", type="server_error", code="shutting_down",
                                   retry=True, headers={"Retry-After": "1"})
            if self.load_error:
                raise ServingError(503, f"the model failed to load: {self.load_error}", type="server_error",
                                   code="model_load_failed")
            if self.status() in ("engine_stopped", "restarting"):
                raise ServingError(503, "the decoding engine stopped and is restarting; retry shortly",
                                   type="server_error", code="engine_restarting", retry=True,
                                   headers={"Retry-After": "2"})
            raise not_ready()
        return self.bundle

    def check_model(self, name: str) -> None:
        """404 unless ``name`` is the served model's id."""
        if name != self.settings.model_name:
            raise ServingError(404, f"the model '{name}' does not exist; this server serves "
                                    f"'{self.settings.model_name}'", param="model", code="model_not_found")
