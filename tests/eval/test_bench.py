"""dllm bench: spec parsing, the side-by-side runner, the JSON schema, the plot, the CLI."""

import json

import pytest
from typer.testing import CliRunner

from dllm.eval.bench import (
    BenchSpecError,
    Method,
    apply_sweep,
    length_bounds,
    length_label,
    method_aup,
    parse_methods,
)
from dllm.generation import DiffusionGenerationConfig
from dllm.testing import save_tiny_checkpoint


def test_parse_methods_with_parameters():
    ms = parse_methods("vanilla,threshold:cache=dual,threshold=0.9,d2f")
    assert ms == [Method("vanilla", {}), Method("threshold", {"cache": "dual", "threshold": 0.9}), Method("d2f", {})]
    assert ms[1].label == "threshold:cache=dual,threshold=0.9"
    assert parse_methods("a;b:x=1;c") == [Method("a", {}), Method("b", {"x": 1}), Method("c", {})]
    with pytest.raises(BenchSpecError, match="before any name"):
        parse_methods("threshold=0.9,vanilla")
    with pytest.raises(BenchSpecError):
        parse_methods(" , ")
    # a second parameter chained with ':' used to become part of the first one's value
    with pytest.raises(BenchSpecError, match="separate parameters with commas"):
        parse_methods("d2f,lopa:lopa_branches=2:skip_threshold=0.9")
    assert parse_methods("lopa:lopa_branches=2,skip_threshold=0.9") == [
        Method("lopa", {"lopa_branches": 2, "skip_threshold": 0.9})]


def test_sweep_expands_non_baseline_methods():
    ms = apply_sweep(parse_methods("vanilla,threshold:cache=dual"), "threshold=0.5,0.9")
    assert [m.label for m in ms] == ["vanilla", "threshold:cache=dual,threshold=0.5", "threshold:cache=dual,threshold=0.9"]
    with pytest.raises(BenchSpecError):
        apply_sweep(ms, "threshold")


def test_method_aup_uses_baseline_and_shared_ymax():
    base = {"tpf": 1.0, "accuracy": 74.02}
    fast = {"tpf": 9.11, "accuracy": 73.09}
    assert method_aup(base, fast, 74.98) == pytest.approx(637.7, abs=0.5)
    assert method_aup(base, base, 74.98) == pytest.approx(74.02)
    slow_bad = {"tpf": 4.0, "accuracy": 60.0}  # > 5 points below the baseline: dropped
    assert method_aup(base, slow_bad, 74.98) == pytest.approx(74.02)


