"""The bundled `tiny`'s held-out learning curve across all its training phases, against the issue's bars.

    python benchmarks/learning_curve.py --out docs/results/tiny-learning-curve.png

Each phase's run wrote `eval.csv` (greedy accuracy on 32 test problems per suite every 500-1000
steps; the folders under `recipes/resume/`). Phases 1-6 were resumed from checkpoints, so their
steps are already global; phases 7-17 started from exported weights and count from 0, so they are
shifted by the SFT steps before them. Phase 16 trained and evaluated countdown only, so the other
suites have no points there. Between phases 8 and 9 lie 405 steps of accuracy GRPO, which
are not SFT steps and not on the axis (the dashed line at step 32500 marks both the GRPO stage and
the re-warmed lr). n=32 is a noisy sample (one problem is 3 points): read the trend, and the model
card's n=200 tables for the level.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from eval.outputs import IMAGE_FORMATS, check_output_args

ROOT = Path(__file__).resolve().parents[1]
RESUME = ROOT / "recipes" / "resume"
# (folder, offset added to its steps): the phases of the bundled tiny, in order
PHASES: tuple[tuple[str, int], ...] = (
    ("tiny-sft", 0),
    ("tiny-sft-s6", 0),
    ("tiny-sft-s7", 0),
    ("tiny-sft-s8", 0),
    ("tiny-sft-s10/phase-7", 28000),
    ("tiny-sft-s10/phase-8", 31000),
    # phase 9 (result-masked SFT after the GRPO stage): two runs, 3000 then 5000 steps
    ("tiny-sft-res-s13/eval-1.csv", 32500),
    ("tiny-sft-res-s13/eval-2.csv", 35500),
    # phase 10: 5000 result-masked steps at result_mask_prob 0.8 (session 14)
    ("tiny-sft-res-s14", 40500),
    # phase 11: two list-weighted runs of 2000 steps (session 15)
    ("tiny-sft-lists-s15", 45500),
    ("tiny-sft-lists2-s15", 47500),
    # phases 12-13: two countdown-weighted runs of 2000 steps (session 16)
    ("tiny-sft-cd-s16/eval-1.csv", 49500),
    ("tiny-sft-cd-s16/eval-2.csv", 51500),
    # phase 14: the MLP grown 3x, 3000 steps (session 18); phase 15: 4000 steps with token
    # reweighting (session 19)
    ("tiny-sft-cd-wide-s18/eval.csv", 53500),
    ("tiny-sft-cd-wide-s18/eval-s19-tw1.csv", 56500),
    # phase 16: countdown-only SFT, 2400 + 1200 steps (session 21; the other suites were not evaluated)
    ("tiny-sft-cd-wide-s18/eval-s21-solo1.csv", 60500),
    ("tiny-sft-cd-solo-s21/eval.csv", 62900),
    # phase 17: a mixed phase with countdown weighted 12 (session 22; bundled since session 23)
    ("tiny-sft-cd-mix-s22/eval.csv", 64100),
)
# phase 16 trained countdown only; the other suites' lines cross it without points
COUNTDOWN_ONLY = (60500, 64100)
# the vanilla-decoding bars per suite (lists and arith name only some categories, so they
# are drawn for orientation)
BARS = {"sudoku": 80.0, "gsm": 85.0, "countdown": 50.0, "lists": 98.0, "arith": 97.0}
SUITES = ("arith", "lists", "gsm", "sudoku", "countdown")


def stitch(phases=PHASES, root: Path = RESUME) -> list[dict[str, float]]:
    """Rows ``{"step": global step, suite: accuracy in %, ...}`` of all phases, in step order."""
    rows: list[dict[str, float]] = []
    last = -1.0
    for folder, offset in phases:
        path = root / folder
        if path.suffix != ".csv":  # a run folder holds its curve as eval.csv
            path = path / "eval.csv"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: a phase of the curve is missing")
        with path.open() as f:
            for rec in csv.DictReader(f):
                row = {"step": float(rec["step"]) + offset}
                row.update({s: 100.0 * float(rec[s]) for s in SUITES if rec.get(s) not in (None, "")})
                if row["step"] <= last:
                    raise ValueError(f"{path}: step {row['step']:.0f} does not follow {last:.0f}; check the offsets")
                last = row["step"]
                rows.append(row)
    return rows


def plot(rows: list[dict[str, float]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    for i, suite in enumerate(SUITES):
        color = f"C{i}"
        pts = [(r["step"], r[suite]) for r in rows if suite in r]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", color=color, label=suite)
        ax.axhline(BARS[suite], color=color, linestyle=":", linewidth=1)
    for _, offset in PHASES:
        if offset:
            ax.axvline(offset, color="grey", linewidth=0.8, linestyle="--")
    ax.axvspan(*COUNTDOWN_ONLY, color="grey", alpha=0.12, label="countdown-only SFT")
    ax.set_xlabel("optimizer step (64 examples each)")
    ax.set_ylabel("greedy accuracy, 32 test problems per suite (%)")
    ax.set_title("bundled tiny: held-out accuracy per suite; dotted: the issue's bars; dashed: lr re-warmed (32500: after GRPO)")
    ax.set_ylim(0, 102)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/results/tiny-learning-curve.png")
    args = ap.parse_args(argv)
    check_output_args(ap, args.out, suffixes=IMAGE_FORMATS)
    rows = stitch()
    plot(rows, Path(args.out))
    first, last = rows[0], rows[-1]
    print(f"{len(rows)} points, steps {first['step']:.0f}-{last['step']:.0f}; last: "
          + ", ".join(f"{s} {last[s]:.0f}%" for s in SUITES if s in last) + f"; wrote {args.out}")
    return rows


if __name__ == "__main__":
    main()
