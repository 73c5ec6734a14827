"""``dllm serve``: the OpenAI-compatible server (mounted by ``dllm.cli`` when FastAPI is installed)."""

from __future__ import annotations

import logging

import typer

from dllm.cli_common import fail


def _cannot_listen(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be bound now, or None. uvicorn sets SO_REUSEADDR too, so a port in
    TIME_WAIT is no obstacle for either."""
    import socket

    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        return f"unknown host ({err.strerror})"
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as err:
            return err.strerror or str(err)
    return None


def serve(
    model: str = typer.Option("tiny-d2f", "--model", "-m", help="tiny, tiny-d2f, tiny-long, tiny-long-d2f, or a local checkpoint directory."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default; 0.0.0.0 exposes it)."),
    port: int = typer.Option(8000, help="TCP port."),
    api_key: str | None = typer.Option(None, "--api-key", envvar="DLLM_API_KEY",
                                       help="Require 'Authorization: Bearer KEY' on /v1/*, /docs, /openapi.json and "
                                            "/metrics (env DLLM_API_KEY)."),
    public_metrics: bool = typer.Option(False, "--public-metrics", help="Keep /metrics open with --api-key."),
    public_docs: bool = typer.Option(False, "--public-docs", help="Keep /docs and /openapi.json open with --api-key."),
    allowed_hosts: list[str] | None = typer.Option(None, "--allowed-host",
                                                   help="Answer only requests whose Host header names this host "
                                                        "(repeatable; default: any)."),
    drain_timeout: float = typer.Option(30.0, "--drain-timeout",
                                        help="On SIGTERM/SIGINT: seconds running requests get to finish (queued "
                                             "and new ones get 503 at once)."),
    served_model_name: str | None = typer.Option(None, "--served-model-name",
                                                 help="Model id clients send (default: --model as given)."),
    max_batch_size: int = typer.Option(8, "--max-batch-size", help="Most rows decoded together in one batch."),
    max_batches: int = typer.Option(4, "--max-batches",
                                    help="Most batches decoding at once, stepped in turn (a small request never "
                                         "waits for a large one to finish)."),
    max_queue: int = typer.Option(256, "--max-queue", help="Most waiting requests; more get 503 + Retry-After."),
    batch_wait_ms: float = typer.Option(10.0, "--batch-wait-ms",
                                        help="Before a batch that is not full, wait until no request arrived for this "
                                             "long (and at most 10x this for the clients of the last batch)."),
    join: bool = typer.Option(False, "--join/--no-join",
                              help="Continuous batching (off by default; measured slower for short answers): a waiting request joins a running batch "
                                   "of its settings that decodes it from its next step, else starts a batch of its own; --no-join: only between calls."),
    join_max_spread: float = typer.Option(2.0, "--join-max-spread",
                                          help="d2f: join only while the running rows' forward windows span at most "
                                               "this many blocks (0: no bound)."),
    stream_interval_ms: float = typer.Option(20.0, "--stream-interval-ms",
                                             help="Send new text every decoding step, or every this many ms when "
                                                  "steps are faster (first text and row ends: a quarter of it)."),
    max_tokens_cap: int = typer.Option(1024, "--max-tokens-cap", help="Largest max_tokens a request may ask for."),
    max_request_tokens: int | None = typer.Option(None, "--max-request-tokens",
                                                  help="Most canvas slots one request may decode: rows x LoPA "
                                                       "branches x (prompt + canvas) (default: 65,536, or what a "
                                                       "quarter of free memory holds)."),
    max_prompt_tokens: int = typer.Option(4096, "--max-prompt-tokens", help="Longer prompts get 413."),
    max_body_bytes: int = typer.Option(1 << 20, "--max-body-bytes", help="Larger request bodies get 413."),
    branch_parallel: int = typer.Option(1, "--branch-parallel",
                                        help="Ranks evaluating LoPA branches: this process + N-1 spawned workers "
                                             "(with --tensor-parallel T: N replicas of T shards, N*T torchrun "
                                             "ranks)."),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel",
                                        help="Shard every layer over N processes; run under torchrun "
                                             "--nproc-per-node N: rank 0 serves and decodes in its server process, "
                                             "the other ranks run their shard of each forward."),
    replicas: int = typer.Option(1, "--replicas",
                                 help="Serve N replicas of the model on Ray Serve (the ray extra), one process each, "
                                      "behind one port."),
    replica_cpus: float = typer.Option(1.0, "--replica-cpus", help="CPUs Ray reserves for each replica."),
    engine_process: bool = typer.Option(True, "--engine-process/--in-process",
                                        help="Decode in a separate engine process (default), so HTTP handling and "
                                             "decoding do not share one GIL; --in-process: a decoding thread in the "
                                             "server process."),
    dtype: str | None = typer.Option(None, help="float32, bfloat16 or float16."),
    device: str | None = typer.Option(None, help="cpu, cuda, cuda:1, ..."),
    num_threads: int | None = typer.Option(None, "--num-threads", help="torch CPU threads (default: torch's)."),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn log level."),
    options: list[str] | None = typer.Option(None, "--set", "-s",
                                             help="Default generation option for every request as KEY=VALUE, "
                                                  "repeatable (e.g. --set skip_threshold=0.8); requests still "
                                                  "override it."),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (completions, chat, streaming, metrics)."""
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        fail("the server needs the serving extras: pip install 'dllm[serving]'")
        return
    from dllm.decoding.config import parse_overrides
    from dllm.errors import CheckpointError

    from .settings import ServerSettings

    say = fail if tensor_parallel == 1 else _fail_on_rank0  # under torchrun, one rank says it
    try:
        settings = ServerSettings(generation_defaults=parse_overrides(options or []), model=model,
                                  served_model_name=served_model_name, host=host, port=port,
                                  api_key=api_key, public_metrics=public_metrics, public_docs=public_docs,
                                  allowed_hosts=tuple(allowed_hosts or ()), drain_timeout_s=drain_timeout,
                                  max_batch_size=max_batch_size, max_batches=max_batches, max_queue=max_queue,
                                  batch_wait_ms=batch_wait_ms, join=join, join_max_spread=join_max_spread or None,
                                  stream_interval_ms=stream_interval_ms,
                                  max_tokens_cap=max_tokens_cap, max_request_tokens=max_request_tokens,
                                  max_prompt_tokens=max_prompt_tokens, max_body_bytes=max_body_bytes,
                                  branch_parallel=branch_parallel,
                                  engine_process=engine_process and tensor_parallel == 1, dtype=dtype,
                                  device=device, num_threads=num_threads)
    except ValueError as err:
        say(str(err))
        return
    if tensor_parallel != 1:
        _serve_tensor_parallel(settings, tensor_parallel, replicas=replicas, log_level=log_level)
        return
    if reason := _cannot_listen(host, port):  # before the model loads: that can take minutes for a 7B
        fail(f"cannot listen on {host}:{port}: {reason} (is another server running? choose another --port)")
        return
    if replicas != 1:
        if replicas < 1 or branch_parallel > 1:
            fail("--replicas must be >= 1, and replicas do not combine with --branch-parallel")
        try:
            from ray import serve as _  # noqa: F401
        except ImportError:
            fail("--replicas runs on Ray Serve: pip install 'dllm[ray]'")
        from .replicas import run

        run(settings, replicas=replicas, num_cpus=replica_cpus)
        return
    # Until uvicorn takes over the signals, SIGTERM/SIGINT end start-up through the cleanup below (the
    # engine process and branch-parallel ranks are stopped), never leaving them behind.
    _exit_on_signals()
    remote = executor = None
    try:
        try:
            remote, executor, app = _start(settings)
        except (CheckpointError, ValueError, OSError, RuntimeError) as err:
            fail(str(err))
            return
        _run_server(settings, app, log_level,
                    "engine process" if settings.engine_process else "in-process engine")
    finally:
        if executor is not None:
            executor.close()
        if remote is not None:
            remote.stop()  # a no-op after the app's shutdown stopped it


def _run_server(settings, app, log_level: str, engine: str) -> None:
    """Listen with uvicorn until SIGTERM/SIGINT (then drain: see ``DrainingServer``)."""
    import uvicorn

    from .http_protocol import OpenAIErrorProtocol

    host, port = settings.host, settings.port
    if host not in ("127.0.0.1", "localhost", "::1") and not settings.api_key:
        typer.echo(f"warning: listening on {host} without --api-key: anyone who can reach it can use it", err=True)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    typer.echo(f"serving {settings.model_name!r} on http://{host}:{port}/v1 (batch {settings.max_batch_size}, queue "
               f"{settings.max_queue}, {'joining' if settings.join else 'no joining'}, {engine})")
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=OpenAIErrorProtocol,
                            timeout_graceful_shutdown=settings.drain_timeout_s)
    _interrupt_on_signals()  # uvicorn handles them while it runs and raises them again when it is done
    try:
        _draining_server_class()(config, app.state.dllm).run()
    except KeyboardInterrupt:  # the signal uvicorn raised again after its shutdown: a clean exit (0)
        pass


