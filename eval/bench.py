"""Side-by-side benchmark of decoding methods on the task suites.

Every method decodes the same prompts in one process, interleaved prompt batch by prompt batch
(with the method order rotated each batch) so machine drift hits every method alike. Reported per
method: accuracy, TPF (ratio of sums, see ``dllm.eval.metrics``), mean forwards per answer (NFE),
tokens/s (generated tokens / decoding wall time), speedup in tokens/s against the first method,
latency percentiles per request, and AUP against the first method.

AUP of a method = d3LLM's AUP over the two points {(TPF, accuracy) of the first method (the
baseline, usually ``vanilla``), (TPF, accuracy) of this method}, with ``y_max`` the best accuracy
of the run. A point more than 5 accuracy points below the baseline is dropped (AUP = the
baseline's rectangle), as d3LLM's filter does.
"""

from __future__ import annotations

import datetime as _dt
import platform
import re
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from dllm.decoding.config import check_option_names, parse_option_value
from dllm.decoding.registry import get_strategy, unread_options_error

from .metrics import aup as aup_metric
from .metrics import latency_percentiles
from .specs import SpecError, parse_named_specs
from .tasks import Example, resolve_suites

SCHEMA_VERSION = 1


class BenchSpecError(ValueError):
    """A malformed --strategies / --sweep specification."""


class BenchInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``run_bench``; ``report`` summarises the batches every method finished (None
    if none), so a long run still leaves a fair, if smaller, comparison."""

    def __init__(self, report: dict | None) -> None:
        super().__init__()
        self.report = report


@dataclass(frozen=True)
class Method:
    strategy: str
    params: dict

    @property
    def label(self) -> str:
        if not self.params:
            return self.strategy
        return self.strategy + ":" + ",".join(f"{k}={v}" for k, v in self.params.items())


def parse_methods(spec: str) -> list[Method]:
    """``"vanilla,threshold:cache=dual,threshold=0.9,d2f"`` -> three methods (the syntax of
    :mod:`dllm.eval.specs`), values parsed as on a command line."""
    try:
        entries = parse_named_specs(spec, "lopa:lopa_branches=2,skip_threshold=0.9")
    except SpecError as err:
        raise BenchSpecError(str(err)) from None
    if not entries:
        raise BenchSpecError("no strategies given")
    return [Method(n, {k: parse_option_value(v) for k, v in p.items()}) for n, p in entries]


def apply_sweep(methods: list[Method], sweep: str | None) -> list[Method]:
    """``threshold=0.5,0.7,0.9``: each method that is not the baseline is run once per value.

    A method whose strategy does not read the key (``d2f`` ignores ``threshold``) is kept once, unswept:
    its copies would be the same run under different labels. BenchSpecError if no method reads it."""
    if not sweep:
        return methods
    if "=" not in sweep:
        raise BenchSpecError(f"--sweep must look like key=v1,v2,...; got {sweep!r}")
    key, vals = sweep.split("=", 1)
    key = key.strip()
    check_option_names([key])
    values = [parse_option_value(v.strip()) for v in vals.split(",") if v.strip()]
    if not values:
        raise BenchSpecError(f"--sweep {sweep!r} lists no values")
    swept = [m for m in methods[1:] if get_strategy(m.strategy).reads(key)]
    if not swept:
        others = ", ".join(m.label for m in methods[1:]) or "(no method after the baseline)"
        raise BenchSpecError(f"--sweep {key}: none of {others} reads {key}")
    out = [methods[0]]
    for m in methods[1:]:
        out += [Method(m.strategy, {**m.params, key: v}) for v in values] if m in swept else [m]
    return out


@dataclass
class MethodStats:
    method: Method
    correct: int = 0
    total: int = 0
    tokens: int = 0
    forwards: int = 0
    seconds: float = 0.0
    latencies: list = field(default_factory=list)
    per_suite: dict = field(default_factory=dict)
    edits: int = 0  # token editing (strategy "edit"): T2T replacements and blocks made final
    blocks: int = 0


def run_bench(
    model,
    tokenizer,
    *,
    suites: str,
    methods: list[Method],
    n: int,
    batch_size: int = 1,
    seed: int = 0,
    base_overrides: dict | None = None,
    progress: bool = True,
    on_sample: Callable[[dict], None] | None = None,
) -> dict:
    """Every method on the same held-out problems, batch by batch; returns the report (``summarise``).

    ``on_sample`` gets one dict per problem and method (``sample_record``) as each batch is counted,
    so what it writes covers the same problems as the report, also after an interrupt."""
    from dllm.decoding.config import GenerationConfigError
    from dllm.text import generate_text

    suite_objs = resolve_suites(suites)
    examples: list[Example] = []
    for s in suite_objs:
        examples.extend(s.examples("test", n, seed=seed))
    by_name = {s.name: s for s in suite_objs}
    # each problem's group of reference-answer length, in the model's tokens (the per-suite "lengths")
    answer_tokens = [len(tokenizer(ex.answer, add_special_tokens=False)["input_ids"]) for ex in examples]
    bounds = {s.name: length_bounds([t for ex, t in zip(examples, answer_tokens) if ex.suite == s.name])
              for s in suite_objs}
    length_group = {(ex.suite, ex.id): length_label(t, bounds[ex.suite]) for ex, t in zip(examples, answer_tokens)}
    base = model.diffusion_generation_config.replace(**(base_overrides or {}))
    configs = []
    for m in methods:
        try:
            configs.append(base.replace(strategy=m.strategy, **m.params))
        except (GenerationConfigError, TypeError) as err:
            raise BenchSpecError(f"method {m.label!r}: {err}") from None
        if (unread := unread_options_error(m.strategy, m.params)) is not None:
            raise BenchSpecError(f"method {m.label!r}: {unread}")
    stats = [MethodStats(m) for m in methods]
    batches = [examples[i : i + batch_size] for i in range(0, len(examples), batch_size)]

    bar = None
    # a log file gets a line per batch: rich draws nothing there until the end (here, hours of silence)
    lines = progress and not sys.stderr.isatty()
    t_start = time.perf_counter()
    if progress and not lines:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn("[bold]bench"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                       TimeRemainingColumn(), transient=True)
        bar.start()
        task = bar.add_task("", total=len(batches) * len(methods))

    def record(st: MethodStats, batch: list[Example], results, dt: float) -> None:
        st.seconds += dt
        for ex, res in zip(batch, results):
            score = by_name[ex.suite].score(ex, res.text)
            st.correct += int(score.correct)
            st.total += 1
            st.tokens += res.generated_tokens
            st.forwards += res.num_forwards
            st.edits += int(res.stats.get("edits", 0))
            st.blocks += int(res.stats.get("blocks", 0))
            st.latencies.append(dt)
            ps = st.per_suite.setdefault(ex.suite, {"correct": 0, "total": 0, "tokens": 0, "forwards": 0})
            ps["correct"] += int(score.correct)
            ps["total"] += 1
            # partial credit: the scorer's reward and its "*_accuracy" details (sudoku9's cell accuracy)
            part = ps.setdefault("partial", {})
            for key, value in (("reward", score.reward), *score.details.items()):
                if key == "reward" or (key.endswith("_accuracy") and isinstance(value, (int, float))):
                    part[key] = part.get(key, 0.0) + float(value)
            ps["tokens"] += res.generated_tokens
            ps["forwards"] += res.num_forwards
            cat = by_name[ex.suite].category(ex)
            if cat is not None:
                pc = ps.setdefault("categories", {}).setdefault(cat, {"correct": 0, "total": 0})
                pc["correct"] += int(score.correct)
                pc["total"] += 1
            pl = ps.setdefault("lengths", {}).setdefault(length_group[(ex.suite, ex.id)],
                                                         {"correct": 0, "total": 0, "tokens": 0, "forwards": 0})
            pl["correct"] += int(score.correct)
            pl["total"] += 1
            pl["tokens"] += res.generated_tokens
            pl["forwards"] += res.num_forwards
            if on_sample is not None:
                on_sample(sample_record(st.method, ex, res, score, category=cat,
                                        length_group=length_group[(ex.suite, ex.id)]))

    def report() -> dict:
        return summarise(stats, model_name=getattr(model.config, "_name_or_path", "?"), suites=suites, n=n,
                         seed=seed, batch_size=batch_size)

    done = 0
    try:
        for bi, batch in enumerate(batches):
            order = list(range(len(methods)))
            order = order[bi % len(order):] + order[: bi % len(order)]  # rotate: no method always goes first
            prompts = [ex.prompt for ex in batch]
            pending = []  # recorded once every method has run the batch, so an interrupt keeps it fair
            for mi in order:
                t0 = time.perf_counter()
                results = generate_text(model, tokenizer, prompts, generation_config=configs[mi])
                pending.append((mi, results, time.perf_counter() - t0))
                if bar is not None:
                    bar.update(task, advance=1, description=methods[mi].label)
            for mi, results, dt in pending:
                record(stats[mi], batch, results, dt)
            done += len(batch)
            if lines:
                times = ", ".join(f"{methods[mi].label} {dt:.1f} s" for mi, _, dt in sorted(pending, key=lambda p: p[0]))
                print(f"bench: batch {bi + 1}/{len(batches)} done, {done}/{len(examples)} problems, "
                      f"{time.perf_counter() - t_start:.0f} s so far ({times})", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        if done == 0:
            raise BenchInterrupted(None) from None
        partial = report()
        partial["interrupted"] = {"examples_done": done, "examples_planned": len(examples)}
        raise BenchInterrupted(partial) from None
    finally:
        if bar is not None:
            bar.stop()
    return report()


def sample_record(method: Method, ex: Example, res, score, *, category: str | None, length_group: str) -> dict:
    """One problem's answer under one method, as ``dllm bench --samples`` writes it (one JSON line)."""
    return {"method": method.label, "suite": ex.suite, "id": ex.id, "category": category,
            "length_group": length_group, "prompt": ex.prompt, "reference": ex.answer, "completion": res.text,
            "correct": bool(score.correct), "reward": float(score.reward), "details": score.details,
            "generated_tokens": res.generated_tokens, "forwards": res.num_forwards, "meta": ex.meta}