def test_length_groups_are_quarters_of_the_problems_and_never_split_a_length():
    assert length_bounds(list(range(1, 9))) == [(1, 2), (3, 4), (5, 6), (7, 8)]
    assert length_bounds([5, 9, 7, 3, 1]) == [(1, 3), (4, 5), (6, 7), (8, 9)]  # 2, 1, 1, 1 problems
    assert length_bounds([4] * 10) == [(4, 4)]
    # ties at a quartile stay in one group: the 5s are the first three quarters' bounds
    assert length_bounds([5, 5, 5, 5, 5, 5, 6, 9]) == [(5, 5), (6, 9)]
    assert length_bounds([]) == []
    for lengths in ([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [10] * 3 + [20] * 9, list(range(60, 140, 3))):
        bounds = length_bounds(lengths)
        assert len(bounds) <= 4
        assert [lo for lo, _ in bounds[1:]] == [hi + 1 for _, hi in bounds[:-1]]  # contiguous, disjoint
        assert all(sum(lo <= x <= hi for lo, hi in bounds) == 1 for x in lengths)
    assert [length_label(x, [(1, 2), (3, 3)]) for x in (1, 2, 3)] == ["1-2", "1-2", "3"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-bc")
    save_tiny_checkpoint(d, block_causal=True, block_size=8,
                         generation_config=DiffusionGenerationConfig(strategy="d2f", max_new_tokens=16, block_length=8))
    return d


def test_bench_cli_end_to_end(ckpt, tmp_path):
    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    out_json, out_png = tmp_path / "out.json", tmp_path / "pareto.png"
    res = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "arith,lists", "--n", "3",
                                   "--strategies", "vanilla,threshold:threshold=0.5,d2f", "--json", str(out_json),
                                   "--plot", str(out_png), "--no-progress", "--batch-size", "2"])
    assert res.exit_code == 0, res.output
    report = json.loads(out_json.read_text())
    assert set(report) >= {"model", "suite", "n", "results"} and report["n"] == 3 and report["suite"] == "arith,lists"
    assert [r["strategy"] for r in report["results"]] == ["vanilla", "threshold", "d2f"]
    for r in report["results"]:
        assert set(r) >= {"strategy", "params", "accuracy", "tpf", "nfe", "tokens_per_second", "speedup", "aup"}
        assert r["examples"] == 6 and r["forwards"] > 0 and 0 <= r["accuracy"] <= 100
        assert r["tpf"] == pytest.approx(r["generated_tokens"] / r["forwards"])
    v = report["results"][0]
    assert v["speedup"] == pytest.approx(1.0) and v["nfe"] == pytest.approx(16.0)  # one token per step
    assert report["results"][1]["params"] == {"threshold": 0.5}
    assert report["machine"]["torch_threads"] == 2
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "speedup" in res.output and "AUP" in res.output
    # accuracy per category (list op, arith operator and width) adds up to the suite's
    for r in report["results"]:
        for ps in r["per_suite"].values():
            cats = ps["categories"]
            assert sum(c["n"] for c in cats.values()) == ps["n"] == 3
            correct = sum(c["accuracy"] * c["n"] / 100 for c in cats.values())
            assert correct == pytest.approx(ps["accuracy"] * ps["n"] / 100)
        # each suite's tokens and forwards, from which its TPF comes, add up to the method's
        assert sum(ps["generated_tokens"] for ps in r["per_suite"].values()) == r["generated_tokens"]
        assert sum(ps["forwards"] for ps in r["per_suite"].values()) == r["forwards"]
        assert all(ps["tpf"] == pytest.approx(ps["generated_tokens"] / ps["forwards"]) for ps in r["per_suite"].values())
    assert all(c in {"copy", "reverse", "sort", "insert", "remove", "replace", "shuffle", "replace_random"}
               for c in report["results"][0]["per_suite"]["lists"]["categories"])
    res = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "lists", "--n", "2", "--strategies",
                                   "vanilla", "--by-category", "--no-progress"])
    assert res.exit_code == 0 and "category" in res.output and "lists" in res.output.split("category")[1]
    assert "answer tokens" not in res.output
    # accuracy and TPF per reference-answer length group add up to the suite's, for every method
    for r in report["results"]:
        for ps in r["per_suite"].values():
            groups = ps["lengths"]
            assert sum(g["n"] for g in groups.values()) == ps["n"]
            assert sum(g["accuracy"] * g["n"] / 100 for g in groups.values()) == pytest.approx(ps["accuracy"] * ps["n"] / 100)
            assert all(g["tpf"] > 0 for g in groups.values())
    assert {s: list(ps["lengths"]) for s, ps in report["results"][0]["per_suite"].items()} == {
        s: list(ps["lengths"]) for s, ps in report["results"][2]["per_suite"].items()}  # groups come from the problems
    res = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "lists", "--n", "4", "--strategies",
                                   "vanilla,threshold", "--by-length", "--no-progress"])
    assert res.exit_code == 0, res.output
    table = res.output.split("answer tokens")[1].splitlines()[2:]
    assert table and all(line.startswith("lists") and line.count("%") == 2 for line in table if line.strip())


