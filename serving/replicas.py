"""Replicas on Ray Serve: one dllm server app per replica, Ray's HTTP proxy in front (``dllm serve --replicas N``).

Each replica is the app of ``dllm serve --in-process`` (the model, its engine thread, the same OpenAI routes,
errors and limits), built on the replica by :func:`build_app`; Ray Serve spreads requests over the replicas
and replaces a replica whose process dies. Every response names its replica (``x-dllm-replica``). The
``ray`` extra (``pip install 'dllm[ray]'``) brings Ray Serve; nothing here imports it before it is used.

A ``serve run`` config works too: ``dllm.serving.replicas:app_builder`` takes the ``ServerSettings`` fields
as its arguments (``model``, ``max_batch_size``, ...) and ``num_replicas`` / ``num_cpus``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from .settings import ServerSettings


def build_app(settings: ServerSettings):
    """The app one replica serves: the model loaded here (an in-process engine), every response tagged with
    this replica's name."""
    from .app import create_app
    from .state import load_bundle

    if settings.num_threads is not None:
        import torch

        torch.set_num_threads(settings.num_threads)
    bundle = load_bundle(settings)
    app = create_app(settings, model=bundle.model, tokenizer=bundle.tokenizer)
    name = _replica_name()

    @app.middleware("http")
    async def tag(request, call_next):
        response = await call_next(request)
        response.headers["x-dllm-replica"] = name
        return response

    return app


def _replica_name() -> str:
    try:
        from ray import serve

        return str(serve.get_replica_context().replica_id.unique_id)
    except Exception:  # noqa: BLE001 - outside Ray Serve (tests): the process
        return f"pid-{os.getpid()}"


def deployment(settings: ServerSettings, *, num_replicas: int, num_cpus: float = 1.0):
    """The Ray Serve application (bound deployment) of ``num_replicas`` replicas of ``settings``' app."""
    from ray import serve

    replica_settings = dataclasses.replace(settings, engine_process=False, branch_parallel=1)
    ingress = serve.ingress(lambda: build_app(replica_settings))
    return serve.deployment(ingress(), name="dllm", num_replicas=num_replicas,
                            ray_actor_options={"num_cpus": num_cpus},
                            health_check_period_s=2, graceful_shutdown_timeout_s=settings.drain_timeout_s,
                            max_ongoing_requests=max(settings.max_queue, settings.max_batch_size)).bind()


def app_builder(args: dict[str, Any]):
    """For ``serve run dllm.serving.replicas:app_builder model=tiny-d2f num_replicas=2``."""
    args = dict(args)
    num_replicas, num_cpus = int(args.pop("num_replicas", 1)), float(args.pop("num_cpus", 1.0))
    return deployment(ServerSettings(**args), num_replicas=num_replicas, num_cpus=num_cpus)


def run(settings: ServerSettings, *, replicas: int, num_cpus: float = 1.0) -> None:
    """Start a local Ray instance, serve ``replicas`` replicas on ``settings.host:port`` and block until
    SIGTERM/SIGINT; then stop Serve and Ray so that no replica or Ray process is left behind."""
    import signal
    import threading

    import ray
    from ray import serve

    stop = threading.Event()
    ray.init(num_cpus=max(1, int(replicas * num_cpus + 1)), include_dashboard=False, object_store_memory=100 * 2**20,
             log_to_driver=False, logging_level="WARNING", configure_logging=True)
    # After ray.init: Ray's core installs a handler that aborts the driver on SIGTERM (exit -6) and would skip
    # the shutdown below.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": settings.host, "port": settings.port}, logging_config={"log_level": "WARNING"})
        serve.run(deployment(settings, num_replicas=replicas, num_cpus=num_cpus), name="dllm", route_prefix="/",
                  blocking=False)
        print(f"serving {settings.model_name!r} on http://{settings.host}:{settings.port}/v1 "
              f"({replicas} replicas on Ray Serve)", flush=True)
        stop.wait()
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
