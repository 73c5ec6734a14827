"""How far can any filling order raise TPF under the D2F pipeline? A per-answer ceiling, next to d2f and LoPA.

The D2F pipeline appends at most one block per round, and a block is first decoded by the
forward of the round that appended it. An answer whose first EOS lies in its b-th block of size B
therefore takes at least b rounds, whatever order the tokens are filled in (plain d2f, LoPA with
any k, or an oracle that knew the answer). With L generated tokens (up to and including the first
EOS, the TPF convention) an answer's TPF is at most ``L / ceil(L / B)`` <= B, and a suite's at most
``sum(L) / sum(ceil(L / B))``.

For each suite and strategy this prints accuracy, TPF, and that ceiling computed on the answers the
strategy produced, with the ceiling's ratio to d2f's TPF: where the ceiling is below 2x, no decoder
that keeps the pipeline can double d2f's TPF at that block length (LoPA's published gains are
2-3x d2f; docs/lopa.md).

    python benchmarks/lopa_ceiling.py --model tiny-d2f --suite gsm,arith --n 100 --branches 0,2
    python benchmarks/lopa_ceiling.py --block-length 16     # both strategies at another block size

``--skip-thresholds`` runs every strategy at each of several ``skip_threshold`` values and restates
LoPA's claim at equal accuracy: for each LoPA row, its TPF over the fastest d2f row (any threshold)
whose accuracy is within ``--match-points`` (default 2) percentage points of it, and the share of the
gap between d2f's TPF at the same threshold and the ceiling of LoPA's own answers that LoPA closes
(0 = no gain over d2f, 1 = the ceiling):

    python benchmarks/lopa_ceiling.py --model tiny-d2f --suite gsm --n 100 --branches 0,2,4 \
        --skip-thresholds 0.5,0.7,0.9

``--reference`` decodes nothing: it takes the suites' reference answers (plus the EOS) as the
generated text and prints their token lengths and the ceiling at each of ``--blocks``, what any
decoder that answers right could reach; ``--pad-numbers N`` tokenizes them with the suites'
tokenizer as training builds it (``model.pad_numbers: N``) instead of ``--model``'s, so no model is
needed:

    python benchmarks/lopa_ceiling.py --reference --pad-numbers 2 --suite sudoku9,longlists,chain --n 600
"""

from __future__ import annotations

import argparse
import json
import math

import torch


def ceiling_rounds(generated_tokens: int, block: int) -> int:
    """Fewest rounds the one-block-per-round pipeline needs for an answer of this length."""
    return max(1, math.ceil(generated_tokens / block))


def gap_closed(tpf: float, d2f_tpf: float, ceiling_tpf: float) -> float:
    """Share of the way from d2f's TPF to the ceiling that a TPF covers (nan when d2f is at the ceiling)."""
    gap = ceiling_tpf - d2f_tpf
    return (tpf - d2f_tpf) / gap if gap > 1e-12 else float("nan")


def matched_accuracy(rows: list[dict], points: float) -> list[dict]:
    """For each LoPA row: the fastest d2f row of its suite, at any skip_threshold, whose accuracy is within
    ``points`` percentage points, and LoPA's TPF over it (``None`` where no d2f row is that close)."""
    out = []
    for r in rows:
        if not r["lopa_branches"]:
            continue
        near = [d for d in rows if d["suite"] == r["suite"] and not d["lopa_branches"]
                and abs(d["accuracy"] - r["accuracy"]) * 100 <= points + 1e-9]
        best = max(near, key=lambda d: d["tpf"], default=None)
        out.append({"suite": r["suite"], "lopa_branches": r["lopa_branches"], "skip_threshold": r["skip_threshold"],
                    "accuracy": r["accuracy"], "tpf": r["tpf"],
                    "d2f_skip_threshold": best["skip_threshold"] if best else None,
                    "d2f_accuracy": best["accuracy"] if best else None, "d2f_tpf": best["tpf"] if best else None,
                    "tpf_gain": r["tpf"] / best["tpf"] if best else None})
    return out


def _percentile(sorted_values: list[int], q: float) -> int:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def reference_ceilings(tokenizer, suites: list[str], n: int, blocks: list[int]) -> list[dict]:
    """Per suite and block size: the token lengths of ``n`` reference answers (EOS included) and the
    suite's ceiling TPF on them, ``sum(L) / sum(ceil(L / B))``."""
    from dllm.eval.tasks import get_suite

    rows = []
    for name in suites:
        lengths = sorted(len(tokenizer(e.answer, add_special_tokens=False)["input_ids"]) + 1
                         for e in get_suite(name).examples("test", n))
        stats = {"min": lengths[0], "p10": _percentile(lengths, 0.1), "p50": _percentile(lengths, 0.5),
                 "p90": _percentile(lengths, 0.9), "max": lengths[-1], "mean": sum(lengths) / len(lengths)}
        for B in blocks:
            floor = sum(ceiling_rounds(L, B) for L in lengths)
            rows.append({"suite": name, "block_length": B, "n": len(lengths), "tokens": sum(lengths),
                         "ceiling_rounds": floor, "ceiling_tpf": sum(lengths) / floor, "lengths": stats})
    return rows


