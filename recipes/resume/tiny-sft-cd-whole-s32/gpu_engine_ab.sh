#!/bin/bash
# Session 32: the training loop as committed ("old") against commit 7c9e694's variant that reads the
# loss back once per step ("new"), same config, one after the other on one machine (run on an H200
# with N=60: old 29.1k, new 25.3k tokens/s; the variant was reverted). Run from the repository root;
# first: git show 7c9e694:training/engine.py > runs/engine_once_per_step.py
PY=${PY:-python3}; OUT=${OUT:-runs/engine_ab}; N=${N:-60}; VARIANT=${VARIANT:-runs/engine_once_per_step.py}
mkdir -p $OUT; ROOT=$(pwd)
rm -rf /tmp/variant && mkdir -p /tmp/variant && cp -r dllm training eval decoding serving /tmp/variant/ \
  && cp $VARIANT /tmp/variant/training/engine.py
ARGS=(--config $ROOT/recipes/tiny-sft.yaml num_threads=4 mixed_precision=no progress=false save_every=0 eval_every=0
  log_every=20 data.tasks.arith=0 data.tasks.lists=0 data.tasks.gsm=0 data.tasks.sudoku=0 data.tasks.countdown=12.0
  model.path=$ROOT/recipes/resume/tiny-sft-cd-whole-s31 seed=99 max_steps=$N)
for v in old new; do
  d=$ROOT; [ $v = new ] && d=/tmp/variant
  (cd $d && $PY -m dllm train sft "${ARGS[@]}" run_dir=/tmp/ab-$v export_dir=/tmp/ab-$v/final > $OUT/ab-$v.log 2>&1)
  # mean tokens_per_s over the log windows after the first (which holds start-up)
  echo "$v: $(tail -n +3 /tmp/ab-$v/metrics.csv | awk -F, '{s+=$5; n++} END {printf "%.0f tok/s", s/n}')" | tee -a $OUT/ab.txt
done
