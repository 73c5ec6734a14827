#!/usr/bin/env bash
# GPU variant of the README benchmarks: bf16, larger batches, same code path (runs unchanged on CUDA),
# preceded by the hot-path benchmark (benchmarks/gpu_bench.py, see docs/kernels.md).
#   bash benchmarks/gpu_bench.sh [N]
set -euo pipefail
N=${1:-200}
mkdir -p docs/results/gpu
# Hot paths first (one table: confidence kernel, e2e per family and strategy, attention per cache mode,
# torch.compile and CUDA graphs, pytest -m gpu; at most 330 s).
python benchmarks/gpu_bench.py --json docs/results/gpu/hot_paths.json || echo "gpu_bench.py failed; continuing"
python benchmarks/readme_tables.py --n "$N" --device cuda --dtype bf16 --batch-size 32 --out docs/results/gpu
python benchmarks/overhead.py --device cuda --dtype bf16 --new-tokens 256 --json docs/results/gpu/overhead.json
