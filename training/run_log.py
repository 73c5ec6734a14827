"""What a run reports: a progress bar (loss, tokens/s, ETA), TensorBoard events and CSV files.

``metrics.csv`` has one row per logged step; on resume the rows after the checkpoint's step are
dropped, so the file always describes the run that produced the current weights.
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path


class CsvLog:
    def __init__(self, path: Path, resume_step: int) -> None:
        self.path = path
        self.fields: list[str] | None = None
        if path.exists():
            with path.open() as f:
                rows = list(csv.DictReader(f))
            rows = [r for r in rows if int(float(r.get("step", 0) or 0)) <= resume_step]
            if rows:
                self.fields = list(rows[0].keys())
                self._rewrite(rows)
            else:
                path.unlink()

    def _rewrite(self, rows: list[dict]) -> None:
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=self.fields)
            w.writeheader()
            w.writerows(rows)
        tmp.replace(self.path)

    def write(self, row: dict) -> None:
        if self.fields is None:
            self.fields = list(row)
            with self.path.open("w", newline="") as f:
                csv.DictWriter(f, fieldnames=self.fields).writeheader()
        elif any(k not in self.fields for k in row):  # a new column: rewrite with the wider header
            with self.path.open() as f:
                rows = list(csv.DictReader(f))
            self.fields += [k for k in row if k not in self.fields]
            self._rewrite(rows)
        with self.path.open("a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow({k: row.get(k, "") for k in self.fields})


class RunLogger:
    """Main-process reporting; every method is a no-op elsewhere."""

    def __init__(self, run_dir: Path, start_step: int, max_steps: int, enabled: bool, progress: bool) -> None:
        self.enabled = enabled
        self.start_step = start_step
        self.max_steps = max_steps
        self.t0 = time.time()
        self.tty = sys.stderr.isatty()
        self.bar = None
        self.tb = None
        if not enabled:
            return
        run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics = CsvLog(run_dir / "metrics.csv", start_step)
        self.evals = CsvLog(run_dir / "eval.csv", start_step)
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=start_step + 1)
        except Exception as err:  # tensorboard is optional (extra "training")
            print(f"[dllm.train] TensorBoard disabled ({err})", file=sys.stderr)
        if progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=max_steps, initial=start_step, desc="train", dynamic_ncols=True,
                            mininterval=0.5 if self.tty else 30.0, smoothing=0.05)

    def log(self, step: int, scalars: dict, note: str | None = None) -> None:
        """One row of metrics; ``note`` replaces the loss in the printed line when the step has none
        (a GRPO step that updated nothing)."""
        if not self.enabled:
            return
        row = {"step": step, **{k: round(v, 6) if isinstance(v, float) else v for k, v in scalars.items()}}
        self.metrics.write(row)
        if self.tb is not None:
            for k, v in scalars.items():
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(f"train/{k}", v, step)
        done = step - self.start_step
        elapsed = time.time() - self.t0
        eta = elapsed / max(done, 1) * (self.max_steps - step)
        loss = f"loss {scalars['loss']:.4f}" if "loss" in scalars else (note or "no loss")
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{scalars['loss']:.4f}" if "loss" in scalars else "-",
                                 tok_s=f"{scalars.get('tokens_per_s', 0):.0f}", refresh=False)
        if not self.tty or self.bar is None:
            self.message(
                f"step {step}/{self.max_steps} {loss} "
                f"lr {scalars.get('lr', 0):.2e} tok/s {scalars.get('tokens_per_s', 0):.0f} "
                f"elapsed {elapsed / 60:.1f}m eta {eta / 60:.1f}m"
            )
        elif note:
            self.message(f"step {step}: {note}")

    def log_eval(self, step: int, scores: dict) -> None:
        if not self.enabled:
            return
        self.evals.write({"step": step, **scores})
        if self.tb is not None:
            for k, v in scores.items():
                self.tb.add_scalar(f"eval/{k}", v, step)
        self.message(f"eval step {step}: " + " ".join(f"{k}={v:.3f}" for k, v in scores.items()))

    def advance(self, n: int = 1) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def message(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(f"[dllm.train] {text}", file=sys.stderr)
        else:
            print(f"[dllm.train] {text}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.tb is not None:
            try:
                self.tb.flush()
                self.tb.close()
            except Exception as err:  # a full disk: the run's own error says so; this must not hide it
                print(f"[dllm.train] TensorBoard events not flushed ({err})", file=sys.stderr)
            self.tb = None
