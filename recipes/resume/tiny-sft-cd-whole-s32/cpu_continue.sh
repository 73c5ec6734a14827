#!/bin/bash
# Session 32, stage 2 of this folder: continue stage 1 (runs/s32/A: tiny-sft-cd-whole-s31 + 1665
# countdown-only steps on an H200, gpu_drive.py phase A) countdown-only on 2 CPU threads.
# History: started without --resume and with max_steps=7000; stopped by SIGTERM at step 1217 and
# resumed with this command (--resume, max_steps=6000: the cosine re-planned to end at 6000).
# Stage 1 on any device: python -m dllm train sft <gpu_drive.py's a_args("runs/s32/A", 1665)>, that is
#   the command below with model.path=recipes/resume/tiny-sft-cd-whole-s31 seed=46 max_steps=1665
#   num_threads=4 eval_every=1000 and run_dir/export_dir runs/s32/A (its weights are not kept).
cd "$(git rev-parse --show-toplevel)"
OMP_WAIT_POLICY=PASSIVE .venv/bin/dllm train sft --resume --config recipes/tiny-sft.yaml run_dir=runs/s32/A2 \
    export_dir=runs/s32/A2/final model.path=runs/s32/A num_threads=2 optim.lr=3e-4 optim.warmup_steps=50 \
    prefix_prob=0.7 t_min=0.0 full_mask_prob=0.25 result_mask_prob=0.8 data.tasks.arith=0 data.tasks.lists=0 \
    data.tasks.gsm=0 data.tasks.sudoku=0 data.tasks.countdown=12.0 eval_every=1000 eval_examples=64 save_every=250 \
    mixed_precision=no token_weight_gamma=1.0 progress=false seed=49 max_steps=6000
