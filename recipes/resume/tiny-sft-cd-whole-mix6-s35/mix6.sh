#!/bin/bash
# Session 35, phase 6: M4 (recipes/resume/tiny-sft-cd-whole-mix4-s34) + 6000 steps of mix4.sh's mix with
# countdown weighted 32 (was 24), lr 1e-4, seed 58, 1 thread.
cd "$(git rev-parse --show-toplevel)"
SRC=${SRC:-recipes/resume/tiny-sft-cd-whole-mix4-s34} STEPS=${STEPS:-6000} bash recipes/resume/tiny-sft-cd-whole-mix4-s34/mix4.sh \
    run_dir=runs/s35/M6 export_dir=runs/s35/M6/final seed=58 optim.lr=1e-4 data.tasks.countdown=32.0 "$@"
