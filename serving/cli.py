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
    model: str = typer.Option("tiny-d2f", "--model", "-m", help="tiny, tiny-d2f, or a local checkpoint directory."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind (loopback by default; 0.0.0.0 exposes it)."),
    port: int = typer.Option(8000, help="TCP port."),
    api_key: str | None = typer.Option(None, "--api-key", envvar="DLLM_API_KEY",
                                       help="Require 'Authorization: Bearer KEY' on /v1/* (env DLLM_API_KEY)."),
    served_model_name: str | None = typer.Option(None, "--served-model-name",
                                                 help="Model id clients send (default: --model as given)."),
    max_batch_size: int = typer.Option(8, "--max-batch-size", help="Most rows decoded together in one generate call."),
    max_queue: int = typer.Option(256, "--max-queue", help="Most waiting requests; more get 503 + Retry-After."),
    batch_wait_ms: float = typer.Option(10.0, "--batch-wait-ms",
                                        help="Before a batch that is not full, wait until no request arrived for this "
                                             "long (and at most 10x this for the clients of the last batch)."),
    join: bool = typer.Option(False, "--join/--no-join",
                              help="Continuous batching (off by default; measured slower for short answers): waiting requests join the running generate call at its next "
                                   "block boundary (semi-AR) or forward (d2f); --no-join: only between calls."),
    join_max_spread: float = typer.Option(2.0, "--join-max-spread",
                                          help="d2f: join only while the running rows' forward windows span at most "
                                               "this many blocks (0: no bound)."),
    stream_interval_ms: float = typer.Option(20.0, "--stream-interval-ms",
                                             help="Send new text every decoding step, or every this many ms when "
                                                  "steps are faster (first text and row ends: a quarter of it)."),
    max_tokens_cap: int = typer.Option(1024, "--max-tokens-cap", help="Largest max_tokens a request may ask for."),
    max_prompt_tokens: int = typer.Option(4096, "--max-prompt-tokens", help="Longer prompts get 413."),
    max_body_bytes: int = typer.Option(1 << 20, "--max-body-bytes", help="Larger request bodies get 413."),
    branch_parallel: int = typer.Option(1, "--branch-parallel",
                                        help="Ranks evaluating LoPA branches: this process + N-1 spawned workers."),
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
        import uvicorn
    except ImportError:
        fail("the server needs the serving extras: pip install 'dllm[serving]'")
        return
    from dllm.decoding.config import parse_overrides
    from dllm.errors import CheckpointError

    from .app import create_app
    from .branch import BranchParallelUnavailable, start_executor
    from .settings import ServerSettings
    from .state import ModelBundle, load_bundle

    try:
        settings = ServerSettings(generation_defaults=parse_overrides(options or []), model=model,
                                  served_model_name=served_model_name, host=host, port=port,
                                  api_key=api_key, max_batch_size=max_batch_size, max_queue=max_queue,
                                  batch_wait_ms=batch_wait_ms, join=join, join_max_spread=join_max_spread or None,
                                  stream_interval_ms=stream_interval_ms,
                                  max_tokens_cap=max_tokens_cap,
                                  max_prompt_tokens=max_prompt_tokens, max_body_bytes=max_body_bytes,
                                  branch_parallel=branch_parallel, engine_process=engine_process, dtype=dtype,
                                  device=device, num_threads=num_threads)
    except ValueError as err:
        fail(str(err))
        return
    if reason := _cannot_listen(host, port):  # before the model loads: that can take minutes for a 7B
        fail(f"cannot listen on {host}:{port}: {reason} (is another server running? choose another --port)")
        return
    remote = None
    if engine_process:
        from .state import ServerState

        state = ServerState(settings, None)
        try:
            if branch_parallel > 1:
                from .branch import executor_class

                executor_class()  # missing executor: say so here, not from inside the engine process
            state.load_remote()  # the engine process loads the model; its errors come back as text
        except (BranchParallelUnavailable, CheckpointError, ValueError, OSError, RuntimeError) as err:
            fail(str(err))
            return
        remote, tokenizer = state.engine, state.bundle.tokenizer
    else:
        if num_threads is not None:
            import torch

            torch.set_num_threads(num_threads)
    generate_fn = None
    executor = None
    try:
        if branch_parallel > 1 and not engine_process:
            from dllm.loading import resolve_model_path

            # Ranks 1..N-1 are spawned processes with their own replica; this process is rank 0.
            executor = start_executor(resolve_model_path(model), branch_parallel, dtype=dtype, device=device,
                                      num_threads=num_threads)
            generate_fn = executor.generate
        if not engine_process:
            bundle: ModelBundle = load_bundle(settings, model=executor.model if executor else None)
    except (BranchParallelUnavailable, CheckpointError, ValueError, OSError, RuntimeError) as err:
        if executor is not None:
            executor.close()
        fail(str(err))
        return
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        typer.echo(f"warning: listening on {host} without --api-key: anyone who can reach it can use it", err=True)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if engine_process:
        app = create_app(settings, tokenizer=tokenizer, engine=remote)
    else:
        app = create_app(settings, model=bundle.model, tokenizer=bundle.tokenizer, generate_fn=generate_fn)
    typer.echo(f"serving {settings.model_name!r} on http://{host}:{port}/v1 (batch {max_batch_size}, queue {max_queue}, "
               f"{'joining' if join else 'no joining'}, {'engine process' if engine_process else 'in-process engine'})")
    try:
        uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=10)
    finally:
        if executor is not None:
            executor.close()
        if remote is not None:
            remote.stop()  # a no-op after the app's shutdown stopped it
