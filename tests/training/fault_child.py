"""``dllm train`` with one fault injected at an exact point, for tests/training/test_faults.py:

    python tests/training/fault_child.py FAULT -- sft --config R.yaml key=value ...

FAULT is ``none``, or ``KIND@STEP`` where STEP is the run's step counter (``state.step``: steps done) when the
fault strikes:

- ``sigint@S`` / ``sigterm@S``: the process sends itself the signal as step S + 1 starts (the real handler
  then checkpoints after that step);
- ``kill@S``: SIGKILL right after the first backward pass of step S + 1 (gradients computed, no update);
- ``killsave@S``: SIGKILL in the middle of writing checkpoint ``step-S``: its ``optimizer.bin`` is half
  written into the temporary folder, ``model.safetensors`` already complete beside it.

The process is started as ``dllm``, so the resume command it prints starts with ``dllm train``; the test
runs that command through this script again.
"""

from __future__ import annotations

import io
import os
import signal
import sys


def main() -> None:
    fault, rest = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    kind, _, step = fault.partition("@")
    at = int(step) if step else -1
    current = {"step": None, "backward": 0}

    import torch
    from accelerate import Accelerator

    from dllm.training import engine
    from dllm.training.grpo import GRPOTrainer

    for cls in (engine.Trainer, GRPOTrainer):
        original_step = cls.train_step

        def train_step(self, model, optimizer, scheduler, state, *args, _orig=original_step, **kw):
            current["step"], current["backward"] = state.step, 0
            if state.step == at and kind in ("sigint", "sigterm"):
                os.kill(os.getpid(), signal.SIGINT if kind == "sigint" else signal.SIGTERM)
            return _orig(self, model, optimizer, scheduler, state, *args, **kw)

        cls.train_step = train_step

    original_backward = Accelerator.backward

    def backward(self, loss, **kw):
        original_backward(self, loss, **kw)
        current["backward"] += 1
        if kind == "kill" and current["step"] == at and current["backward"] == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    Accelerator.backward = backward
    original_save = torch.save

    def save(obj, f, *args, **kw):
        if kind == "killsave" and f".tmp-step-{at:07d}" in str(f) and str(f).endswith("optimizer.bin"):
            buf = io.BytesIO()
            original_save(obj, buf, *args, **kw)
            with open(f, "wb") as out:
                out.write(buf.getvalue()[: len(buf.getvalue()) // 2])
                out.flush()
                os.fsync(out.fileno())
            os.kill(os.getpid(), signal.SIGKILL)
        return original_save(obj, f, *args, **kw)

    torch.save = save
    sys.argv = ["dllm", *rest]
    from dllm.training.cli import train_app

    train_app(args=rest, prog_name="dllm train")


if __name__ == "__main__":
    main()
