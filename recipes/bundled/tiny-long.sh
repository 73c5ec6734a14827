#!/bin/bash
# The bundled `tiny-long` (bidirectional, 3.15M parameters, the long-answer suites) from the bundled
# `tiny`: its two recorded phases in order, each from the previous export under runs/bundled/tiny-long/.
# The commands transcribe the recorded runs (2026-12-06); the chain was not re-run end to end.
# recipes/bundled/README.md has the steps, times and held-out accuracy of each phase.
#
#   bash recipes/bundled/tiny-long.sh                  # about 6.5 h of CPU time, 2 threads
#   PRINT_CONFIG=1 bash recipes/bundled/tiny-long.sh   # each phase's resolved config, no training
source "$(dirname "$0")/common.sh"
R=runs/bundled/tiny-long

# ---- Phase 1: 6,000 steps from `tiny`, t ~ U(0.5, 1). Recorded with 1 thread to step 2,113, then 2
# threads (resumed from its checkpoints): a single 2-thread run is the same recipe, not the same bytes.
if stage phase1 $R/phase1; then
    dllm_train sft --config recipes/tiny-long-sft.yaml run_dir=$R/phase1 export_dir=$R/phase1/final num_threads=2
fi
# ---- Phase 2: 2,500 steps, a fresh optimizer and cosine schedule, t ~ U(0, 1), full_mask_prob 0.25.
if stage phase2 $R/phase2; then
    dllm_train sft --config recipes/tiny-long-sft-phase2.yaml run_dir=$R/phase2 export_dir=$R/phase2/final \
        model.path=$R/phase1/final num_threads=2
fi
