"""Training configs: nested dataclasses, loaded from YAML recipes plus ``key=value`` overrides.

Values are coerced to the declared field types (YAML reads ``1e-3`` as a string; a CLI override
is always a string), and an unknown key fails with the list of valid dotted keys.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SUITE_WEIGHTS = {"arith": 1.0, "gsm": 1.0, "lists": 1.0, "sudoku": 1.0, "countdown": 1.0}


class ConfigError(ValueError):
    """A recipe or override names an unknown key or a value of the wrong type."""


TAG_HEADS = ("origin", "unk")  # where a new tag's head row starts: its empty digit's row, or the UNK token's


@dataclass
class ModelSection:
    path: str | None = None  # checkpoint dir or bundled name to start from; None: from scratch
    # a checkpoint to grow into the model built from ``config`` (more layers and/or a wider MLP,
    # other widths equal): see training.models.grow_depth; exclusive with ``path``
    grow_from: str | None = None
    config: dict = field(default_factory=dict)  # LLaDAConfig kwargs when training from scratch
    tokenizer: str | None = None  # tokenizer dir; None: the checkpoint's, or built from the task suites
    # when the tokenizer is built from the suites: left-pad numbers to this many digits (0: off; dllm.tokenization)
    pad_numbers: int = 0
    # ... or make every number of up to this many digits one token (0: off; exclusive with pad_numbers)
    number_tokens: int = 0
    # with pad_numbers: each padded number also gets a whole-number tag token before its digits
    number_tags: bool = False
    # where the tag goes: "insert" (before the padded digits) or "replace" (in place of the first empty
    # digit: same sequence length as plain padding; the way to add tags to a padded-digit checkpoint)
    number_tag_style: str = "insert"
    # tag only numbers of up to this many digits (0: every padded number)
    number_tag_digits: int = 0
    # tag only numbers that this regex matches right after ("": every padded number; "countdown": the
    # numbers of countdown prompts, dllm.tokenization.COUNTDOWN_PROMPT_CONTEXT)
    number_tag_context: str = ""
    # model.path + model.tokenizer with new tags: their head rows start from the empty digit's ("origin")
    # or from the UNK token's ("unk": for tags no answer contains; training.models.remap_vocabulary)
    tag_head: str = "origin"
    attention_policy: str | None = None  # override the checkpoint's (block-diffusion SFT: block_causal)
    block_size: int | None = None
    gradient_checkpointing: bool = False
    dtype: str = "float32"  # weights as loaded; 7-8B recipes load bfloat16 (DeepSpeed keeps fp32 masters)


@dataclass
class DataSection:
    # suite -> sampling weight. None (unset): every suite at weight 1, or none when the trainer gets a
    # train_dataset in Python (the dataset alone, as in trl); recipes and the CLI always resolve it
    tasks: dict | None = None
    max_new_tokens: int = 48  # generation length: answers + EOS are padded with EOS up to it
    # fixed: always pad to max_new_tokens (LLaDA SFT). random: per batch, pad to a length between the
    # longest answer and max_new_tokens, skewed short by eos_pad_power (cheaper, and teaches every
    # canvas length a sampler may use).
    eos_pad: str = "fixed"
    eos_pad_power: float = 3.0
    mix: str = "per_batch"  # per_batch: one suite per micro-batch (short padding); per_example: mixed
    chunk_size: int = 2048  # examples generated per suite at a time (deterministic in seed and chunk)
    # suite -> constructor options for the training stream only (evaluation always uses the full
    # suite), e.g. {lists: {ops: [copy, replace_random, replace_random]}}: an op named twice is drawn
    # twice as often.
    suite_options: dict = field(default_factory=dict)
    # your own JSON Lines files, path -> sampling weight, mixed with data.tasks (training.files for the
    # two accepted forms); set data.tasks to {} to train on the files alone. GRPO reads their prompts and
    # scores completions by exact match against the file's answers, or with reward.functions
    files: dict = field(default_factory=dict)
    # sampling weight of the examples given to the trainer in Python (train_dataset=), against the above
    dataset_weight: float = 1.0


@dataclass
class OptimSection:
    lr: float = 1e-4
    weight_decay: float = 0.1
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping
    schedule: str = "cosine"  # cosine | constant (both after a linear warm-up)
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr


@dataclass
class TrainConfig:
    """Fields every trainer shares (the engine reads only these)."""

    run_dir: str = "runs/run"
    seed: int = 0
    max_steps: int = 1000  # optimizer steps
    batch_size: int = 32  # examples per micro-batch per process
    grad_accum: int = 1
    mixed_precision: str = "no"  # no | bf16 | fp16
    num_threads: int | None = None  # torch.set_num_threads on CPU; None leaves torch's default
    log_every: int = 10
    save_every: int = 500  # checkpoint every N optimizer steps (0: only at the end and on a signal)
    keep_checkpoints: int = 2
    eval_every: int = 0  # quick greedy accuracy on test examples every N steps (0: off)
    eval_examples: int = 32  # per suite
    export_dir: str | None = None  # final model dir; default <run_dir>/final
    resume: bool = False
    progress: bool = True
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)

    def __post_init__(self) -> None:
        # Python habit: SFTConfig(model={"path": "tiny"}, optim={"lr": 3e-4}) fills a section from a dict,
        # on top of that config's own section defaults (DistillConfig's optim differs from SFTConfig's)
        defaults = {f.name: f for f in dataclasses.fields(self)}
        for name, t in _hints(type(self)).items():
            value = getattr(self, name, None)
            if dataclasses.is_dataclass(t) and isinstance(value, dict):
                f = defaults[name]
                section = f.default_factory() if f.default_factory is not dataclasses.MISSING else t()
                setattr(self, name, section)
                for k, v in value.items():
                    _set(section, [k], v, type(self), f"{name}.{k}")


@dataclass
class SFTConfig(TrainConfig):
    """LLaDA SFT: t ~ U(0,1), p = (1 - mask_eps) t + mask_eps, answer tokens masked i.i.d. with p."""

    run_dir: str = "runs/sft"
    mask_eps: float = 1e-3
    full_mask_prob: float = 0.0  # extra, not LLaDA: fraction of rows with the whole answer masked (p = 1)
    t_min: float = 0.0  # extra, not LLaDA: t ~ U(t_min, 1)
    prefix_prob: float = 0.0  # extra, not LLaDA: fraction of rows whose answer is revealed up to a random cut
    # extra, not LLaDA: fraction of rows (of those with results) where only the number runs after a
    # trigger token are masked: the step results and final answer of a worked solution
    result_mask_prob: float = 0.0
    result_triggers: list[str] = field(default_factory=lambda: ["=", "#"])
    # extra, not LLaDA: weight each masked token by (1 - p_target)^gamma, renormalised (MGDM-style)
    token_weight_gamma: float = 0.0


@dataclass
class LoraSection:
    enabled: bool = False
    r: int = 32
    alpha: int = 32
    dropout: float = 0.1
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "attn_out"])


@dataclass
class DistillConfig(TrainConfig):
    """D2F asymmetric distillation: block-causal student <- bidirectional frozen teacher."""

    run_dir: str = "runs/distill"
    teacher: str | None = None  # teacher checkpoint; None: the student's base with the adapter disabled
    block_size: int = 16  # student block size (D2F trains with 16)
    pmask_low: float = 0.2  # first block's mask ratio ~ U[pmask_low, pmask_high)
    pmask_high: float = 0.7  # ratios rise monotonically up to this
    hard_label_weight: float = 0.0  # optional extra CE to the ground truth (D2F: 0, self-alignment only)
    lora: LoraSection = field(default_factory=LoraSection)
    optim: OptimSection = field(default_factory=lambda: OptimSection(
        lr=1e-5, weight_decay=0.05, schedule="constant", warmup_steps=0))


# --------------------------------------------------------------------------------------------
# loading and overrides


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def valid_keys(cls, prefix: str = "") -> list[str]:
    """Every dotted key of a config class (dict fields accept any sub-key)."""
    keys = []
    for f in dataclasses.fields(cls):
        t = _hints(cls)[f.name]
        if dataclasses.is_dataclass(t):
            keys += valid_keys(t, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}" + (".*" if _origin(_strip_optional(t)[0]) is dict else ""))
    return keys


def _origin(t):
    o = typing.get_origin(t)
    return t if o is None and t in (dict, list) else o


def _strip_optional(t):
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        return args[0] if len(args) == 1 else t, True
    return t, False


def coerce(value: Any, t: Any, key: str) -> Any:
    """``value`` (from YAML or a string override) as type ``t``; ConfigError naming ``key`` otherwise."""
    t, optional = _strip_optional(t)
    # checked before the str case too: ``model.path=null`` must unset a recipe's path, not name "null"
    if optional and isinstance(value, str) and value.strip().lower() in ("none", "null", "~", ""):
        return None
    if isinstance(value, str) and t is not str:
        low = value.strip().lower()
        value = yaml.safe_load(value) if low not in ("none", "null") else None
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{key} may not be null")
    try:
        if t is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "yes", "1", "on", "false", "no", "0", "off"):
                return value.lower() in ("true", "yes", "1", "on")
            if value in (0, 1):
                return bool(value)
            raise ValueError
        if t is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if t is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if t is str:
            return str(value)
        if _origin(t) is list:
            return list(value) if isinstance(value, (list, tuple)) else [value]
        if _origin(t) is dict:
            if not isinstance(value, dict):
                raise ValueError
            return dict(value)
    except (TypeError, ValueError):
        name = getattr(t, "__name__", str(t))
        raise ConfigError(f"{key}={value!r} is not a valid {name}") from None
    return value


def _set(cfg, parts: list[str], value: Any, root_cls, full_key: str) -> None:
    name, rest = parts[0], parts[1:]
    hints = _hints(type(cfg))
    if name not in hints or name not in {f.name for f in dataclasses.fields(cfg)}:
        raise ConfigError(
            f"unknown config key {full_key!r} for {root_cls.__name__}; valid keys: "
            + ", ".join(valid_keys(root_cls))
        )
    t = hints[name]
    if dataclasses.is_dataclass(t):
        if not rest:
            if not isinstance(value, dict):
                raise ConfigError(f"{full_key} is a section; give its keys ({full_key}.<key>=...)")
            for k, v in value.items():
                _set(getattr(cfg, name), [k], v, root_cls, f"{full_key}.{k}")
            return
        _set(getattr(cfg, name), rest, value, root_cls, full_key)
        return
    if rest:
        if _origin(_strip_optional(t)[0]) is not dict:
            raise ConfigError(
                f"unknown config key {full_key!r} for {root_cls.__name__}; valid keys: "
                + ", ".join(valid_keys(root_cls))
            )
        d = dict(getattr(cfg, name) or {})
        sub = d
        for p in rest[:-1]:
            sub = sub.setdefault(p, {})
        sub[rest[-1]] = yaml.safe_load(value) if isinstance(value, str) else value
        setattr(cfg, name, d)
        return
    setattr(cfg, name, coerce(value, t, full_key))


def apply_mapping(cfg, mapping: dict, prefix: str = "") -> None:
    for k, v in mapping.items():
        _set(cfg, [k], v, type(cfg), f"{prefix}{k}")


def parse_override(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not key=value (e.g. optim.lr=3e-4)")
    key, value = text.split("=", 1)
    key = key.strip().lstrip("-")
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    return key, value


def load_config(cls, path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()):
    """``cls()`` updated by the YAML recipe at ``path`` and then by ``key=value`` overrides."""
    cfg = cls()
    # a recipe run has no train_dataset: the unset suite mix is every suite, before the recipe and the
    # overrides change it (so data.tasks.gsm=3 changes one weight of the five)
    resolve_tasks(cfg, has_dataset=False)
    if path is not None:
        path = Path(path)
        if not path.exists():
            raise ConfigError(f"recipe {path} does not exist")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {path} must be a mapping of config keys")
        apply_mapping(cfg, data)
    for item in overrides:
        key, value = parse_override(item)
        _set(cfg, key.split("."), value, cls, key)
    validate(cfg)
    return cfg


def resolve_tasks(cfg: TrainConfig, has_dataset: bool) -> None:
    """Give an unset ``data.tasks`` its value: every suite at weight 1, or none beside a train_dataset."""
    if cfg.data.tasks is None:
        cfg.data.tasks = {} if has_dataset else dict(SUITE_WEIGHTS)


def validate(cfg: TrainConfig, has_dataset: bool = False, require_answers: bool = True) -> None:
    """ConfigError when the config cannot run. ``has_dataset``: the trainer was given a train_dataset
    (a source of its own); ``require_answers=False`` lets data files hold prompts alone (GRPO with
    reward functions)."""

    def bad(msg):
        raise ConfigError(msg)

    if cfg.data.tasks is None:
        resolve_tasks(cfg, has_dataset)

    if cfg.max_steps < 1:
        bad("max_steps must be >= 1")
    if cfg.batch_size < 1 or cfg.grad_accum < 1:
        bad("batch_size and grad_accum must be >= 1")
    if cfg.mixed_precision not in ("no", "bf16", "fp16"):
        bad(f"mixed_precision={cfg.mixed_precision!r}; valid: no, bf16, fp16")
    if cfg.optim.schedule not in ("cosine", "constant"):
        bad(f"optim.schedule={cfg.optim.schedule!r}; valid: cosine, constant")
    if cfg.data.eos_pad not in ("fixed", "random"):
        bad(f"data.eos_pad={cfg.data.eos_pad!r}; valid: fixed, random")
    if cfg.data.mix not in ("per_batch", "per_example"):
        bad(f"data.mix={cfg.data.mix!r}; valid: per_batch, per_example")
    from dllm.eval.tasks import suite_names

    if unknown := sorted(set(cfg.data.tasks) - set(suite_names())):
        bad(f"data.tasks names unknown suites {unknown}; valid suites: {', '.join(suite_names())}")
    weights = {**cfg.data.tasks, **cfg.data.files}
    if bad_weights := [k for k, w in weights.items() if not _is_weight(w)]:
        bad(f"data.tasks / data.files weights must be numbers >= 0; check {bad_weights}")
    if has_dataset:
        if not _is_weight(cfg.data.dataset_weight):
            bad(f"data.dataset_weight={cfg.data.dataset_weight!r} must be a number >= 0")
        weights["train_dataset"] = cfg.data.dataset_weight
    if sum(float(w) for w in weights.values()) <= 0:
        bad("data.tasks, data.files" + (" and data.dataset_weight" if has_dataset else "")
            + " need at least one source with a positive weight")
    from dllm.eval.tasks.jsonl import DataFileError, read_records

    for path, w in cfg.data.files.items():
        try:  # every line now, not after a large model has loaded
            if float(w) > 0:
                read_records(path, require_answers)
        except DataFileError as err:
            bad(f"data.files: {err} (JSON Lines, one example per line; docs/training.md, \"Your own data\")")
    if cfg.data.suite_options and (err := suite_options_error(cfg.data)):
        bad(err)
    if cfg.model.pad_numbers and cfg.model.pad_numbers < 2:
        bad(f"model.pad_numbers={cfg.model.pad_numbers} must be 0 (off) or >= 2")
    from dllm.tokenization import MAX_NUMBER_TOKEN_DIGITS, TAG_STYLES, tag_context_error

    if cfg.model.number_tokens and not 2 <= cfg.model.number_tokens <= MAX_NUMBER_TOKEN_DIGITS:
        bad(f"model.number_tokens={cfg.model.number_tokens} must be 0 (off) or in [2, {MAX_NUMBER_TOKEN_DIGITS}]")
    if cfg.model.pad_numbers and cfg.model.number_tokens:
        bad("model.pad_numbers and model.number_tokens exclude each other (digits padded to a width, or whole "
            "numbers as tokens); set one of them to 0 (recipes/tiny-sft.yaml sets pad_numbers: 4)")
    if cfg.model.number_tags and not cfg.model.pad_numbers:
        bad("model.number_tags tags padded numbers: it needs model.pad_numbers (e.g. 4)")
    if cfg.model.number_tag_style not in TAG_STYLES:
        bad(f"model.number_tag_style={cfg.model.number_tag_style!r}; valid: {', '.join(TAG_STYLES)}")
    if cfg.model.number_tag_digits and not 1 <= cfg.model.number_tag_digits < max(2, cfg.model.pad_numbers):
        bad(f"model.number_tag_digits={cfg.model.number_tag_digits} must be 0 (every padded number) or in "
            "[1, model.pad_numbers - 1]")
    if cfg.model.number_tag_context and not cfg.model.number_tags:
        bad("model.number_tag_context limits which numbers get tags: it needs model.number_tags=true")
    if cfg.model.number_tag_context and (err := tag_context_error(cfg.model.number_tag_context)):
        bad(f"model.{err}")
    if cfg.model.tag_head not in TAG_HEADS:
        bad(f"model.tag_head={cfg.model.tag_head!r}; valid: {', '.join(TAG_HEADS)}")
    if cfg.model.path and cfg.model.grow_from:
        bad(f"model.path ({cfg.model.path}) and model.grow_from ({cfg.model.grow_from}) are exclusive: grow_from "
            "builds model.config and copies the checkpoint's layers into it (add model.path=null to a recipe that "
            "sets a path)")
    if isinstance(cfg, SFTConfig):
        for key in ("full_mask_prob", "t_min", "prefix_prob", "result_mask_prob"):
            if not 0 <= getattr(cfg, key) <= 1:
                bad(f"{key}={getattr(cfg, key)} must be in [0, 1]")
        if not 0 <= cfg.token_weight_gamma <= 10:
            bad(f"token_weight_gamma={cfg.token_weight_gamma} must be in [0, 10] (0: the plain LLaDA loss)")
    if isinstance(cfg, DistillConfig):
        if not 0 <= cfg.pmask_low <= cfg.pmask_high <= 1:
            bad("need 0 <= pmask_low <= pmask_high <= 1")
        if cfg.block_size < 1:
            bad("block_size must be >= 1")


def _is_weight(w) -> bool:
    try:
        return not isinstance(w, bool) and float(w) >= 0
    except (TypeError, ValueError):
        return False


def suite_options_error(data: DataSection) -> str | None:
    """Why ``data.suite_options`` cannot build the training suites, or None."""
    from dllm.eval.tasks import get_suite

    trained = [k for k, v in data.tasks.items() if float(v) > 0]
    unknown = sorted(set(data.suite_options) - set(trained))
    if unknown:
        return (f"data.suite_options names suites {unknown} that data.tasks does not train on "
                f"(with a weight > 0): {', '.join(trained)}")
    for name, opts in data.suite_options.items():
        if not isinstance(opts, dict):
            return f"data.suite_options.{name} must be a mapping of options, e.g. {{ops: [copy, sort]}}"
        try:
            get_suite(name, **opts)
        except (ValueError, TypeError) as e:
            return f"data.suite_options.{name}: {e}"
    return None


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)
