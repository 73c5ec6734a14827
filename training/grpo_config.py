"""The GRPO config, one section per thing it controls (rollouts, reward, filter, loss, evaluation; as trl's
grpo_config.py), and its validation: everything a recipe can get wrong fails when the config loads,
before any model does."""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import ConfigError, LoraSection, OptimSection, TrainConfig, load_config, validate
from .rewards import load_reward_function
from .rl_objectives import ACC_NORMS, ADV_NORMS, ESTIMATORS, REDUCTIONS, TPF_NORMS

# decoders whose every forward sees exactly "prompt + tokens committed so far + masks" (cache="none"),
# or D2F whose block cache is exact: the trajectory estimator replays them exactly
EXACT_REPLAY = {"threshold", "vanilla", "factor", "entropy", "margin", "maskgit_plus", "d2f"}


@dataclass
class RolloutSection:
    group_size: int = 8  # G rollouts per prompt
    prompts_per_step: int = 8  # groups wanted per RL step (per process)
    max_refill_rounds: int = 2  # extra rollout rounds with fresh prompts when the filter leaves the batch short
    strategy: str = "threshold"  # threshold (Fast-dLLM, any model) | d2f (block-causal) | vanilla | factor ...
    temperature: float = 1.0
    threshold: float = 0.9  # the strategy's confidence threshold (threshold: `threshold`; d2f: `skip_threshold`)
    block_length: int | None = None  # None: the model's block size (block-causal) or its generation default
    cache: str = "none"  # semi-AR cache; the trajectory estimator is exact only with "none"
    exact_canvas: bool = True  # decode with stop_at_eos=False: post-EOS tokens kept for exact replay
    batch_size: int = 64  # rows per generate call
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
    correct_threshold: float = 0.5
    accuracy: str = "correct"  # correct: the verifier's strict flag (0/1) | score: its graded reward in [0, 1]
    accuracy_norm: str = "pm1"  # pm1: 2a-1 unnormalised (paper) | z_score: in-group (released code) | none
    tpf_norm: str = "z_score"  # z_score (paper/code) | minmax | none
    accuracy_weight: float = 1.0
    tpf_weight: float = 1.0  # 0: plain accuracy GRPO (no speed objective)
    decoupled: bool = True  # False: z-score the weighted sum instead (the "w/o decoupled norm" ablation)
    advantage_norm: str = "batch"  # batch (paper Eq. 7) | group | none
    truncated_is_wrong: bool = True  # no EOS in the canvas -> incorrect (the code forces L >= max-5 wrong)


@dataclass
class FilterSection:
    enabled: bool = True  # False: train on every group (the "w/o TPF filter" ablation)
    require_correct: bool = True  # drop groups without a correct rollout
    tpf_range: float = 0.01  # delta: drop groups whose TPF range max-min < delta (0: no range test)


@dataclass
class LossSection:
    estimator: str = "trajectory"  # trajectory (exact replay) | block_masked (released code) | d1
    block_size: int | None = None  # block_masked blocks; None: the rollout block length
    d1_prompt_mask: float = 0.15  # d1: probability of masking each prompt token
    clip_low: float = 0.2
    clip_high: float = 0.2
    ratio_clamp: float = 10.0  # log-ratio clamp before exp (reference)
    beta: float = 0.01  # k3 KL to the frozen initial model (0: no reference model at all)
    mu: float = 0.1  # NLL on verifier-correct rollouts (0: off)
    nll_on: str = "correct"  # correct (verifier flag, paper) | nonneg_reward (released code: reward >= 0)
    pg_reduction: str = "sequence"
    kl_reduction: str = "token"
    nll_reduction: str = "token"
    ppo_epochs: int = 1  # passes over each RL step's kept rollouts
    minibatches: int = 1  # optimizer steps per pass (1 x 1: on-policy, old log-probs = current)
    ref_offload: bool = False  # keep the reference model on the CPU between uses (large models)