def _fail_on_rank0(message: str, code: int = 2) -> None:
    """``fail`` on rank 0 of a torchrun launch; the other ranks exit with the same code, silently."""
    import os

    if os.environ.get("RANK", "0") == "0":
        fail(message, code)
    raise typer.Exit(code)


def _serve_tensor_parallel(settings, n: int, *, replicas: int, log_level: str) -> None:
    """``--tensor-parallel N`` under torchrun: every rank loads and shards the model; rank 0 serves with
    :class:`~dllm.serving.tensor_parallel.LockstepBatches`, the others :func:`~dllm.serving.tensor_parallel.follow`.
    With ``--branch-parallel B`` the ``B*N`` ranks form a branch x tensor mesh (:mod:`dllm.parallel.mesh`):
    replica 0's ranks do the above over their tensor group, each driving its branch group's LoPA rounds;
    the other replicas' ranks serve those rounds."""
    import dataclasses
    import os

    if n < 1:
        _fail_on_rank0("--tensor-parallel must be >= 1")
    if replicas != 1:
        _fail_on_rank0("--tensor-parallel does not combine with --replicas")
    branches = settings.branch_parallel
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != n * branches:
        flags_used = f"--tensor-parallel {n}" + (f" --branch-parallel {branches}" if branches > 1 else "")
        _fail_on_rank0(f"{flags_used} runs under torchrun --nproc-per-node {n * branches} "
                       f"(this run has WORLD_SIZE={world})")
    import torch
    import torch.distributed as dist

    from dllm.decoding.lopa.branch_parallel import BranchParallelExecutor, serve_branches
    from dllm.errors import CheckpointError
    from dllm.loading import load_model, resolve_model_path
    from dllm.parallel.mesh import init_mesh
    from dllm.parallel.tensor import broadcast_int, init_from_env, shard_model
    from dllm.text import load_tokenizer_for

    from .app import create_app
    from .state import load_bundle
    from .tensor_parallel import LockstepBatches, follow

    rank, _, device = init_from_env(settings.device)
    settings = dataclasses.replace(settings, device=device)  # cuda: cuda:LOCAL_RANK on each rank
    lockstep = executor = None
    try:
        if rank == 0:
            _exit_on_signals()  # SIGTERM/SIGINT during start-up: the cleanup below still runs
        reason = [_cannot_listen(settings.host, settings.port) if rank == 0 else None]
        dist.broadcast_object_list(reason, src=0)  # before the model loads: every rank stops on a busy port
        if reason[0]:
            _fail_on_rank0(f"cannot listen on {settings.host}:{settings.port}: {reason[0]} (is another server "
                           "running? choose another --port)")
        if settings.num_threads is not None:
            torch.set_num_threads(settings.num_threads)
        mesh = init_mesh(branches, n, device)
        try:
            path = resolve_model_path(settings.model)
            model = shard_model(load_model(path, dtype=settings.dtype, device=settings.device),
                                group=mesh.tensor_group)
            # requests without a seed sample from the global generator, which every rank must share
            torch.manual_seed(broadcast_int(int.from_bytes(os.urandom(4), "little")))
            if rank != 0:
                tokenizer = load_tokenizer_for(path)
            else:
                bundle = load_bundle(settings, model=model)
        except (CheckpointError, ValueError, OSError) as err:
            _fail_on_rank0(str(err))
            return
        if rank != 0:
            _ignore_signals()  # rank 0 decides when to stop (after draining) and says so
        if mesh.branch_rank > 0:
            serve_branches(model, group=mesh.branch_group)  # until this rank's driver in replica 0 closes
            return
        if branches > 1:
            executor = BranchParallelExecutor.from_process_group(model, group=mesh.branch_group)
        if rank != 0:
            try:
                follow(model, tokenizer, group=mesh.tensor_group, branch_executor=executor)
            except RuntimeError as err:  # rank 0 went away, or this rank could not repeat its step
                fail(f"rank {rank}: {err}", 1)
            return
        lockstep = LockstepBatches(bundle.model, bundle.tokenizer, join_max_spread_blocks=settings.join_max_spread,
                                   group=mesh.tensor_group, branch_executor=executor)
        app = create_app(settings, model=bundle.model, tokenizer=bundle.tokenizer, session_factory=lockstep,
                         branch_executor=executor.branch_factory if executor else None)  # one LoPA batch at a time
        layout = f"tensor parallel over {n} ranks" + (f" x {branches} branch replicas" if branches > 1 else "")
        _run_server(settings, app, log_level, f"in-process engine, {layout}")
    finally:
        if lockstep is not None:
            lockstep.close()  # the other ranks leave their loop
        if executor is not None:
            executor.close()  # this rank's branch group leaves serve_branches
        if dist.is_initialized():
            dist.destroy_process_group()