def summarise(stats: list[MethodStats], *, model_name: str, suites: str, n: int, seed: int, batch_size: int) -> dict:
    rows = []
    for st in stats:
        acc = 100.0 * st.correct / max(1, st.total)
        lat = latency_percentiles(st.latencies) if st.latencies else {"p50": 0.0, "p95": 0.0}
        rows.append({
            "strategy": st.method.strategy,
            "params": st.method.params,
            "label": st.method.label,
            "accuracy": acc,
            "tpf": st.tokens / max(1, st.forwards),
            "nfe": st.forwards / max(1, st.total),
            "tokens_per_second": st.tokens / st.seconds if st.seconds > 0 else 0.0,
            "latency_p50": lat["p50"],
            "latency_p95": lat["p95"],
            "generated_tokens": st.tokens,
            "forwards": st.forwards,
            "seconds": st.seconds,
            "examples": st.total,
            **({"edits": st.edits, "edits_per_block": st.edits / st.blocks} if st.blocks else {}),
            "per_suite": {k: {"accuracy": 100.0 * v["correct"] / max(1, v["total"]),
                              "tpf": v["tokens"] / max(1, v["forwards"]), "n": v["total"],
                              "generated_tokens": v["tokens"], "forwards": v["forwards"],
                              **{k: 100.0 * x / max(1, v["total"]) for k, x in v.get("partial", {}).items()},
                              **({"categories": {c: {"accuracy": 100.0 * x["correct"] / x["total"], "n": x["total"]}
                                                 for c, x in sorted(v["categories"].items(),
                                                                    key=lambda kv: _natural(kv[0]))}}
                                 if v.get("categories") else {}),
                              # reference-answer tokens: accuracy and TPF per length group of the suite
                              "lengths": {g: {"accuracy": 100.0 * x["correct"] / x["total"], "n": x["total"],
                                              "tpf": x["tokens"] / max(1, x["forwards"])}
                                          for g, x in sorted(v["lengths"].items(), key=lambda kv: _natural(kv[0]))}}
                          for k, v in st.per_suite.items()},
        })
    base = rows[0]
    y_max = max(r["accuracy"] for r in rows)
    for r in rows:
        r["speedup"] = r["tokens_per_second"] / base["tokens_per_second"] if base["tokens_per_second"] else 0.0
        r["aup"] = method_aup(base, r, y_max)
    return {
        "schema_version": SCHEMA_VERSION,
        "model": model_name,
        "suite": suites,
        "n": n,
        "seed": seed,  # which held-out sample; every published table is seed 0
        "batch_size": batch_size,
        "machine": machine_info(),
        "results": rows,
    }


