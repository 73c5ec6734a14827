#!/bin/bash
# Session 35: countdown (600 held-out problems) of one training checkpoint. The checkpoint folder holds only
# weights, so config, tokenizer and decoding defaults come from TEMPLATE_DIR (the folder the run started from).
# usage: STRAT=d2f|vanilla eval_checkpoint.sh RUN_DIR STEP TEMPLATE_DIR
cd "$(git rev-parse --show-toplevel)"
if [ $# -ne 3 ] || [ ! -d "$1/checkpoints" ] || [ ! -f "$3/config.json" ]; then
    echo "usage: STRAT=d2f|vanilla $0 RUN_DIR STEP TEMPLATE_DIR (RUN_DIR/checkpoints, TEMPLATE_DIR/config.json)" >&2; exit 2
fi
RUN=$1; STEP=$(printf "%07d" "$2"); T=$3
if [ ! -f "$RUN/checkpoints/step-$STEP/model.safetensors" ]; then
    echo "no checkpoint $RUN/checkpoints/step-$STEP; kept: $(ls $RUN/checkpoints | tr '\n' ' ')" >&2; exit 2
fi
D=${CKPT_DIR:-/tmp}/ck-$(basename $RUN)-$2; mkdir -p $D
for f in config.json generation_config.json tokenizer.json tokenizer_config.json chat_template.jinja; do cp $T/$f $D/ 2>/dev/null; done
cp $RUN/checkpoints/step-$STEP/model.safetensors $D/
OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/countdown_failures.py --model $D --strategy ${STRAT:-d2f} --n 600 --batch-size 50 --threads 1 --json $D/cd-${STRAT:-d2f}.json | grep -E "correct|wrong|unread" | head -6