def _start(settings):
    """Load the model (in the engine process, or here) and build the app: (remote engine, executor, app)."""
    from dllm.decoding.lopa.branch_parallel import BranchParallelExecutor
    from dllm.loading import resolve_model_path

    from .app import create_app
    from .state import ServerState, load_bundle

    remote = executor = None
    try:
        if settings.engine_process:
            state = ServerState(settings, None)
            state.load_remote()  # the engine process loads the model; its errors come back as text
            remote = state.engine
            return remote, None, create_app(settings, tokenizer=state.bundle.tokenizer, engine=remote)
        if settings.num_threads is not None:
            import torch

            torch.set_num_threads(settings.num_threads)
        branch_executor = None
        if settings.branch_parallel > 1:
            # Ranks 1..N-1 are spawned processes with their own replica; this process is rank 0.
            executor = BranchParallelExecutor(resolve_model_path(settings.model), world_size=settings.branch_parallel,
                                              dtype=settings.dtype, device=settings.device,
                                              num_threads=settings.num_threads)
            branch_executor = executor.branch_factory
        bundle = load_bundle(settings, model=executor.model if executor else None)
        return None, executor, create_app(settings, model=bundle.model, tokenizer=bundle.tokenizer,
                                          branch_executor=branch_executor)
    except BaseException:
        if executor is not None:
            executor.close()
        if remote is not None:
            remote.stop()
        raise


def _interrupt_on_signals() -> None:
    """SIGTERM and SIGINT raise KeyboardInterrupt (uvicorn raises the signal that stopped it once more)."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _exit_on_signals() -> None:
    """SIGTERM (and SIGINT) raise SystemExit(128 + signal) so that cleanup runs (until uvicorn's own handlers)."""
    import signal

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def _ignore_signals() -> None:
    """SIGTERM and SIGINT do nothing (ranks > 0 of tensor-parallel serving: rank 0 tells them to stop)."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)


def _draining_server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server, which on its first SIGTERM/SIGINT first tells the app to drain (queued and new
        requests 503, running ones finish within ``timeout_graceful_shutdown``), then shuts down as usual."""

        def __init__(self, config, state) -> None:
            super().__init__(config)
            self.dllm_state = state

        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                self.dllm_state.begin_drain()
            super().handle_exit(sig, frame)

    return DrainingServer