@dataclass
class EvalSection:
    strategies: list = field(default_factory=lambda: ["threshold"])  # greedy held-out eval per strategy
    at_start: bool = True  # also evaluate before the first update (the "before" point of the curve)
    batch_size: int = 64
    # confidence threshold of the greedy eval (None: the rollout's). Rollouts may explore at a lower
    # threshold than the decoder is judged at (recipes/grpo-tiny.yaml: 0.7 rollouts, 0.9 eval).
    threshold: float | None = None


@dataclass
class GRPOConfig(TrainConfig):
    """TPF-aware GRPO. ``max_steps`` = RL steps; ``batch_size`` = canvases (views) per forward/backward
    micro-batch; ``data.tasks`` = prompt suites; ``data.max_new_tokens`` = rollout canvas length."""

    run_dir: str = "runs/grpo"
    max_steps: int = 100
    batch_size: int = 64
    log_every: int = 1
    save_every: int = 25
    eval_every: int = 0
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
    # without reward functions every prompt needs a reference answer to be scored against
    validate(cfg, has_dataset=has_dataset, require_answers=n_functions == 0)

    def bad(msg):
        raise ConfigError(msg)

    r, w, f, lo = cfg.rollout, cfg.reward, cfg.filter, cfg.loss
    if w.function_weights and len(w.function_weights) != n_functions:
        bad(f"reward.function_weights has {len(w.function_weights)} weights for {n_functions} reward functions; "
            "give one per function (or none: 1.0 each)")
    for x in w.function_weights:
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            bad(f"reward.function_weights must be numbers; got {x!r}")
    if not cfg.model.path:
        bad("GRPO starts from a trained model: set model.path (e.g. tiny-d2f or a checkpoint directory)")
    if r.group_size < 2:
        bad("rollout.group_size must be >= 2 (group-relative advantages)")
    if r.prompts_per_step < 1 or r.max_refill_rounds < 0 or r.batch_size < 1:
        bad("need rollout.prompts_per_step >= 1, rollout.max_refill_rounds >= 0, rollout.batch_size >= 1")
    if r.temperature < 0:
        bad("rollout.temperature must be >= 0")
    if cfg.grad_accum != 1:
        bad("grad_accum is not used by GRPO (each optimizer step accumulates over all its micro-batches); "
            "set loss.minibatches / batch_size instead")
    choices = [("reward.accuracy", w.accuracy, ("correct", "score")), ("reward.accuracy_norm", w.accuracy_norm, ACC_NORMS),
               ("reward.tpf_norm", w.tpf_norm, TPF_NORMS), ("reward.advantage_norm", w.advantage_norm, ADV_NORMS),
               ("loss.estimator", lo.estimator, ESTIMATORS), ("loss.nll_on", lo.nll_on, ("correct", "nonneg_reward")),
               ("loss.pg_reduction", lo.pg_reduction, REDUCTIONS), ("loss.kl_reduction", lo.kl_reduction, REDUCTIONS),
               ("loss.nll_reduction", lo.nll_reduction, REDUCTIONS)]
    for key, value, valid in choices:
        if value not in valid:
            bad(f"{key}={value!r}; valid: {', '.join(valid)}")
    if lo.estimator == "trajectory" and r.strategy not in EXACT_REPLAY:
        bad(f"loss.estimator=trajectory replays the decoding steps of {', '.join(sorted(EXACT_REPLAY))}; "
            f"rollout.strategy={r.strategy!r} is not one of them (use block_masked or d1)")
    if lo.ppo_epochs < 1 or lo.minibatches < 1:
        bad("loss.ppo_epochs and loss.minibatches must be >= 1")
    if lo.beta < 0 or lo.mu < 0 or f.tpf_range < 0:
        bad("loss.beta, loss.mu and filter.tpf_range must be >= 0")
    if not 0 <= lo.d1_prompt_mask < 1:
        bad("loss.d1_prompt_mask must be in [0, 1)")
    if cfg.evaluation.threshold is not None and not 0 < cfg.evaluation.threshold <= 1:
        bad(f"evaluation.threshold={cfg.evaluation.threshold} must be in (0, 1] (or null: the rollout's)")
    return functions


def load_grpo_config(path=None, overrides=()) -> GRPOConfig:
    cfg = load_config(GRPOConfig, path, overrides)
    validate_grpo(cfg)
    return cfg
