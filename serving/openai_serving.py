"""The serving class: one OpenAI completion or chat request from parsed body to response (JSON or SSE),
through the engine; the routes only call :meth:`OpenAIServing.create`."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from dllm.decoding.config import DiffusionGenerationConfig

from .engine import EngineRequest
from .errors import ServingError
from .planning import Plan, plan_chat, plan_completion
from .protocol import DIFFUSION_FIELDS, ChatCompletionRequest, CompletionRequest, usage
from .request_io import parse, read_json
from .state import ServerState

DISCONNECT_POLL_S = 0.1
SETTINGS_ECHOED = DIFFUSION_FIELDS + ("max_new_tokens", "temperature", "top_p")


class OpenAIServing:
    """Completions and chat completions for one server state (model, engine, metrics)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.metrics = state.metrics
        # Chat templating and tokenizing a large prompt take long enough to stall every other request if
        # they ran on the event loop; one thread, because a Rust tokenizer must not be used by two at once
        self._planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dllm-plan")

    def fail(self, endpoint: str, err: ServingError) -> JSONResponse:
        self.metrics.errors.labels(endpoint, str(err.status)).inc()
        return err.response()

    async def create(self, endpoint: str, request: Request, chat: bool):
        """``POST /v1/completions`` (``chat`` False) or ``/v1/chat/completions``."""
        state, settings, metrics = self.state, self.state.settings, self.metrics
        t0 = time.perf_counter()
        metrics.requests.labels(endpoint).inc()
        try:
            state.check_auth(request)
            body = await read_json(request, settings.max_body_bytes)
            req = parse(ChatCompletionRequest if chat else CompletionRequest, body)
            state.check_model(req.model)
            state.require_ready()
            plan = await asyncio.get_running_loop().run_in_executor(
                self._planner, plan_chat if chat else plan_completion, state, req)
            state.require_ready()  # the engine may have stopped while the prompt was tokenized
            handle_ = state.engine.submit(plan.prompts, n=plan.n, cfg=plan.cfg, max_tokens=plan.max_tokens,
                                          stop=plan.stop, isolated=plan.isolated)
        except ServingError as err:
            return self.fail(endpoint, err)
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
            return self.fail(endpoint, err)
        payload = _chat_response(plan, col, rid, created, req.model) if chat else \
            _completion_response(plan, col, rid, created, req.model)
        metrics.latency.labels(endpoint).observe(time.perf_counter() - t0)
        return JSONResponse(payload)


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
