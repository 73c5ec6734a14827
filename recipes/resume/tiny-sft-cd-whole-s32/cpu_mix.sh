#!/bin/bash
# Session 32, stage 3: session 22's mixed phase (phase-17 mix, countdown weight 12, lr 1e-4) from
# stage 2's export (runs/s32/A2/final, kept in this folder as model.safetensors + tokenizer).
cd "$(git rev-parse --show-toplevel)"
SRC=${SRC:-runs/s32/A2/final}
OMP_WAIT_POLICY=PASSIVE .venv/bin/dllm train sft --config recipes/tiny-sft.yaml run_dir=runs/s32/M \
    export_dir=runs/s32/M/final model.path=$SRC seed=51 max_steps=2400 num_threads=2 optim.lr=1e-4 \
    optim.warmup_steps=50 prefix_prob=0.7 t_min=0.0 full_mask_prob=0.25 result_mask_prob=0.8 \
    data.tasks.arith=4.0 data.tasks.lists=6.0 data.tasks.gsm=3.0 data.tasks.sudoku=1.0 data.tasks.countdown=12.0 \
    eval_every=500 save_every=250 mixed_precision=no token_weight_gamma=1.0 progress=false \
    "data.suite_options.lists.ops=[copy, copy, copy, reverse, sort, sort, insert, insert, insert, remove, replace, shuffle, replace_random]"