def _natural(text: str) -> tuple:
    """Sort key that orders "6 blanks" before "10 blanks" and "+2" before "+3" before "-1"."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text))


LENGTH_GROUPS = 4  # answer-length groups per suite in the report (quartiles of the reference answers)


def length_bounds(lengths: list[int], groups: int = LENGTH_GROUPS) -> list[tuple[int, int]]:
    """Inclusive token-count ranges that split ``lengths`` into up to ``groups`` groups of near-equal size.

    The upper bound of group i is the length at rank ceil(i * n / groups), so the ranges depend only on the
    problems (never on a method's answers) and every length falls in exactly one; equal lengths never
    straddle two groups, so a suite of one length gives one group."""
    ordered = sorted(lengths)
    if not ordered:
        return []
    bounds: list[tuple[int, int]] = []
    lo = ordered[0]
    for i in range(1, groups + 1):
        hi = ordered[-(-i * len(ordered) // groups) - 1]
        if hi >= lo:
            bounds.append((lo, hi))
            lo = hi + 1
    return bounds


def length_label(length: int, bounds: list[tuple[int, int]]) -> str:
    lo, hi = next(b for b in bounds if b[0] <= length <= b[1])
    return f"{lo}-{hi}" if lo != hi else str(lo)


def method_aup(base: dict, row: dict, y_max: float) -> float:
    if y_max <= 0:
        return 0.0
    points = {(base["tpf"], base["accuracy"]), (row["tpf"], row["accuracy"])}
    return aup_metric(sorted(points), y_max=y_max, strict=False)


def machine_info() -> dict:
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
    }


def format_table(report: dict) -> str:
    head = f"{'strategy':<34} {'acc%':>6} {'TPF':>6} {'NFE':>7} {'tok/s':>8} {'speedup':>8} {'AUP':>8}"
    lines = [head, "-" * len(head)]
    for r in report["results"]:
        lines.append(f"{r['label'][:34]:<34} {r['accuracy']:>6.1f} {r['tpf']:>6.2f} {r['nfe']:>7.1f} "
                     f"{r['tokens_per_second']:>8.1f} {r['speedup']:>7.2f}x {r['aup']:>8.1f}")
    m = report["machine"]
    lines.append(f"model={report['model']} suite={report['suite']} n={report['n']}/suite batch={report['batch_size']} "
                 f"torch_threads={m['torch_threads']} device={m['device']} {m['date']}")
    edited = [r for r in report["results"] if "edits_per_block" in r]
    if edited:
        lines.append("token edits per block: " + ", ".join(f"{r['label']} {r['edits_per_block']:.2f}" for r in edited))
    return "\n".join(lines)


def _format_groups(report: dict, key: str, title: str, cell, width: int) -> str:
    """One row per group of ``per_suite[suite][key]``, one column per method (``cell`` of its entry)."""
    rows = report["results"]
    head = f"{'suite':<10} {title:<16}" + "".join(f" {r['label'][:width]:>{width}}" for r in rows)
    lines = [head, "-" * len(head)]
    for suite, ps in rows[0]["per_suite"].items():
        for group in ps.get(key, {}):
            cells = [cell(c) if (c := r["per_suite"].get(suite, {}).get(key, {}).get(group)) else "-" for r in rows]
            lines.append(f"{suite:<10} {group:<16}" + "".join(f" {x:>{width}}" for x in cells))
    return "\n".join(lines) if len(lines) > 2 else ""


def format_categories(report: dict) -> str:
    """Accuracy per problem category (``TaskSuite.category``), one column per method: ``acc% (n)``."""
    return _format_groups(report, "categories", "category", lambda c: f"{c['accuracy']:.1f}% ({c['n']})", 22)


def format_lengths(report: dict) -> str:
    """Accuracy and TPF per reference-answer length group (tokens), one column per method: ``acc% / tpf (n)``."""
    return _format_groups(report, "lengths", "answer tokens",
                          lambda c: f"{c['accuracy']:.1f}% / {c['tpf']:.2f} ({c['n']})", 24)


LABELS_ON_POINTS_MAX = 8  # above this many methods the plot names them in a legend beside the axes


def label_groups(rows: list[dict], tol: float = 0.015) -> list[tuple[tuple[float, float], list[str]]]:
    """Methods whose points nearly coincide share one label block (a sweep that saturates would
    otherwise print its labels on top of each other). ``tol`` is a fraction of each axis' span."""
    xs, ys = [r["tpf"] for r in rows], [r["accuracy"] for r in rows]
    dx = tol * max(max(xs) - min(xs), 1e-9) if rows else 0.0
    dy = tol * max(max(ys) - min(ys), 1e-9) if rows else 0.0
    groups: list[tuple[tuple[float, float], list[str]]] = []
    for r in rows:
        for (x, y), labels in groups:
            if abs(r["tpf"] - x) <= dx and abs(r["accuracy"] - y) <= dy:
                labels.append(r["label"])
                break
        else:
            groups.append(((r["tpf"], r["accuracy"]), [r["label"]]))
    return groups


def pareto_frontier(rows: list[dict]) -> list[tuple[float, float]]:
    """The non-dominated (TPF, accuracy) points, by TPF: no other point is at least as fast and as accurate."""
    pts = sorted(((r["tpf"], r["accuracy"]) for r in rows), key=lambda p: (-p[0], -p[1]))
    frontier, best = [], float("-inf")
    for x, y in pts:
        if y > best:
            frontier.append((x, y))
            best = y
    return sorted(frontier)


def spread_offsets(rows: list[dict], step: float = 7.0) -> list[float]:
    """A horizontal offset in points per row, so that methods whose points coincide (``label_groups``) are
    drawn side by side, each visible, instead of on top of each other."""
    groups = label_groups(rows)
    seen: dict[int, int] = {}
    out = []
    for r in rows:
        g = next(i for i, (_, labels) in enumerate(groups) if r["label"] in labels)
        k, i = len(groups[g][1]), seen.get(g, 0)
        seen[g] = i + 1
        out.append((i - (k - 1) / 2) * step)
    return out


def model_title(model: str) -> str:
    """A model's name for a chart: the last part of its path, with the run's folder kept for a training export
    or checkpoint (``runs/tiny-long-512/final`` is ``tiny-long-512/final``: every export is called ``final``)."""
    parts = [p for p in str(model).replace("\\", "/").split("/") if p]
    if len(parts) > 1 and re.fullmatch(r"final|step-\d+|checkpoint-\d+", parts[-1]):
        run = parts[-3] if parts[-2] == "checkpoints" and len(parts) > 2 else parts[-2]
        return f"{run}/{parts[-1]}"
    return parts[-1] if parts else str(model)


def pareto_axes(report: dict):
    """The figure and axes of :func:`pareto_plot` (not saved), for a caller to inspect or add to."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.transforms import offset_copy

    rows = report["results"]
    crowded = len(rows) > LABELS_ON_POINTS_MAX  # many labels on the points overlap: name them in a legend
    fig, ax = plt.subplots(figsize=(9.6 if crowded else 6.4, 4.4), dpi=120)
    markers = "osD^v<>P*Xh"
    for i, (r, dx) in enumerate(zip(rows, spread_offsets(rows))):
        ax.scatter(r["tpf"], r["accuracy"], s=40, marker=markers[(i // 10) % len(markers)] if crowded else "o",
                   label=r["label"] if crowded else None,
                   transform=offset_copy(ax.transData, fig=fig, x=dx, y=0, units="points"))
    # points drawn through an offset transform do not count for autoscaling: register them, or a point off
    # the frontier's box would fall outside the axes
    ax.update_datalim([(r["tpf"], r["accuracy"]) for r in rows])
    ax.autoscale_view()
    if not crowded:
        for (x, y), labels in label_groups(rows):
            ax.annotate("\n".join(labels), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    frontier = pareto_frontier(rows)
    if len(frontier) > 1:
        ax.plot([p[0] for p in frontier], [p[1] for p in frontier], "--", color="gray", linewidth=1,
                label="Pareto frontier")
    elif frontier:  # one point dominates every other: the frontier is that point, marked as such
        ax.scatter(*frontier[0], s=220, facecolors="none", edgecolors="gray", linewidths=1.2,
                   label="Pareto frontier (one point dominates)")
    ax.set_xlabel("tokens per forward (TPF)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{model_title(report['model'])} on {report['suite']} (n={report['n']}/suite)", fontsize=9)
    ax.grid(alpha=0.3)
    if crowded:
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    elif frontier:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig, ax


def pareto_plot(report: dict, path: str) -> None:
    """Accuracy vs TPF, one point per method (coinciding ones side by side), and the Pareto frontier:
    the line through the non-dominated points, or a ring around the one point that dominates."""
    import matplotlib.pyplot as plt

    fig, _ = pareto_axes(report)
    fig.savefig(path)
    plt.close(fig)


def to_jsonable(report: dict) -> dict:
    return report if isinstance(report, dict) else asdict(report)
