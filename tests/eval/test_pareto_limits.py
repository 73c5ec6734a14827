"""The Pareto plot shows every method, also one far off the frontier."""

from dllm.eval.bench import pareto_axes


def test_points_off_the_frontier_stay_inside_the_axes():
    rows = [{"label": f"m{i}", "tpf": t, "accuracy": a}
            for i, (t, a) in enumerate([(4.0, 86.0), (5.5, 84.0), (6.5, 77.0), (0.5, 15.0)])]
    fig, ax = pareto_axes({"results": rows, "model": "m", "suite": "all", "n": 1})
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    assert x0 <= 0.5 <= x1 and y0 <= 15.0 <= y1
    import matplotlib.pyplot as plt

    plt.close(fig)