def test_samples_hold_every_answer_and_add_up_to_the_report(ckpt, tmp_path):
    """--samples writes one JSON line per problem and strategy; its verdicts and forwards are the report's."""
    from dllm.cli import _mount_subcommands, app
    from dllm.eval.tasks import resolve_suites

    _mount_subcommands()
    out, lines = tmp_path / "r.json", tmp_path / "answers.jsonl"
    res = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "arith,lists", "--n", "3", "--strategies",
                                   "vanilla,threshold:threshold=0.5", "--batch-size", "2", "--json", str(out),
                                   "--samples", str(lines), "--no-progress"])
    assert res.exit_code == 0, res.output
    assert f"wrote {lines}" in res.output
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    report = json.loads(out.read_text())
    assert len(rows) == 2 * 6
    examples = {e.id: e for s in resolve_suites("arith,lists") for e in s.examples("test", 3)}
    for r in report["results"]:
        mine = [row for row in rows if row["method"] == r["label"]]
        assert sorted(row["id"] for row in mine) == sorted(examples)
        assert 100 * sum(row["correct"] for row in mine) / len(mine) == pytest.approx(r["accuracy"])
        assert sum(row["forwards"] for row in mine) == r["forwards"]
        assert sum(row["generated_tokens"] for row in mine) == r["generated_tokens"]
    for row in rows:
        ex = examples[row["id"]]
        assert (row["suite"], row["prompt"], row["reference"]) == (ex.suite, ex.prompt, ex.answer)
        assert row["category"] in report["results"][0]["per_suite"][ex.suite]["categories"]
        assert row["length_group"] in report["results"][0]["per_suite"][ex.suite]["lengths"]
        assert isinstance(row["completion"], str) and 0 <= row["reward"] <= 1
        assert row["correct"] == (row["reward"] == 1.0)
    r = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "arith", "--n", "1", "--strategies",
                                 "vanilla", "--samples", str(tmp_path / "answers.txt"), "--no-progress"])
    assert r.exit_code == 2 and "unknown file format '.txt'" in r.output


def test_bench_cli_seed_selects_another_held_out_sample(ckpt, tmp_path, monkeypatch):
    """--seed reaches the sampler (it was once accepted and ignored) and is recorded in the JSON."""
    from dllm.cli import _mount_subcommands, app
    from dllm.eval.tasks import base

    _mount_subcommands()
    drawn = []
    real = base.TaskSuite.examples

    def spy(self, split, n, seed=0):
        out = real(self, split, n, seed=seed)
        drawn.append((seed, [e.id for e in out]))
        return out

    monkeypatch.setattr(base.TaskSuite, "examples", spy)
    for seed in (0, 3):
        out = tmp_path / f"s{seed}.json"
        res = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "arith", "--n", "2", "--strategies",
                                       "vanilla", "--seed", str(seed), "--json", str(out), "--no-progress"])
        assert res.exit_code == 0, res.output
        assert json.loads(out.read_text())["seed"] == seed
    assert [s for s, _ in drawn] == [0, 3]
    assert drawn[0][1] != drawn[1][1] and all(i.startswith("arith-test-s3-") for i in drawn[1][1])


def test_bench_cli_passes_suite_options(ckpt, tmp_path):
    """``--suite lists:ops=copy`` benches that setting of the suite, and the JSON says which."""
    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    out = tmp_path / "copy.json"
    res = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "lists:ops=copy", "--n", "3",
                                   "--strategies", "vanilla", "--json", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["suite"] == "lists:ops=copy"
    assert set(report["results"][0]["per_suite"]["lists"]["categories"]) == {"copy"}


def test_suite_categories():
    from dllm.eval.bench import _natural
    from dllm.eval.tasks import get_suite

    for name, pattern in (("arith", r"[+*-][123]"), ("lists", r"[a-z_]+"), ("gsm", r"[23] steps"),
                          ("sudoku", r"\d+ blanks")):
        suite = get_suite(name)
        cats = {suite.category(e) for e in suite.examples("test", 60)}
        assert cats and all(__import__("re").fullmatch(pattern, c) for c in cats), (name, cats)
    assert get_suite("countdown").category(get_suite("countdown").examples("test", 1)[0]) is None
    ex = get_suite("arith").examples("test", 200)
    assert {get_suite("arith").category(e) for e in ex if e.meta["op"] == "*"} <= {"*1", "*2"}
    assert sorted(["10 blanks", "6 blanks", "+3", "+10"], key=_natural) == ["6 blanks", "10 blanks", "+3", "+10"]


