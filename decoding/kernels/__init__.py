"""GPU kernels (Triton) for the decoding hot paths, each with a pure-PyTorch reference.

Nothing here imports triton at import time: the kernels are compiled on first use, on CUDA (or on
CPU under ``TRITON_INTERPRET=1`` for tests). See docs/kernels.md.
"""

from .confidence import (
    ConfidenceStats,
    benchmark_confidence,
    confidence_stats,
    confidence_stats_reference,
    confidence_stats_triton,
    triton_available,
    use_triton_kernels,
)

__all__ = [
    "ConfidenceStats", "benchmark_confidence", "confidence_stats", "confidence_stats_reference",
    "confidence_stats_triton", "triton_available", "use_triton_kernels",
]
