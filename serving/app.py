"""The FastAPI app: ``create_app(settings, model=None, tokenizer=None)`` builds one, with its lifespan
(loading the model in the background when none is given), error handlers in the OpenAI shape and routes.
With no model, ``/health`` answers at once and ``/ready`` once it has loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException

from dllm.version import __version__

from .engine_process import RemoteEngine
from .errors import ServingError, internal
from .routes import install_routes
from .settings import ServerSettings
from .state import ModelBundle, ServerState, load_bundle

log = logging.getLogger("dllm.serving")


def create_app(settings: ServerSettings | None = None, *, model=None, tokenizer=None, branch_executor=None,
               engine: RemoteEngine | None = None, session_factory=None) -> FastAPI:
    """The FastAPI app.

    * ``model`` + ``tokenizer``: serve an already loaded model with a decoding thread in this process;
    * ``engine`` (a started :class:`~dllm.serving.engine_process.RemoteEngine`) + ``tokenizer``: the model
      lives in the engine process (what ``dllm serve`` does by default);
    * neither: load ``settings.model`` in the background (``settings.engine_process`` picks where).

    ``session_factory``: what makes the decoding thread's batches (``dllm.serving.engine.Engine``; tensor-parallel
    serving passes ``dllm.serving.tensor_parallel.LockstepBatches``).
    """
    settings = settings or ServerSettings()
    if engine is not None:
        if tokenizer is None or model is not None:
            raise ValueError("with engine=, pass the tokenizer and no model (the model lives in the engine process)")
        model = engine.info
    elif (model is None) != (tokenizer is None):
        raise ValueError("pass both model and tokenizer, or neither (then settings.model is loaded)")
    state = ServerState(settings, ModelBundle(model, tokenizer) if model is not None else None)
    state.branch_executor = branch_executor
    state.session_factory = session_factory
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
        supervisor = asyncio.create_task(_supervise(state))
        try:
            yield
        finally:
            supervisor.cancel()
            if loader is not None:
                loader.cancel()
            if state.engine is not None:
                await asyncio.to_thread(state.engine.stop)

    # /docs and /openapi.json are routes of ours (install_routes), behind the key when one is set
    app = FastAPI(title="dllm OpenAI-compatible server", version=__version__, lifespan=lifespan,
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.dllm = state
    _install_error_handlers(app, state)
    install_routes(app, state)
    app.add_middleware(GuardMiddleware, state=state)
    return app


RESTARTS_PER_WINDOW, RESTART_WINDOW_S = 3, 300.0


async def _supervise(state: ServerState, poll_s: float = 0.5) -> None:
    """Restart a decoding engine that stopped (its process killed, its thread dead): meanwhile /ready is
    503 and requests get a retryable 503. More than ``RESTARTS_PER_WINDOW`` restarts within
    ``RESTART_WINDOW_S`` fail readiness for good (``load_error``) instead of looping."""
    recent: list[float] = []
    while True:
        await asyncio.sleep(poll_s)
        engine = state.engine
        if engine is None or engine.alive or state.draining or state.load_error is not None:
            continue
        now = asyncio.get_running_loop().time()
        recent = [t for t in recent if now - t < RESTART_WINDOW_S] + [now]
        state.engine = None
        await asyncio.to_thread(engine.stop)
        if len(recent) > RESTARTS_PER_WINDOW:
            state.load_error = (f"the decoding engine stopped {len(recent)} times in {RESTART_WINDOW_S:.0f} s; "
                                "not restarting it (see the server log)")
            log.error(state.load_error)
            continue
        state.restarts += 1
        log.error("the decoding engine stopped; restarting it (restart %d)", state.restarts)
        try:
            if state.settings.engine_process:
                await asyncio.to_thread(state.load_remote)
            else:
                state.start_engine()
        except Exception as err:  # noqa: BLE001 - readiness says why
            log.exception("restarting the decoding engine failed")
            state.load_error = f"restarting the decoding engine failed: {type(err).__name__}: {err}"


class GuardMiddleware:
    """Every HTTP request passes here (inside Starlette's outermost error middleware):

    * a ``Host`` the settings do not allow gets a 400 before any route runs;
    * an exception no route handled becomes a 500 in the OpenAI shape, counted in
      ``dllm_request_errors_total`` and logged, and is not re-raised, so the server does not reset the
      client's keep-alive connection as it would for an exception that reached it.
    """

    def __init__(self, app, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        allowed = self.state.settings.allowed_hosts
        if allowed:
            host = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0].strip("[]").lower() if host else ""
            if name not in allowed:
                self.state.metrics.errors.labels(_endpoint(scope), "400").inc()
                err = ServingError(400, f"host {host!r} is not served here (allowed: {', '.join(allowed)})",
                                   code="invalid_host")
                return await err.response()(scope, receive, send)
        started = False

        async def tracked(message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:  # noqa: BLE001 - the last line of defence: answer, count, log, keep the connection
            log.exception("unhandled error on %s", scope.get("path"))
            self.state.metrics.errors.labels(_endpoint(scope), "500").inc()
            if not started:
                await internal("internal server error; see the server log").response()(scope, receive, send)


def _endpoint(scope) -> str:
    """The metrics label of a path (the route names the serving class uses)."""
    path = scope.get("path", "")
    return {"/v1/completions": "completions", "/v1/chat/completions": "chat"}.get(
        path, "models" if path.startswith("/v1/models") else "other")


def _install_error_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(ServingError)
    async def _serving_error(request: Request, err: ServingError):
        return err.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        code = {404: "not_found", 405: "method_not_allowed"}.get(err.status_code)
        return ServingError(err.status_code, str(err.detail), code=code, headers=getattr(err, "headers", None)).response()

