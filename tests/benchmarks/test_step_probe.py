"""benchmarks/step_probe.py: per-step result accuracy of a worked solution with the reference shown."""

import json

import torch


def test_runs_and_canvases(load_benchmark):
    mod = load_benchmark("step_probe")
    assert mod.result_runs(torch.tensor([0, 1, 1, 0, 0, 1, 0, 1, 1], dtype=torch.bool)) == [(1, 3), (5, 6), (7, 9)]
    answer = torch.tensor([10, 11, 12, 13, 14])
    cut = mod.probe_canvas(answer, (2, 4), 7, 99, "cut")
    assert cut.tolist() == [10, 11, 99, 99, 99, 99, 99]  # the result and everything after it masked
    rest = mod.probe_canvas(answer, (2, 4), 7, 99, "rest")
    assert rest.tolist() == [10, 11, 99, 99, 14, 99, 99]  # only the result masked (slots past the answer too)


def test_bundled_tiny_computes_gsm_steps(tmp_path, capsys, run_benchmark):
    """The bundled tiny solves gsm (96% in its card): with the reference cut at each result it writes most
    results; every gsm problem has 2-3 steps plus the final answer."""
    path = tmp_path / "probe.json"
    report = run_benchmark("step_probe", ["--model", "tiny", "--suite", "gsm", "--n", "6", "--json", str(path)])
    assert json.loads(path.read_text()) == report
    assert report["shown"] == "cut" and report["gen_length"] == 64 and report["n"] == 6
    assert sum(r["n"] for r in report["by_step"]) == report["steps"] >= 6 * 3
    assert report["by_step"][0]["n"] == 6 and report["step_accuracy"] > 0.6
    capsys.readouterr()
    rest = run_benchmark("step_probe", ["--model", "tiny", "--suite", "gsm", "--n", "6", "--shown", "rest",
                                        "--show", "1"])
    assert rest["steps"] == report["steps"]
    shown = capsys.readouterr().out.strip().splitlines()[-1]  # "a + b = c (c) | ... | #### c (c)"
    assert 3 <= shown.count("|") + 1 <= 4  # the first problem's 2-3 steps and its final answer
    assert "=" in shown and "####" in shown and "(" in shown
