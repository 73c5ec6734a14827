"""The GRPO config, one section per thing it controls (rollouts, reward, filter, loss, evaluation; as trl's
grpo_config.py), and its validation: everything a recipe can get wrong fails when the config loads,
before any model does."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from dllm.decoding.registry import STRATEGIES, unread_options_error
from dllm.validation import Range

from .config import ConfigError, LoraSection, OptimSection, TrainConfig, load_config, num, validate
from .rewards import load_reward_function
from .rl_objectives import ACC_NORMS, ADV_NORMS, ESTIMATORS, REDUCTIONS, TPF_NORMS

# decoders whose every forward sees exactly "prompt + tokens committed so far + masks" (cache="none"),
# or D2F, SDAR and Fast-dLLM v2 (cache "none") whose block caches are exact: the trajectory estimator
# replays them exactly


@dataclass
class RolloutSection:
    group_size: int = num(8, ge=2)  # G rollouts per prompt
    prompts_per_step: int = num(8, ge=1)  # groups wanted per RL step (per process; shard_global_batch: its share)
    max_refill_rounds: int = num(2, ge=0)  # extra rollout rounds with fresh prompts when the filter leaves the batch short
    strategy: str = "threshold"  # threshold (Fast-dLLM, any model) | d2f (block-causal) | vanilla | factor ...
    temperature: float = num(1.0, ge=0)
    threshold: float = num(0.9, ge=0, le=1)  # the strategy's confidence threshold (threshold: `threshold`; d2f: `skip_threshold`)
    block_length: int | None = num(None, ge=1)  # None: the model's block size (block-causal) or its generation default
    cache: str = "none"  # semi-AR cache; the trajectory estimator is exact only with "none"
    exact_canvas: bool = True  # decode with stop_at_eos=False: post-EOS tokens kept for exact replay
    batch_size: int = num(64, ge=1)  # rows per generate call
    options: dict = field(default_factory=dict)  # any other DiffusionGenerationConfig field


@dataclass
class RewardSection:
    # your reward functions, "module:function" or "path/to/file.py:function" (dllm.training.rewards for the
    # signature): their weighted sum replaces the verifier / exact-match score as the task reward
    functions: list = field(default_factory=list)
    function_weights: list = field(default_factory=list)  # one per function; empty: 1.0 each
    # with reward functions: a rollout whose weighted reward is at least this counts as correct (for
    # filter.require_correct, loss.nll_on=correct and the accuracy metric); the midpoint of a 0/1
    # correctness reward, so a small shaping term beside it (a length penalty) does not undo a right answer
    correct_threshold: float = num(0.5)  # any finite number
    accuracy: str = "correct"  # correct: the verifier's strict flag (0/1) | score: its graded reward in [0, 1]
    accuracy_norm: str = "pm1"  # pm1: 2a-1 unnormalised (paper) | z_score: in-group (released code) | none
    tpf_norm: str = "z_score"  # z_score (paper/code) | minmax | none
    accuracy_weight: float = num(1.0, ge=0)
    tpf_weight: float = num(1.0, ge=0)  # 0: plain accuracy GRPO (no speed objective)
    decoupled: bool = True  # False: z-score the weighted sum instead (the "w/o decoupled norm" ablation)
    advantage_norm: str = "batch"  # batch (paper Eq. 7) | group | none
    truncated_is_wrong: bool = True  # no EOS in the canvas -> incorrect (the code forces L >= max-5 wrong)


@dataclass
class FilterSection:
    enabled: bool = True  # False: train on every group (the "w/o TPF filter" ablation)
    require_correct: bool = True  # drop groups without a correct rollout
    tpf_range: float = num(0.01, ge=0)  # delta: drop groups whose TPF range max-min < delta (0: no range test)


@dataclass
class LossSection:
    estimator: str = "trajectory"  # trajectory (exact replay) | block_masked (released code) | d1
    block_size: int | None = num(None, ge=1)  # block_masked blocks; None: the rollout block length
    d1_prompt_mask: float = num(0.15, ge=0, lt=1)  # d1: probability of masking each prompt token
    clip_low: float = num(0.2, ge=0, lt=1)  # the ratio's floor 1 - clip_low stays > 0
    clip_high: float = num(0.2, ge=0)
    ratio_clamp: float = num(10.0, gt=0)  # log-ratio clamp before exp (reference)
    beta: float = num(0.01, ge=0)  # k3 KL to the frozen initial model (0: no reference model at all)
    mu: float = num(0.1, ge=0)  # NLL on verifier-correct rollouts (0: off)
    nll_on: str = "correct"  # correct (verifier flag, paper) | nonneg_reward (released code: reward >= 0)
    pg_reduction: str = "sequence"
    kl_reduction: str = "token"
    nll_reduction: str = "token"
    ppo_epochs: int = num(1, ge=1)  # passes over each RL step's kept rollouts
    minibatches: int = num(1, ge=1)  # optimizer steps per pass (1 x 1: on-policy, old log-probs = current)
    ref_offload: bool = False  # keep the reference model on the CPU between uses (large models)


@dataclass
class EvalSection:
    strategies: list = field(default_factory=lambda: ["threshold"])  # greedy held-out eval per strategy
    at_start: bool = True  # also evaluate before the first update (the "before" point of the curve)
    batch_size: int = num(64, ge=1)
    # confidence threshold of the greedy eval (None: the rollout's). Rollouts may explore at a lower
    # threshold than the decoder is judged at (recipes/grpo-tiny.yaml: 0.7 rollouts, 0.9 eval).
    threshold: float | None = num(None, gt=0, le=1)


@dataclass
class GRPOConfig(TrainConfig):
    """TPF-aware GRPO. ``max_steps`` = RL steps; ``batch_size`` = canvases (views) per forward/backward
    micro-batch; ``data.tasks`` = prompt suites; ``data.max_new_tokens`` = rollout canvas length."""

    # what validate() says when no model is named (GRPO needs a trained one: model.config is no answer)
    no_model: ClassVar[str] = "GRPO starts from a trained model: set model.path (e.g. tiny-d2f or a checkpoint directory)"
    run_dir: str = "runs/grpo"
    max_steps: int = num(100, ge=1)
    batch_size: int = num(64, ge=1)
    grad_accum: int = num(1, ge=1, le=1)  # each optimizer step accumulates over all its micro-batches already
    log_every: int = num(1, ge=1)
    save_every: int = num(25, ge=0)
    eval_every: int = num(0, ge=0)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    reward: RewardSection = field(default_factory=RewardSection)
    filter: FilterSection = field(default_factory=FilterSection)
    loss: LossSection = field(default_factory=LossSection)
    lora: LoraSection = field(default_factory=lambda: LoraSection(dropout=0.0))
    evaluation: EvalSection = field(default_factory=EvalSection)
    optim: OptimSection = field(default_factory=lambda: OptimSection(
        lr=1e-6, weight_decay=0.0, betas=[0.9, 0.999], schedule="constant", warmup_steps=10))


def validate_grpo(cfg: GRPOConfig, has_dataset: bool = False, python_functions: int = 0) -> list:
    """ConfigError when the config cannot run; returns the reward functions ``reward.functions`` names
    (imported now, so a wrong path fails before any model loads). ``python_functions``: how many
    reward functions the trainer was given in Python (they replace ``reward.functions``)."""
    functions = [] if python_functions else [load_reward_function(p) for p in cfg.reward.functions]
    n_functions = python_functions or len(functions)

    def bad(msg):
        raise ConfigError(msg)

    if not cfg.model.path:  # before validate(), whose message offers model.config: GRPO needs a trained model
        bad(cfg.no_model)
    if cfg.grad_accum != 1:  # before validate(), whose range message would not say why
        bad("grad_accum is not used by GRPO (each optimizer step accumulates over all its micro-batches); "
            "set loss.minibatches / batch_size instead")
    # without reward functions every prompt needs a reference answer to be scored against
    validate(cfg, has_dataset=has_dataset, require_answers=n_functions == 0)

    r, w, lo = cfg.rollout, cfg.reward, cfg.loss
    if w.function_weights and len(w.function_weights) != n_functions:
        bad(f"reward.function_weights has {len(w.function_weights)} weights for {n_functions} reward functions; "
            "give one per function (or none: 1.0 each)")
    for i, x in enumerate(w.function_weights):
        if (err := Range().error(f"reward.function_weights[{i}]", x)) is not None:
            bad(err)
    choices = [("reward.accuracy", w.accuracy, ("correct", "score")), ("reward.accuracy_norm", w.accuracy_norm, ACC_NORMS),
               ("reward.tpf_norm", w.tpf_norm, TPF_NORMS), ("reward.advantage_norm", w.advantage_norm, ADV_NORMS),
               ("loss.estimator", lo.estimator, ESTIMATORS), ("loss.nll_on", lo.nll_on, ("correct", "nonneg_reward")),
               ("loss.pg_reduction", lo.pg_reduction, REDUCTIONS), ("loss.kl_reduction", lo.kl_reduction, REDUCTIONS),
               ("loss.nll_reduction", lo.nll_reduction, REDUCTIONS)]
    for key, value, valid in choices:
        if value not in valid:
            bad(f"{key}={value!r}; valid: {', '.join(valid)}")
    if cfg.shard_global_batch:
        rows = r.prompts_per_step * r.group_size
        if cfg.filter.enabled and r.max_refill_rounds > 0:
            bad("shard_global_batch=true: GRPO does not refill filtered groups of a global batch (each process "
                "would draw its own fresh prompts); set rollout.max_refill_rounds=0 (or filter.enabled=false)")
        if lo.estimator == "d1":
            bad("shard_global_batch=true: the d1 estimator draws its prompt masks per process; use "
                "loss.estimator=trajectory or block_masked")
        if rows % r.batch_size:
            bad(f"shard_global_batch=true: each process generates whole chunks of rollout.batch_size rows of the global "
                f"batch, and its {rows} rollouts (rollout.prompts_per_step x rollout.group_size) are not a multiple of "
                f"rollout.batch_size={r.batch_size}; set rollout.batch_size to a divisor of {rows}")
    if r.strategy in STRATEGIES and isinstance(r.options, dict) and (
            unread := unread_options_error(r.strategy, r.options)) is not None:
        bad(f"rollout.options: {unread}")
    replayable = [s.name for s in STRATEGIES.values() if s.exact_replay]
    if lo.estimator == "trajectory" and r.strategy in STRATEGIES and r.strategy not in replayable:
        bad(f"loss.estimator=trajectory replays the decoding steps of {', '.join(sorted(replayable))}; "
            f"rollout.strategy={r.strategy!r} is not one of them (use block_masked or d1)")
    return functions


def load_grpo_config(path=None, overrides=()) -> GRPOConfig:
    cfg = load_config(GRPOConfig, path, overrides)
    validate_grpo(cfg)
    return cfg
