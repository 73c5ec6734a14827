#!/bin/bash
# Session 34, phase 4: from M3 (recipes/resume/tiny-sft-cd-whole-mix3-s33), countdown weighted 24, lr 1.5e-4, 1 thread.
cd "$(git rev-parse --show-toplevel)"
SRC=${SRC:-recipes/resume/tiny-sft-cd-whole-mix3-s33}
OMP_WAIT_POLICY=PASSIVE .venv/bin/dllm train sft --config recipes/tiny-sft.yaml run_dir=runs/s34/M4 \
    export_dir=runs/s34/M4/final model.path=$SRC seed=54 max_steps=${STEPS:-6500} num_threads=1 optim.lr=1.5e-4 \
    optim.warmup_steps=50 prefix_prob=0.7 t_min=0.0 full_mask_prob=0.25 result_mask_prob=0.8 \
    data.tasks.arith=4.0 data.tasks.lists=5.0 data.tasks.gsm=8.0 data.tasks.sudoku=2.0 data.tasks.countdown=24.0 \
    eval_every=1000 save_every=250 mixed_precision=no token_weight_gamma=1.0 progress=false \
    "data.suite_options.lists.ops=[copy, copy, copy, reverse, sort, sort, insert, insert, insert, remove, replace, shuffle, replace_random]" "$@"
