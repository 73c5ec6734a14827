"""Whether the chosen mixed precision will be fast on the device a run lands on.

bf16 autocast on a CPU without native bf16 arithmetic (AVX512-BF16 or AMX on x86) is emulated by
PyTorch and runs several times slower than fp32: on an AVX2-only EPYC, one SFT micro-batch of the
bundled 1.3M model took 3.6 s in bf16 against 0.40 s in fp32 (`benchmarks/attention_backward.py`,
docs/training.md). The recipes ask for
bf16 because the machines they were tuned on had AVX512-BF16, so a run on another CPU should say so.
"""

from __future__ import annotations

from pathlib import Path

import torch

_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_is_native(cpuinfo: str | None = None) -> bool | None:
    """True/False on x86 Linux (from the CPU flags); None where it cannot be told (other systems)."""
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        if not path.is_file():
            return None
        try:
            cpuinfo = path.read_text()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[-1].split())
    if not flags or "sse2" not in flags:  # not an x86 flags list (e.g. ARM "Features")
        return None
    return any(f in flags for f in _BF16_FLAGS)


def slow_precision_warning(mixed_precision: str, device: torch.device | str,
                           cpuinfo: str | None = None) -> str | None:
    """A message when ``mixed_precision`` will be emulated (slow) on ``device``; None otherwise."""
    if mixed_precision != "bf16" or torch.device(device).type != "cpu":
        return None
    if cpu_bf16_is_native(cpuinfo) is not False:
        return None
    return ("mixed_precision=bf16 on a CPU without native bf16 (no avx512_bf16/amx_bf16 flag): PyTorch "
            "emulates it, typically several times slower than fp32. Add mixed_precision=no to train "
            "in fp32 here")
