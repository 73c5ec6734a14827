#!/bin/bash
# Session 33: a second mixed phase from recipes/resume/tiny-sft-cd-whole-mix-s32 with gsm and sudoku
# weighted up (gsm 10, sudoku 2), lr 1.5e-4, cosine to 5000 steps.
cd "$(git rev-parse --show-toplevel)"
SRC=${SRC:-recipes/resume/tiny-sft-cd-whole-mix-s32}
OMP_WAIT_POLICY=PASSIVE .venv/bin/dllm train sft --config recipes/tiny-sft.yaml run_dir=runs/s33/M2 \
    export_dir=runs/s33/M2/final model.path=$SRC seed=52 max_steps=5000 num_threads=2 optim.lr=1.5e-4 \
    optim.warmup_steps=50 prefix_prob=0.7 t_min=0.0 full_mask_prob=0.25 result_mask_prob=0.8 \
    data.tasks.arith=4.0 data.tasks.lists=6.0 data.tasks.gsm=10.0 data.tasks.sudoku=2.0 data.tasks.countdown=12.0 \
    eval_every=1000 save_every=250 mixed_precision=no token_weight_gamma=1.0 progress=false \
    "data.suite_options.lists.ops=[copy, copy, copy, reverse, sort, sort, insert, insert, insert, remove, replace, shuffle, replace_random]" "$@"
