#!/bin/bash
# Session 34, phase 5: M4 (this folder's weights) + 2000 steps of mix4.sh's mix at lr 7e-5, seed 56.
# Resolves to the run's config (--print-config) but for model.path, which was runs/s34/M4/final.
cd "$(git rev-parse --show-toplevel)"
SRC=${SRC:-recipes/resume/tiny-sft-cd-whole-mix4-s34} STEPS=${STEPS:-2000} bash recipes/resume/tiny-sft-cd-whole-mix4-s34/mix4.sh \
    run_dir=runs/s34/M5 export_dir=runs/s34/M5/final seed=56 optim.lr=7e-5 eval_every=500 "$@"