def test_bench_cli_user_errors(ckpt):
    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    r = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--strategies", "warp", "--n", "1", "--no-progress"])
    assert r.exit_code == 2 and "unknown strategy 'warp'" in r.output
    r = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "poetry", "--n", "1", "--no-progress"])
    assert r.exit_code == 2 and "poetry" in r.output
    r = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "sudoku9:blanks=99", "--n", "1", "--no-progress"])
    assert r.exit_code == 2 and "blanks must be" in r.output
    r = CliRunner().invoke(app, ["bench", "--model", "/nonexistent", "--n", "1"])
    assert r.exit_code == 2 and "neither a bundled name" in r.output
    r = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--threads", "0", "--n", "1"])
    assert r.exit_code == 2 and "--threads must be >= 1" in r.output
    r = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "arith", "--n", "1", "--no-progress",
                                 "--strategies", "vanilla,threshold", "--sweep", "threshold=high"])
    assert r.exit_code == 2 and "threshold='high' must be a finite number" in r.output
    r = CliRunner().invoke(app, ["bench", "--model", str(ckpt), "--suite", "arith", "--n", "1", "--no-progress",
                                 "--strategies", "vanilla,threshold:lopa_branches=2"])
    assert r.exit_code == 2 and "method 'threshold:lopa_branches=2': strategy 'threshold' does not read " \
                                "lopa_branches (read by lopa)" in r.output


def test_bench_cli_output_paths_are_checked_before_the_run(ckpt, tmp_path):
    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    base = ["bench", "--model", str(ckpt), "--suite", "arith", "--n", "1", "--strategies", "vanilla", "--no-progress"]
    r = CliRunner().invoke(app, base + ["--plot", str(tmp_path / "p.xyz")])
    assert r.exit_code == 2 and "unknown file format '.xyz'" in r.output and "arith" not in r.output
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = CliRunner().invoke(app, base + ["--json", str(blocker / "out.json")])
    assert r.exit_code == 2 and "cannot create the folder" in r.output and "Traceback" not in r.output
    r = CliRunner().invoke(app, base + ["--json", str(tmp_path)])
    assert r.exit_code == 2 and "is a folder" in r.output
    # a folder that does not exist yet is created, so the run's report is not lost
    out = tmp_path / "new" / "deeper" / "r.json"
    r = CliRunner().invoke(app, base + ["--json", str(out), "--plot", str(out.with_suffix(".png"))])
    assert r.exit_code == 0, r.output
    assert json.loads(out.read_text())["n"] == 1 and out.with_suffix(".png").stat().st_size > 1000


def _interrupt_on_call(monkeypatch, call: int):
    """generate_text raises KeyboardInterrupt (Ctrl-C) on its ``call``-th call."""
    import dllm.text

    real, calls = dllm.text.generate_text, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(dllm.text, "generate_text", flaky)


def test_ctrl_c_keeps_the_batches_every_strategy_finished(ckpt, tmp_path, monkeypatch):
    from dllm.cli import _mount_subcommands, app

    _mount_subcommands()
    base = ["bench", "--model", str(ckpt), "--suite", "arith", "--n", "3", "--strategies", "vanilla,d2f",
            "--no-progress"]
    # call 4 is d2f's (or vanilla's: the order rotates) half of the second batch: only batch 1 counts
    _interrupt_on_call(monkeypatch, 4)
    out = tmp_path / "partial.json"
    res = CliRunner().invoke(app, base + ["--json", str(out)])
    assert res.exit_code == 130, res.output
    assert "partial results over the first 1 of 3 prompts" in res.output and "Traceback" not in res.output
    report = json.loads(out.read_text())
    assert report["interrupted"] == {"examples_done": 1, "examples_planned": 3}
    assert [r["examples"] for r in report["results"]] == [1, 1]  # the same prompts for both
    assert all(r["forwards"] > 0 for r in report["results"])
    # --samples keeps the answers of the same finished batch, and only those
    _interrupt_on_call(monkeypatch, 4)
    lines = tmp_path / "partial.jsonl"
    res = CliRunner().invoke(app, base + ["--samples", str(lines)])
    assert res.exit_code == 130, res.output
    assert sorted(json.loads(line)["method"] for line in lines.read_text().splitlines()) == ["d2f", "vanilla"]
    # nothing finished: a clear line, no report, no traceback
    _interrupt_on_call(monkeypatch, 1)
    out2 = tmp_path / "none.json"
    res = CliRunner().invoke(app, base + ["--json", str(out2)])
    assert res.exit_code == 130 and "nothing to report" in res.output and not out2.exists()