def _reference_main(args) -> dict:
    from dllm.tokenization import build_tokenizer, load_tokenizer

    if args.pad_numbers is not None:
        from dllm.training.data import suite_texts

        tok = build_tokenizer(suite_texts(), pad_numbers=args.pad_numbers)
        source = f"the suites' tokenizer, pad_numbers {args.pad_numbers}"
    else:
        from dllm.loading import resolve_model_path

        tok = load_tokenizer(resolve_model_path(args.model))
        source = f"{args.model}'s tokenizer"
    blocks = [int(b) for b in args.blocks.split(",")]
    rows = reference_ceilings(tok, args.suite.split(","), args.n, blocks)
    print(f"reference answers + EOS, {args.n} test problems per suite, {source}")
    print(f"{'suite':10s} {'tokens min/p10/p50/p90/max':>27s} {'mean':>6s} " + " ".join(f"{'B=' + str(b):>7s}" for b in blocks))
    for i in range(0, len(rows), len(blocks)):
        L = rows[i]["lengths"]
        spread = f"{L['min']}/{L['p10']}/{L['p50']}/{L['p90']}/{L['max']}"
        print(f"{rows[i]['suite']:10s} {spread:>27s} {L['mean']:6.1f} "
              + " ".join(f"{r['ceiling_tpf']:7.2f}" for r in rows[i: i + len(blocks)]))
    result = {"reference": True, "tokenizer": source, "n": args.n, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny-d2f")
    ap.add_argument("--suite", default="gsm,arith")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--branches", default="0,2", help="comma-separated lopa_branches values (0 = d2f)")
    ap.add_argument("--block-length", type=int, default=None, help="block size for every strategy "
                    "(default: the model's)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="other generation-config overrides for every strategy (e.g. skip_threshold=0.9)")
    ap.add_argument("--skip-thresholds", default=None, metavar="T1,T2,...", help="run every strategy at each "
                    "of these skip_threshold values and compare LoPA with d2f at equal accuracy")
    ap.add_argument("--match-points", type=float, default=2.0, help="with --skip-thresholds: accuracy points "
                    "within which a d2f row counts as equally accurate")
    ap.add_argument("--batch-size", type=int, default=25)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None, metavar="PATH.png", help="accuracy-vs-TPF Pareto chart of every "
                    "decoded row, one per suite (PATH-<suite>.png)")
    ap.add_argument("--reference", action="store_true", help="no decoding: the ceiling of the suites' "
                    "reference answers at each of --blocks")
    ap.add_argument("--blocks", default="8,16,32", help="with --reference: comma-separated block sizes")
    ap.add_argument("--pad-numbers", type=int, default=None, help="with --reference: tokenize with the "
                    "suites' tokenizer built with this pad_numbers (0: plain digits) instead of --model's")
    args = ap.parse_args(argv)
    if args.pad_numbers is not None and not args.reference:
        ap.error("--pad-numbers goes with --reference (a decoding run uses the model's own tokenizer)")
    thresholds = None
    if args.skip_thresholds is not None:
        try:
            thresholds = [float(t) for t in args.skip_thresholds.split(",")]
        except ValueError:
            ap.error(f"--skip-thresholds takes comma-separated numbers, not {args.skip_thresholds!r}")
        if args.reference or any(not 0.0 <= t <= 1.0 for t in thresholds):
            ap.error("--skip-thresholds takes values in [0, 1] and decodes (not with --reference)")
    from dllm.eval.outputs import check_output_args

    if args.plot and args.reference:
        ap.error("--plot charts decoded rows (not with --reference)")
    plots = {s: suite_plot_path(args.plot, s) for s in args.suite.split(",")} if args.plot else {}
    check_output_args(ap, args.json, *plots.values())  # before the run: a report that cannot be written is lost
    if args.reference:
        return _reference_main(args)
    torch.set_num_threads(args.threads)

    from transformers.utils import logging as hf_logging

    from dllm.decoding.config import parse_overrides
    from dllm.eval.tasks import get_suite
    from dllm.loading import load_model, resolve_model_path
    from dllm.text import generate_text
    from dllm.tokenization import load_tokenizer

    hf_logging.disable_progress_bar()
    model = load_model(args.model).eval()
    tok = load_tokenizer(resolve_model_path(args.model))
    over = parse_overrides(args.set)
    if args.block_length is not None:
        over["block_length"] = args.block_length
    base = model.diffusion_generation_config.replace(temperature=0.0, **over)
    B = base.block_size
    ks = [int(b) for b in args.branches.split(",")]
    skips = thresholds or [base.skip_threshold]
    print(f"{args.model}: block {B}, skip_threshold {','.join(map(str, skips))}, {args.n} test problems per suite, "
          f"greedy, torch threads {args.threads}")
    print(f"{'suite':6s} {'strategy':8s} {'skip':>5s} {'acc %':>6s} {'TPF':>6s} {'ceiling':>8s} {'ceil/d2f':>9s} "
          f"{'gap %':>6s}")
    result: dict = {"model": args.model, "block_length": B, "n": args.n, "overrides": over, "rows": []}
    for suite_name in args.suite.split(","):
        suite = get_suite(suite_name)
        examples = suite.examples("test", args.n)
        for skip in skips:
            d2f_tpf = None
            for k in ks:
                cfg = base.replace(strategy="lopa" if k else "d2f", lopa_branches=k, skip_threshold=skip)
                outs = []
                for i in range(0, len(examples), args.batch_size):
                    chunk = examples[i: i + args.batch_size]
                    with torch.no_grad():
                        outs += generate_text(model, tok, [e.prompt for e in chunk], generation_config=cfg)
                correct = sum(suite.score(e, o.text).correct for e, o in zip(examples, outs))
                tokens = sum(o.generated_tokens for o in outs)
                rounds = sum(o.num_forwards for o in outs)
                floor = sum(ceiling_rounds(o.generated_tokens, B) for o in outs)
                tpf, ceil_tpf = tokens / rounds, tokens / floor
                if k == 0:
                    d2f_tpf = tpf
                ratio = ceil_tpf / d2f_tpf if d2f_tpf else float("nan")
                closed = gap_closed(tpf, d2f_tpf, ceil_tpf) if k and d2f_tpf else None  # None: a d2f row
                name = "d2f" if k == 0 else f"lopa k={k}"
                print(f"{suite_name:6s} {name:8s} {skip:5.2f} {100 * correct / len(outs):6.1f} {tpf:6.2f} "
                      f"{ceil_tpf:8.2f} {ratio:8.2f}x {'-' if closed is None else f'{100 * closed:.1f}':>6s}")
                result["rows"].append({"suite": suite_name, "lopa_branches": k, "skip_threshold": skip,
                                       "accuracy": correct / len(outs), "tokens": tokens, "rounds": rounds,
                                       "tpf": tpf, "ceiling_rounds": floor, "ceiling_tpf": ceil_tpf,
                                       "ceiling_over_d2f": ratio, "gap_closed": closed,
                                       "mean_tokens": tokens / len(outs)})
    if thresholds:
        result["matched"] = matched_accuracy(result["rows"], args.match_points)
        print(f"\nLoPA against the fastest d2f row within {args.match_points:g} accuracy points (any skip_threshold)")
        print(f"{'suite':6s} {'strategy':8s} {'skip':>5s} {'acc %':>6s} {'TPF':>6s} {'d2f skip':>8s} {'acc %':>6s} "
              f"{'TPF':>6s} {'gain':>6s}")
        for m in result["matched"]:
            head = (f"{m['suite']:6s} {'lopa k=' + str(m['lopa_branches']):8s} {m['skip_threshold']:5.2f} "
                    f"{100 * m['accuracy']:6.1f} {m['tpf']:6.2f}")
            if m["d2f_tpf"] is None:
                print(f"{head}  no d2f row within {args.match_points:g} points")
            else:
                print(f"{head} {m['d2f_skip_threshold']:8.2f} {100 * m['d2f_accuracy']:6.1f} {m['d2f_tpf']:6.2f} "
                      f"{m['tpf_gain']:5.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if plots:
        from dllm.eval.bench import pareto_plot

        for suite_name, path in plots.items():
            pareto_plot(suite_report(result, suite_name), path)
            print(f"wrote {path}")
    return result


def suite_plot_path(path: str, suite: str) -> str:
    """``out.png`` -> ``out-sudoku9.png``: one chart per suite (a frontier across suites means nothing)."""
    stem, dot, ext = path.rpartition(".")
    return f"{stem}-{suite}.{ext}" if dot else f"{path}-{suite}"


def suite_report(result: dict, suite: str) -> dict:
    """One suite's rows in the shape of a ``dllm bench`` report (accuracy in %), for its Pareto chart."""
    rows = [{"label": f"{'d2f' if r['lopa_branches'] == 0 else 'lopa k=' + str(r['lopa_branches'])} "
                      f"skip {r['skip_threshold']:g}", "tpf": r["tpf"], "accuracy": 100 * r["accuracy"]}
            for r in result["rows"] if r["suite"] == suite]
    return {"model": result["model"], "suite": suite, "n": result["n"], "results": rows}


if __name__ == "__main__":
    main()
