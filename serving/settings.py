"""``ServerSettings``: every knob of ``dllm serve`` in one frozen dataclass (the CLI fills it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ServerSettings:
    """Server limits and scheduling.

    Parameters:
        model: ``tiny``, ``tiny-d2f`` or a checkpoint directory with tokenizer files.
        served_model_name: the id clients send as ``model`` (default: ``model`` as given).
        host / port: where to listen; loopback unless told otherwise.
        api_key: when set, ``/v1/*``, ``/docs``, ``/openapi.json`` and ``/metrics`` need
            ``Authorization: Bearer <api_key>`` (an empty or whitespace key is refused: it would lock
            everyone out or nobody). ``public_metrics`` / ``public_docs``: ``/metrics`` / ``/docs`` and
            ``/openapi.json`` stay open even with a key (for a scraper or a browser that cannot send it).
        allowed_hosts: when not empty, requests whose ``Host`` header names another host get 400
            (a DNS-rebinding guard for a server on a shared network).
        drain_timeout_s: on SIGTERM/SIGINT, running requests get this long to finish; queued ones are
            answered 503 at once, and new ones too (``/ready`` turns 503 so balancers stop sending).
        max_batch_size: most rows (sequences) in one decoding batch.
        max_batches: most batches decoding at once; the engine steps them in turn, one forward each, so
            a small request never waits for a large one to finish (``dllm.serving.engine``).
        max_queue: most requests waiting for a batch; one more gets 503 + ``Retry-After``.
        batch_wait_ms: before starting a batch that is not full, the scheduler waits until no request
            arrived for this long; and after a batch it waits (at most ``10 x`` this) for as many
            requests as that batch had (closed-loop clients send their next request at once).
        join: continuous batching (off by default): waiting requests join a running ``generate`` call at its next
            join point (see ``dllm.serving.engine``); ``False``: new rows start only between calls.
        join_max_spread: D2F admission bound, in blocks (``dllm.decoding.joining.may_join``): requests join
            a running call only while its live rows' forward windows span at most this many blocks;
            ``None``: at every forward.
        stream_interval_ms: new text is handed to the responses after every decoding step, or every
            this many ms when steps are faster (a row's first text and its end go out at once).
        max_body_bytes: request bodies above this get 413.
        max_prompt_tokens: prompts above this (per prompt) get 413.
        max_tokens_cap: most generated tokens a request may ask for (the canvas cap); above it: 400.
        max_n / max_prompts / max_rows_per_request: fan-out caps (``n``, prompt lists, n x prompts).
        max_request_tokens: most canvas slots one request may decode: rows x LoPA branches x (its longest
            prompt + canvas); above it: 400. ``None``: 65,536, or less when a quarter of the memory free
            at load time holds fewer slots' KV cache.
        max_stop / max_stop_length: how many stop strings, and how long each.
        branch_parallel: processes evaluating LoPA branches (needs the decoding executor).
        engine_process: decode in a separate process (what ``dllm serve`` does): the HTTP event loop
            and the decoding loop then do not share one GIL (``dllm.serving.engine_process``). ``False``:
            a decoding thread in the server process (``create_app(model=...)`` always works this way).
        generation_defaults: generation options (``DiffusionGenerationConfig`` fields) laid over the
            checkpoint's ``generation_config.json`` for every request; a request's own fields still
            win. Names are checked here, values once the model is loaded.
        dtype / device / num_threads: how to load and run the model (``num_threads``: torch CPU
            threads of the engine process; ``None``: torch's default).
    """

    model: str = "tiny-d2f"
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    public_metrics: bool = False
    public_docs: bool = False
    allowed_hosts: tuple[str, ...] = ()
    drain_timeout_s: float = 30.0
    max_batch_size: int = 8
    max_batches: int = 4
    max_queue: int = 256
    batch_wait_ms: float = 10.0
    join: bool = False  # measured: faster for short answers on CPU (docs/serving.md); --join for TTFT
    join_max_spread: float | None = 2.0
    stream_interval_ms: float = 20.0
    max_body_bytes: int = 1 << 20
    max_prompt_tokens: int = 4096
    max_tokens_cap: int = 1024
    max_n: int = 16
    max_prompts: int = 32
    max_rows_per_request: int = 64
    max_request_tokens: int | None = None
    max_stop: int = 16
    max_stop_length: int = 256
    branch_parallel: int = 1
    engine_process: bool = False
    dtype: str | None = None
    device: str | None = None
    num_threads: int | None = None
    generation_defaults: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from dllm.decoding.config import check_option_names

        check_option_names(self.generation_defaults)  # a GenerationConfigError is a ValueError
        for name in ("max_batch_size", "max_batches", "max_queue", "max_body_bytes", "max_prompt_tokens",
                     "max_tokens_cap", "max_n", "max_prompts", "max_rows_per_request", "max_stop", "max_stop_length",
                     "branch_parallel"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("batch_wait_ms", "stream_interval_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.join_max_spread is not None and self.join_max_spread < 1:
            raise ValueError(f"join_max_spread must be >= 1 (blocks), got {self.join_max_spread}")
        if self.max_request_tokens is not None and (not isinstance(self.max_request_tokens, int)
                                                    or self.max_request_tokens < 1):
            raise ValueError(f"max_request_tokens must be a positive integer, got {self.max_request_tokens!r}")
        if self.num_threads is not None and (not isinstance(self.num_threads, int) or self.num_threads < 1):
            raise ValueError(f"num_threads must be a positive integer, got {self.num_threads!r}")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key is empty or whitespace: give a real key, or none for no authentication")
        if self.api_key is not None and self.api_key != self.api_key.strip():
            raise ValueError("api_key starts or ends with whitespace, which an HTTP header cannot carry: strip it")
        if not (isinstance(self.drain_timeout_s, (int, float)) and 0 <= self.drain_timeout_s < float("inf")):
            raise ValueError(f"drain_timeout_s must be a finite number >= 0, got {self.drain_timeout_s!r}")
        object.__setattr__(self, "allowed_hosts", tuple(h.strip().lower() for h in self.allowed_hosts if h.strip()))

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model


def apply_generation_defaults(model, defaults: dict[str, Any]) -> None:
    """Lay ``ServerSettings.generation_defaults`` over ``model``'s generation config, wherever the
    model is loaded (a bad value raises ``GenerationConfigError``, a ValueError, naming the field)."""
    if defaults:
        model.diffusion_generation_config = model.diffusion_generation_config.replace(**defaults)
