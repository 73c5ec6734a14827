"""One accuracy-vs-TPF Pareto plot from several ``dllm bench --json`` reports of the same model and suites.

    python benchmarks/merge_pareto.py docs/results/d2f-threshold-n600-2026-12-05.json docs/results/lopa-alpha-n600-2026-12-05.json \
        docs/results/lopa-threshold-n600-2026-12-05.json --out docs/results/pareto-lopa-vs-threshold-2026-12-05.png

Methods that appear in several reports (the shared baseline) are plotted once. Reports of other
models, suites, sample sizes or seeds are refused: their points would not be comparable.
"""

from __future__ import annotations

import argparse
import json
import sys


def merge(reports: list[dict]) -> dict:
    """The first report with the results of all of them (first occurrence of each label kept)."""
    if not reports:
        raise ValueError("no reports given")
    keys = ("model", "suite", "n", "seed")
    first = reports[0]
    for r in reports[1:]:
        diff = [k for k in keys if r.get(k) != first.get(k)]
        if diff:
            raise ValueError("reports differ in " + ", ".join(f"{k} ({first.get(k)!r} vs {r.get(k)!r})" for k in diff))
    seen, results = set(), []
    for r in reports:
        for row in r["results"]:
            if row["label"] not in seen:
                seen.add(row["label"])
                results.append(row)
    return {**first, "results": results}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reports", nargs="+", help="JSON files written by dllm bench --json")
    ap.add_argument("--out", required=True, help="image path (.png, .svg, .pdf)")
    args = ap.parse_args(argv)

    from dllm.eval.bench import pareto_plot
    from dllm.eval.outputs import IMAGE_FORMATS, check_output_args

    check_output_args(ap, args.out, suffixes=IMAGE_FORMATS)

    try:
        reports = []
        for path in args.reports:
            with open(path) as f:
                reports.append(json.load(f))
        merged = merge(reports)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    pareto_plot(merged, args.out)
    print(f"{len(merged['results'])} methods from {len(reports)} reports -> {args.out}")
    return merged


if __name__ == "__main__":
    main()
