"""``python -m dllm.training.monitor``: the training probe (:mod:`dllm.training.probe`) from the command line,
on a model folder, or on a run folder's checkpoint (exported first, as ``dllm train export-model`` does)."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import torch

from .probe import completion_text, evaluate, greedy_unmask

__all__ = ["completion_text", "evaluate", "greedy_unmask", "main"]


def main(argv: list[str] | None = None) -> None:
    """``python -m dllm.training.monitor MODEL_DIR|RUN_DIR [--step N] [--n 100] [--gen-length 64] [--block-size 8]``"""
    import argparse

    from dllm.eval.tasks import resolve_suites

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("model", help="a model folder or bundled name; or a run folder (its latest checkpoint, "
                                  "or --step) or a checkpoints/step-N folder, exported first")
    ap.add_argument("--step", type=int, default=None, help="with a run folder: this step's checkpoint")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--block-size", type=int, default=None, help="semi-AR blocks (default: the model's, if block-causal)")
    ap.add_argument("--suites", default="all", help="as dllm bench --suite: names, groups, options after a colon")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--show", type=int, default=0, help="print this many failures per suite")
    args = ap.parse_args(argv)
    try:
        suites = resolve_suites(args.suites)
    except ValueError as err:
        ap.error(str(err))
    with contextlib.ExitStack() as stack:
        path = args.model
        if _is_run_or_checkpoint(Path(path)):
            from dllm.errors import CheckpointError

            from .config import ConfigError
            from .model_export import export_checkpoint_model

            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dllm-monitor-")))
            try:
                path = str(export_checkpoint_model(path, folder / "model", args.step))
            except (CheckpointError, ConfigError) as err:
                ap.error(str(err))
            info = json.loads((Path(path) / "training_info.json").read_text())
            print(f"{args.model}: checkpoint {Path(info['checkpoint']).name} (step {info['steps']})")
        elif args.step is not None:
            ap.error("--step picks a checkpoint of a run folder; this is a model folder")
        _report(args, path, suites)


def _is_run_or_checkpoint(path: Path) -> bool:
    """A training run's folder, or one of its checkpoints: no model of its own (config.json) to load."""
    return not (path / "config.json").exists() and (
        (path / "checkpoints").is_dir() or (path.parent.name == "checkpoints" and path.is_dir()))


def _report(args, path: str, suites: list) -> None:
    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer

    torch.set_num_threads(args.threads)  # again: a checkpoint's export ran with its run's num_threads
    model = load_model(path)
    tok = load_tokenizer(resolve_model_path(path))
    block = args.block_size or (model.spec.block_size if model.is_block_causal else None)
    scores, details = evaluate(model, tok, suites, args.n, args.gen_length, block, return_details=True)
    for name, acc in scores.items():
        print(f"{name:10s} {acc * 100:6.1f}%  (n={args.n}, gen_length={args.gen_length}, block={block})")
        for prompt, answer, got, _ in [r for r in details[name] if not r[3]][: args.show]:
            print(f"    {prompt!r}\n      want {answer!r}\n      got  {got!r}")


if __name__ == "__main__":
    main()