def test_label_groups_merge_coinciding_points():
    from dllm.eval.bench import label_groups

    rows = [{"label": "d2f", "tpf": 4.92, "accuracy": 94.5},
            {"label": "lopa k=2", "tpf": 6.04, "accuracy": 91.5},
            {"label": "lopa k=4", "tpf": 6.05, "accuracy": 91.5},
            {"label": "lopa k=8", "tpf": 6.05, "accuracy": 91.5}]
    groups = label_groups(rows)
    assert groups == [((4.92, 94.5), ["d2f"]), ((6.04, 91.5), ["lopa k=2", "lopa k=4", "lopa k=8"])]
    # points apart on either axis keep their own labels
    rows[2]["accuracy"] = 92.5
    assert [g[1] for g in label_groups(rows)] == [["d2f"], ["lopa k=2", "lopa k=8"], ["lopa k=4"]]
    assert label_groups([]) == []
    assert label_groups(rows[:1]) == [((4.92, 94.5), ["d2f"])]


def test_pareto_plot_names_many_methods_in_a_legend(tmp_path, monkeypatch):
    import matplotlib.axes

    from dllm.eval.bench import LABELS_ON_POINTS_MAX, pareto_plot

    calls = {"annotate": 0, "legend_labels": []}
    real_legend = matplotlib.axes.Axes.legend

    def legend(self, *a, **kw):
        calls["legend_labels"] = [t for t in self.get_legend_handles_labels()[1]]
        return real_legend(self, *a, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "annotate", lambda self, *a, **kw: calls.__setitem__(
        "annotate", calls["annotate"] + 1))
    monkeypatch.setattr(matplotlib.axes.Axes, "legend", legend)
    n = LABELS_ON_POINTS_MAX + 4
    report = {"model": "m", "suite": "gsm", "n": 5,
              "results": [{"label": f"s{i}", "tpf": 1.0 + i, "accuracy": 90.0 - i} for i in range(n)]}
    pareto_plot(report, str(tmp_path / "many.png"))
    assert (tmp_path / "many.png").stat().st_size > 1000
    assert calls["annotate"] == 0 and calls["legend_labels"][:n] == [f"s{i}" for i in range(n)]
    report["results"] = report["results"][:3]
    pareto_plot(report, str(tmp_path / "few.png"))
    assert calls["annotate"] == 3  # few methods: each point carries its own label


def test_the_frontier_drawn_is_the_one_named():
    import matplotlib.pyplot as plt

    from dllm.eval.bench import pareto_axes, pareto_frontier

    dominated = [{"label": "vanilla", "tpf": 1.0, "accuracy": 80.0}, {"label": "d2f", "tpf": 5.0, "accuracy": 90.0},
                 {"label": "threshold", "tpf": 4.0, "accuracy": 85.0}]
    assert pareto_frontier(dominated) == [(5.0, 90.0)]
    fig, ax = pareto_axes({"model": "m", "suite": "gsm", "n": 5, "results": dominated})
    labels = ax.get_legend_handles_labels()[1]
    assert labels == ["Pareto frontier (one point dominates)"] and not ax.get_lines()
    plt.close(fig)
    trade = dominated[:2] + [{"label": "lopa", "tpf": 7.0, "accuracy": 86.0}]
    assert pareto_frontier(trade) == [(5.0, 90.0), (7.0, 86.0)]
    fig, ax = pareto_axes({"model": "m", "suite": "gsm", "n": 5, "results": trade})
    [line] = ax.get_lines()
    assert list(line.get_xdata()) == [5.0, 7.0] and ax.get_legend_handles_labels()[1] == ["Pareto frontier"]
    plt.close(fig)


