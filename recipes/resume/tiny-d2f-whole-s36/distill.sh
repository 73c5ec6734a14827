#!/bin/bash
# Session 36: S5, the bundled tiny-d2f since session 36 = S2 (recipes/resume/tiny-d2f-whole-s35) distilled 4000
# more steps from M6 (recipes/resume/tiny-sft-cd-whole-mix6-s35, the bundled tiny), lr 1e-4, sudoku weighted 12
# and countdown 48, seed 61, 1 thread (76 min).
# S4 (not kept): optim.lr=1.5e-4 data.tasks.sudoku=10.0 seed=60 run_dir=runs/s36/S4 export_dir=runs/s36/S4/final
cd "$(git rev-parse --show-toplevel)"
TEACHER=${TEACHER:-recipes/resume/tiny-sft-cd-whole-mix6-s35} STEPS=${STEPS:-4000} bash recipes/resume/tiny-d2f-whole-s34/distill.sh \
    model.path=recipes/resume/tiny-d2f-whole-s35 run_dir=runs/s36/S5 export_dir=runs/s36/S5/final seed=61 \
    optim.lr=1e-4 data.tasks.sudoku=12.0 data.tasks.countdown=48.0 "$@"
