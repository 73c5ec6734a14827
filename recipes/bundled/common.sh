# Functions shared by the scripts in recipes/bundled/ (sourced, not run).
#
#   DLLM=...          the dllm command (default: dllm, i.e. the active virtual environment's)
#   PRINT_CONFIG=1    print every stage's resolved config (--print-config) and train nothing
#
# A stage whose export (<run_dir>/final/model.safetensors) exists is skipped, so a script can be run
# again after an interruption; delete runs/bundled/<model>/<stage> to run that stage again.

set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
export OMP_WAIT_POLICY=PASSIVE      # busy-waiting OpenMP threads lose ~3x on a shared CPU
DLLM=${DLLM:-dllm}

# dllm_train sft|distill|grpo ARGS...: the training command as recorded (plus --print-config when asked)
dllm_train() {
    if [ -n "${PRINT_CONFIG:-}" ]; then
        echo "##### ${STAGE:-}: dllm train $*"
        $DLLM train "$@" --print-config
    else
        echo "##### $(date '+%F %T') ${STAGE:-}: dllm train $*" >&2
        $DLLM train "$@"
    fi
}

# stage NAME DIR: announce a stage; returns 1 (skip it) when DIR/final already holds its export
stage() {
    STAGE=$1
    if [ -z "${PRINT_CONFIG:-}" ] && [ -f "$2/final/model.safetensors" ]; then
        echo "##### $STAGE: $2/final exists, skipped" >&2
        return 1
    fi
}

# stop_at STEP RUN_DIR dllm_train ARGS...: run a stage that the records show stopped (SIGTERM) at STEP
# and was then resumed with changed overrides. The command must checkpoint at STEP (save_every=STEP;
# checkpoints do not change training). Once RUN_DIR/checkpoints/step-STEP exists the run is sent
# SIGTERM (it checkpoints and exits) and every later checkpoint is removed, so the next --resume
# continues from exactly STEP.
stop_at() {
    local step=$1 run_dir=$2 pid ck d
    shift 3    # STEP RUN_DIR dllm_train
    if [ -n "${PRINT_CONFIG:-}" ]; then dllm_train "$@"; return; fi
    echo "##### $(date '+%F %T') ${STAGE:-}: dllm train $* (stopped at step $step)" >&2
    ck=$(printf '%s/checkpoints/step-%07d' "$run_dir" "$step")
    $DLLM train "$@" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null && [ ! -d "$ck" ]; do sleep 0.1; done
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" || true
    [ -d "$ck" ] || { echo "stop_at: $ck was not written" >&2; return 1; }
    for d in "$run_dir"/checkpoints/step-*; do
        if [ $((10#${d##*step-})) -gt "$step" ]; then rm -rf "$d"; fi
    done
}

# copy_checkpoint FROM_RUN_DIR STEP TO_RUN_DIR: start a resumed stage in its own run dir (as recorded)
copy_checkpoint() {
    [ -n "${PRINT_CONFIG:-}" ] && return 0
    mkdir -p "$3/checkpoints"
    cp -r "$(printf '%s/checkpoints/step-%07d' "$1" "$2")" "$3/checkpoints/"
}