def test_a_chart_names_a_training_export_by_its_run():
    import matplotlib.pyplot as plt

    from dllm.eval.bench import model_title, pareto_axes

    assert model_title("runs/tiny-long-512/final") == "tiny-long-512/final"
    assert model_title("/tmp/run/checkpoints/step-0000200/") == "run/step-0000200"
    assert model_title("tiny-long") == "tiny-long" and model_title("/models/LLaDA-8B-Instruct") == "LLaDA-8B-Instruct"
    assert model_title("final") == "final"
    fig, ax = pareto_axes({"model": "runs/a/final", "suite": "long", "n": 3,
                           "results": [{"label": "vanilla", "tpf": 1.0, "accuracy": 20.0}]})
    assert ax.get_title() == "a/final on long (n=3/suite)"
    plt.close(fig)


def test_coinciding_points_are_drawn_side_by_side():
    import matplotlib.pyplot as plt

    from dllm.eval.bench import pareto_axes, spread_offsets

    rows = [{"label": "d2f", "tpf": 4.92, "accuracy": 94.5}, {"label": "lopa k=2", "tpf": 6.05, "accuracy": 91.5},
            {"label": "lopa k=4", "tpf": 6.05, "accuracy": 91.5}, {"label": "lopa k=8", "tpf": 6.05, "accuracy": 91.5}]
    assert spread_offsets(rows) == [0.0, -7.0, 0.0, 7.0]
    fig, ax = pareto_axes({"model": "m", "suite": "gsm", "n": 5, "results": rows})
    fig.canvas.draw()
    centres = [tuple(c.get_offset_transform().transform(c.get_offsets()[0])) for c in ax.collections[:4]]
    assert len(set(centres)) == 4  # four distinct places on the canvas, none hidden under another
    plt.close(fig)


def test_a_sweep_skips_methods_that_ignore_its_key():
    ms = apply_sweep(parse_methods("vanilla,threshold,d2f"), "threshold=0.5,0.9")
    assert [m.label for m in ms] == ["vanilla", "threshold:threshold=0.5", "threshold:threshold=0.9", "d2f"]
    ms = apply_sweep(parse_methods("vanilla,d2f,lopa:lopa_branches=2"), "skip_threshold=0.8,0.9")
    assert len(ms) == 5
    with pytest.raises(BenchSpecError, match="reads threshold"):
        apply_sweep(parse_methods("vanilla,d2f"), "threshold=0.5")
    from dllm import GenerationConfigError

    with pytest.raises(GenerationConfigError, match="treshold"):
        apply_sweep(parse_methods("vanilla,threshold"), "treshold=0.5")


def test_every_generation_option_is_read_by_some_strategy():
    import dataclasses

    from dllm import DiffusionGenerationConfig
    from dllm.decoding.registry import COMMON_OPTIONS, STRATEGIES

    fields = {f.name for f in dataclasses.fields(DiffusionGenerationConfig)}
    named = set(COMMON_OPTIONS).union(*(s.options for s in STRATEGIES.values()))
    assert named == fields


def test_progress_to_a_log_file_is_a_line_per_batch(tmp_path, capsys):
    """Under pytest stderr is not a terminal, as when a long bench is sent to a log file: each batch
    prints a line at once (rich would draw nothing there until the end)."""
    from dllm.eval.bench import run_bench
    from dllm.loading import load_model
    from dllm.tokenization import load_tokenizer

    save_tiny_checkpoint(tmp_path / "m")
    model, tok = load_model(str(tmp_path / "m")).eval(), load_tokenizer(str(tmp_path / "m"))
    run_bench(model, tok, suites="arith", methods=parse_methods("vanilla,threshold"), n=3, batch_size=2,
              base_overrides={"max_new_tokens": 8, "block_length": 8})
    err = capsys.readouterr().err.splitlines()
    lines = [line for line in err if line.startswith("bench: batch")]
    assert len(lines) == 2 and lines[0].startswith("bench: batch 1/2 done, 2/3 problems")
    assert lines[1].startswith("bench: batch 2/2 done, 3/3 problems") and "vanilla" in lines[1] and "threshold" in lines[1]
