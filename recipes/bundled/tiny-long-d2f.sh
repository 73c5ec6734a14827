#!/bin/bash
# The bundled `tiny-long-d2f` (block-causal D2F student of `tiny-long`, 3.15M parameters, blocks of 16):
# one distillation run from the bundled `tiny-long`, which is both the student's starting weights and
# the frozen teacher. The command transcribes the recorded run (2026-12-06), which checkpointed every
# 250 steps instead of 500 (checkpoints do not change training).
# recipes/bundled/README.md has its steps, time and held-out accuracy.
#
#   bash recipes/bundled/tiny-long-d2f.sh                  # about 1.5 h of CPU time, 2 threads
#   PRINT_CONFIG=1 bash recipes/bundled/tiny-long-d2f.sh   # the resolved config, no training
source "$(dirname "$0")/common.sh"
R=runs/bundled/tiny-long-d2f

# ---- One stage: 2,000 steps of D2F's asymmetric loss plus the cross-entropy to the reference answer.
if stage distill $R/distill; then
    dllm_train distill --config recipes/tiny-long-d2f.yaml run_dir=$R/distill export_dir=$R/distill/final
fi
