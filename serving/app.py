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

    app = FastAPI(title="dllm OpenAI-compatible server", version=__version__, lifespan=lifespan)
    app.state.dllm = state
    _install_error_handlers(app, state)
    install_routes(app, state)
    return app


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
