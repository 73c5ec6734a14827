#!/bin/bash
# Session 34: the bundled tiny-d2f moved to the whole-tag tokenizer and distilled from M3, 1 thread.
cd "$(git rev-parse --show-toplevel)"
T=${TEACHER:-recipes/resume/tiny-sft-cd-whole-mix3-s33}
OMP_WAIT_POLICY=PASSIVE .venv/bin/dllm train distill --config recipes/tiny-d2f.yaml teacher=$T model.path=tiny-d2f \
    model.tokenizer=$T model.tag_head=unk run_dir=runs/s34/S1 export_dir=runs/s34/S1/final max_steps=${STEPS:-5000} \
    optim.lr=1.5e-4 optim.warmup_steps=50 data.tasks.lists=4.0 data.tasks.gsm=8.0 data.tasks.sudoku=3.0 \
    data.tasks.countdown=32.0 save_every=250 mixed_precision=no num_threads=1 seed=55 progress=false \
    "data.suite_options.lists.ops=[copy, reverse, sort, insert, remove, replace, shuffle, shuffle, shuffle, replace_random, replace_random, replace_random, replace_random, replace_random, replace_random, replace_random, replace_random]" "$@"
