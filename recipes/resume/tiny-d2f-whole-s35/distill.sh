#!/bin/bash
# Session 35: S2 = S1 (recipes/resume/tiny-d2f-whole-s34) distilled 5000 more steps from M4
# (recipes/resume/tiny-sft-cd-whole-mix4-s34) with sudoku weighted 6 and countdown 40, seed 57, 1 thread.
cd "$(git rev-parse --show-toplevel)"
TEACHER=${TEACHER:-recipes/resume/tiny-sft-cd-whole-mix4-s34} bash recipes/resume/tiny-d2f-whole-s34/distill.sh \
    model.path=recipes/resume/tiny-d2f-whole-s34 run_dir=runs/s35/S2 export_dir=runs/s35/S2/final seed=57 \
    data.tasks.sudoku=6.0 data.tasks.countdown=40.0 "$@"
