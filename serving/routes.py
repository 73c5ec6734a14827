"""The routes: health, readiness, metrics, models, and the two OpenAI endpoints (served by
:class:`~dllm.serving.openai_serving.OpenAIServing`)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .errors import ServingError
from .openai_serving import OpenAIServing
from .state import ServerState


def install_routes(app: FastAPI, state: ServerState) -> None:
    """The HTTP surface; each route is a few lines over the state or the serving class."""
    metrics = state.metrics
    settings = state.settings
    serving = OpenAIServing(state)
    fail = serving.fail

    @app.get("/health")
    async def health():
        if state.engine is not None and not state.engine.alive:
            return JSONResponse({"status": "error", "detail": "the decoding worker stopped"}, status_code=503)
        return {"status": "ok"}

    @app.get("/ready")
    async def ready():
        """200 only while requests can be served: loaded, the engine alive, not draining for shutdown."""
        if state.ready:
            return {"status": "ready", "model": settings.model_name}
        body = {"status": state.status()}
        if state.load_error:
            body["detail"] = state.load_error
        return JSONResponse(body, status_code=503)

    @app.get("/metrics")
    async def metrics_route(request: Request):
        try:
            if not settings.public_metrics:
                state.check_auth(request)
        except ServingError as err:
            return err.response()
        data, ctype = metrics.render()
        return Response(data, media_type=ctype)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(request: Request):
        try:
            if not settings.public_docs:
                state.check_auth(request)
        except ServingError as err:
            return err.response()
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request):
        from fastapi.openapi.docs import get_swagger_ui_html

        try:
            if not settings.public_docs:
                state.check_auth(request)
        except ServingError as err:
            return err.response()
        return get_swagger_ui_html(openapi_url="/openapi.json", title=app.title)

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
            state.check_auth(request)
        except ServingError as err:
            return fail("models", err)
        return {"object": "list", "data": [_model_card()]}

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, request: Request):
        metrics.requests.labels("models").inc()
        try:
            state.check_auth(request)
            state.check_model(model_id)
        except ServingError as err:
            return fail("models", err)
        return _model_card()

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await serving.create("completions", request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await serving.create("chat", request, chat=True)
