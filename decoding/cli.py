"""``dllm generate``: answer prompts from the command line (mounted by ``dllm.cli``)."""

from __future__ import annotations

import json
import os
import sys

import typer

from dllm.cli_common import USER_ERRORS, fail, quiet_transformers


def generate(
    prompt: str = typer.Argument(..., help="The user prompt (the model's chat template is applied); "
                                           "'-' reads one prompt per line from stdin."),
    model: str = typer.Option("tiny", "--model", "-m", help="tiny, tiny-d2f, tiny-long, tiny-long-d2f, or a local checkpoint directory."),
    strategy: str | None = typer.Option(None, help="Decoding strategy (default: the model's)."),
    cache: str | None = typer.Option(None, help="none, prefix or dual (bidirectional models)."),
    threshold: float | None = typer.Option(None, help="Confidence threshold (threshold strategy)."),
    block_length: int | None = typer.Option(None, "--block-length", help="Block size."),
    max_new_tokens: int | None = typer.Option(None, "--max-new-tokens", help="Cap on generated tokens."),
    steps: int | None = typer.Option(None, help="Total steps (vanilla / Dream algorithms)."),
    temperature: float | None = typer.Option(None, help="0 = greedy."),
    seed: int | None = typer.Option(None, help="Seed for sampling."),
    lopa_branches: int | None = typer.Option(None, "--lopa-branches", help="LoPA lookahead branches."),
    branch_parallel: int = typer.Option(1, "--branch-parallel",
                                        help="Evaluate LoPA branches on N local processes (torch.distributed); "
                                             "with --tensor-parallel T, on N replicas of T shards each."),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel",
                                        help="Shard every layer over N processes; run under "
                                             "torchrun --nproc-per-node N, or N x --branch-parallel "
                                             "(rank 0 prints)."),
    dtype: str | None = typer.Option(None, help="float32, bfloat16 or float16."),
    device: str | None = typer.Option(None, help="cpu, cuda, cuda:1, ..."),
    options: list[str] | None = typer.Option(None, "--set", "-s",
                                             help="Any generation option as KEY=VALUE, repeatable "
                                                  "(e.g. --set skip_threshold=0.7); the flags above win."),
    batch_size: int = typer.Option(8, "--batch-size", help="Prompts per generate call (prompts from stdin)."),
    no_chat: bool = typer.Option(False, "--no-chat", help="Do not apply the chat template."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per prompt (one per line)."),
    stream: bool = typer.Option(False, "--stream", help="Print the answer as its tokens are committed "
                                                        "(prompts run one at a time)."),
) -> None:
    """Generate an answer and report forwards, tokens per forward (TPF) and speed."""
    from dllm.loading import load_model, resolve_model_path
    from dllm.text import generate_text, load_tokenizer_for

    from .config import parse_overrides
    from .errors import GenerationConfigError
    from .registry import unread_options_error

    quiet_transformers()
    flags = {k: v for k, v in dict(strategy=strategy, cache=cache, threshold=threshold, block_length=block_length,
                                    max_new_tokens=max_new_tokens, steps=steps, temperature=temperature,
                                    seed=seed, lopa_branches=lopa_branches).items() if v is not None}
    if prompt == "-":
        prompts = [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
        if not prompts:
            fail("no prompts on stdin (one per line)")
    else:
        prompts = [prompt]
    if batch_size < 1:
        fail("--batch-size must be >= 1")
    if stream and (as_json or branch_parallel > 1 or tensor_parallel > 1):
        fail("--stream prints plain text from one process; leave out --json, --branch-parallel "
             "and --tensor-parallel")
    if tensor_parallel < 1:
        fail("--tensor-parallel must be >= 1")
    if branch_parallel < 1:
        fail("--branch-parallel must be >= 1")
    rank, mesh = 0, None
    if tensor_parallel > 1:  # under torchrun: a branch x tensor mesh (dllm.parallel.mesh)
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world != tensor_parallel * branch_parallel:
            flags_used = f"--tensor-parallel {tensor_parallel}" + (
                f" --branch-parallel {branch_parallel}" if branch_parallel > 1 else "")
            _fail_on_rank0(f"{flags_used} runs under torchrun --nproc-per-node {tensor_parallel * branch_parallel} "
                           f"(this run has WORLD_SIZE={world})")
        from dllm.parallel.mesh import init_mesh
        from dllm.parallel.tensor import init_from_env

        rank, world, device = init_from_env(device)
        mesh = init_mesh(branch_parallel, tensor_parallel, device)
    try:
        overrides = {**parse_overrides(options or []), **flags}
        path = resolve_model_path(model)
        m = load_model(path, dtype=dtype, device=device)
        if tensor_parallel > 1:
            import torch

            from dllm.parallel.tensor import broadcast_int, shard_model

            shard_model(m, group=mesh.tensor_group)
            # every rank runs the whole decoding loop: sampling without --seed must draw the same tokens on all
            torch.manual_seed(broadcast_int(int.from_bytes(os.urandom(4), "little")))
        tok = load_tokenizer_for(path)
        cfg = m.diffusion_generation_config
        if "max_new_tokens" in overrides and "block_length" not in overrides and cfg.block_length:
            if overrides["max_new_tokens"] % cfg.block_length:
                overrides["block_length"] = overrides["max_new_tokens"]
        chosen = overrides.get("strategy") or ("lopa" if branch_parallel > 1 else cfg.strategy)
        if (unread := unread_options_error(chosen, overrides)) is not None:
            raise GenerationConfigError(f"{unread}; leave it out, or choose a --strategy that reads it")
        if branch_parallel > 1 and mesh is not None:
            overrides.setdefault("strategy", "lopa")
            results = _mesh_branches(m, tok, prompts, mesh, cfg.replace(**overrides), chat=not no_chat,
                                     batch_size=batch_size)
        elif branch_parallel > 1:
            from .lopa.branch_parallel import run_branch_parallel

            overrides.setdefault("strategy", "lopa")
            results = run_branch_parallel(path, prompts, cfg.replace(**overrides), world_size=branch_parallel,
                                          chat=not no_chat, dtype=dtype, device=device)
        else:
            stop_strings = cfg.replace(**overrides).stop_strings  # a bad option fails before the first batch
            results = []
            if stream:
                for p in prompts:
                    [result] = generate_text(m, tok, p, chat=not no_chat, streamer=_terminal_stream(tok, stop_strings),
                                             **overrides)
                    _print_status(result)
                return
            for i in range(0, len(prompts), batch_size):
                results += generate_text(m, tok, prompts[i:i + batch_size], chat=not no_chat, **overrides)
    except USER_ERRORS as err:
        (fail if mesh is None else _fail_on_rank0)(str(err))  # under torchrun, rank 0 says it
        return
    if mesh is not None:
        import torch.distributed as dist

        dist.destroy_process_group()  # the collectives are over; only rank 0 prints
        if rank != 0:
            return
    strategy_name = cfg.replace(**overrides).strategy
    for result in results:
        tps = result.generated_tokens / result.seconds if result.seconds > 0 else float("inf")
        if as_json:
            payload = {"text": result.text, "num_forwards": result.num_forwards,
                       "generated_tokens": result.generated_tokens, "tpf": round(result.tpf, 4),
                       "seconds": round(result.seconds, 4), "tokens_per_second": round(tps, 2),
                       "finish_reason": result.finish_reason, "model": model, "strategy": strategy_name}
            typer.echo(json.dumps(payload))
        else:
            typer.echo(result.text)
            _print_status(result)


def _mesh_branches(model, tokenizer, prompts, mesh, cfg, *, chat: bool, batch_size: int) -> list:
    """LoPA on a branch x tensor mesh: each tensor rank of replica 0 drives its branch group (and returns
    the results); the ranks of the other replicas serve their branch group's rounds (and return none)."""
    from dllm.text import generate_text

    from .lopa.branch_parallel import BranchParallelExecutor, serve_branches

    if mesh.branch_rank > 0:
        serve_branches(model, group=mesh.branch_group)
        return []
    results = []
    with BranchParallelExecutor.from_process_group(model, group=mesh.branch_group) as ex:
        for i in range(0, len(prompts), batch_size):
            results += generate_text(ex, tokenizer, prompts[i:i + batch_size], chat=chat, generation_config=cfg)
    return results


def _fail_on_rank0(message: str, code: int = 2) -> None:
    """``fail`` on rank 0 of a torchrun launch; the other ranks exit with the same code, silently."""
    if os.environ.get("RANK", "0") == "0":
        fail(message, code)
    raise typer.Exit(code)


def _print_status(result) -> None:
    tps = result.generated_tokens / result.seconds if result.seconds > 0 else float("inf")
    typer.echo(f"[forwards={result.num_forwards} tokens={result.generated_tokens} tpf={result.tpf:.2f} "
               f"tokens/s={tps:.1f} finish={result.finish_reason}]")


def _terminal_stream(tokenizer, stop_strings):
    """A streamer that writes a row's committed text to stdout as the decoder commits it
    (``--stream``); text is held back only while a stop string could still cut it or it ends inside
    a character."""
    from dllm.decoding.streaming import BatchStreamer
    from dllm.decoding.textstream import RowText

    class TerminalStream(BatchStreamer):
        def __init__(self) -> None:
            self.row = RowText(tokenizer, max_tokens=1 << 30, stop=tuple(stop_strings))

        def put_row(self, row: int, token_ids: list[int]) -> None:
            _write(self.row.add(token_ids))

        def end_row(self, row: int, finish_reason: str, num_forwards: int | None = None) -> None:
            _write(self.row.finish(finish_reason) + "\n")

    return TerminalStream()


def _write(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()
