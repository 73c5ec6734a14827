#!/bin/bash
# Session 33, phase 3: from mix2.sh's export, arith 6, gsm 8, countdown 16, lr 1e-4, cosine to 4000 steps.
cd "$(git rev-parse --show-toplevel)"
# M2 is mix2.sh's export (runs/s33/M2/final); its weights are not kept, so run mix2.sh first.
SRC=${SRC:-runs/s33/M2/final}
OMP_WAIT_POLICY=PASSIVE .venv/bin/dllm train sft --config recipes/tiny-sft.yaml run_dir=runs/s33/M3 \
    export_dir=runs/s33/M3/final model.path=$SRC seed=53 max_steps=4000 num_threads=2 optim.lr=1e-4 \
    optim.warmup_steps=50 prefix_prob=0.7 t_min=0.0 full_mask_prob=0.25 result_mask_prob=0.8 \
    data.tasks.arith=6.0 data.tasks.lists=6.0 data.tasks.gsm=8.0 data.tasks.sudoku=2.0 data.tasks.countdown=16.0 \
    eval_every=1000 save_every=250 mixed_precision=no token_weight_gamma=1.0 progress=false \
    "data.suite_options.lists.ops=[copy, copy, copy, reverse, sort, sort, insert, insert, insert, remove, replace, shuffle, replace_random]" "$@"
