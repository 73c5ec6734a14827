#!/usr/bin/env bash
# GPU variant of the README benchmarks: bf16, larger batches, same code path (runs unchanged on CUDA).
#   bash benchmarks/gpu_bench.sh [N]
set -euo pipefail
N=${1:-200}
python benchmarks/readme_tables.py --n "$N" --device cuda --dtype bf16 --batch-size 32 --out docs/results/gpu
python benchmarks/overhead.py --device cuda --dtype bf16 --new-tokens 256 --json docs/results/gpu/overhead.json
