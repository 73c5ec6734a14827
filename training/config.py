"""Training configs: nested dataclasses, loaded from YAML recipes plus ``key=value`` overrides.

Values are coerced to the declared field types (YAML reads ``1e-3`` as a string; a CLI override
is always a string), and an unknown key fails with the list of valid dotted keys. Every numeric
field declares its range beside it (``num(default, ge=..., ...)``); :func:`check_numbers` refuses NaN,
infinities and out-of-range values with the field's dotted key, when a config is built and when it loads.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dllm.tokenization import MAX_NUMBER_TOKEN_DIGITS
from dllm.validation import Range

SUITE_WEIGHTS = {"arith": 1.0, "gsm": 1.0, "lists": 1.0, "sudoku": 1.0, "countdown": 1.0}


class ConfigError(ValueError):
    """A recipe or override names an unknown key or a value of the wrong type."""


def num(default, **bounds):
    """A numeric field and its range: ``ge``/``gt``/``le``/``lt`` (a number, the name of a sibling field,
    or ``("sibling", fn)``: fn of that field's value), ``off`` (a valid value outside the range: the
    option's "off"). Integer and optional come from the field's type. :func:`check_numbers` enforces it."""
    return field(default=default, metadata={"range": bounds})


TAG_HEADS = ("origin", "unk")  # where a new tag's head row starts: its empty digit's row, or the UNK token's


@dataclass
class ModelSection:
    path: str | None = None  # checkpoint dir or bundled name to start from; None: from scratch
    # a checkpoint to grow into the model built from ``config`` (more layers and/or a wider MLP,
    # other widths equal): see training.models.grow_depth; exclusive with ``path``
    grow_from: str | None = None
    # a checkpoint of another format whose weights start the fresh model built from ``config`` where the
    # roles and shapes agree (embedding, attention, MLP, norms, head; training.models.init_from_checkpoint):
    # e.g. an SDAR-format model from the bundled LLaDA-format tiny
    init_from: str | None = None
    config: dict = field(default_factory=dict)  # LLaDAConfig kwargs when training from scratch
    tokenizer: str | None = None  # tokenizer dir; None: the checkpoint's, or built from the task suites
    # when the tokenizer is built from the suites: left-pad numbers to this many digits (0: off; dllm.tokenization)
    pad_numbers: int = num(0, ge=2, le=20, off=0)
    # ... or make every number of up to this many digits one token (0: off; exclusive with pad_numbers)
    number_tokens: int = num(0, ge=2, le=MAX_NUMBER_TOKEN_DIGITS, off=0)
    # with pad_numbers: each padded number also gets a whole-number tag token before its digits
    number_tags: bool = False
    # where the tag goes: "insert" (before the padded digits) or "replace" (in place of the first empty
    # digit: same sequence length as plain padding; the way to add tags to a padded-digit checkpoint)
    number_tag_style: str = "insert"
    # tag only numbers of up to this many digits (0: every padded number)
    number_tag_digits: int = num(0, ge=1, lt=("pad_numbers", lambda w: max(2, w)), off=0)
    # tag only numbers that this regex matches right after ("": every padded number; "countdown": the
    # numbers of countdown prompts, dllm.tokenization.COUNTDOWN_PROMPT_CONTEXT)
    number_tag_context: str = ""
    # model.path + model.tokenizer with new tags: their head rows start from the empty digit's ("origin")
    # or from the UNK token's ("unk": for tags no answer contains; training.models.remap_vocabulary)
    tag_head: str = "origin"
    attention_policy: str | None = None  # override the checkpoint's (block-diffusion SFT: block_causal)
    block_size: int | None = num(None, ge=1)
    gradient_checkpointing: bool = False
    dtype: str = "float32"  # weights as loaded; 7-8B recipes load bfloat16 (DeepSpeed keeps fp32 masters)


@dataclass
class DataSection:
    # suite -> sampling weight. None (unset): every suite at weight 1, or none when the trainer gets a
    # train_dataset in Python (the dataset alone, as in trl); recipes and the CLI always resolve it
    tasks: dict | None = None
    max_new_tokens: int = num(48, ge=1)  # generation length: answers + EOS are padded with EOS up to it
    # fixed: always pad to max_new_tokens (LLaDA SFT). random: per batch, pad to a length between the
    # longest answer and max_new_tokens, skewed short by eos_pad_power (cheaper, and teaches every
    # canvas length a sampler may use).
    eos_pad: str = "fixed"
    eos_pad_power: float = num(3.0, gt=0)
    mix: str = "per_batch"  # per_batch: one suite per micro-batch (short padding); per_example: mixed
    chunk_size: int = num(2048, ge=1)  # examples generated per suite at a time (deterministic in seed and chunk)
    # suite -> constructor options for the training stream only (evaluation always uses the full
    # suite), e.g. {lists: {ops: [copy, replace_random, replace_random]}}: an op named twice is drawn
    # twice as often.
    suite_options: dict = field(default_factory=dict)
    # your own JSON Lines files, path -> sampling weight, mixed with data.tasks (training.files for the
    # two accepted forms); set data.tasks to {} to train on the files alone. GRPO reads their prompts and
    # scores completions by exact match against the file's answers, or with reward.functions
    files: dict = field(default_factory=dict)
    # sampling weight of the examples given to the trainer in Python (train_dataset=), against the above
    dataset_weight: float = num(1.0, ge=0)


@dataclass
class OptimSection:
    lr: float = num(1e-4, gt=0)
    weight_decay: float = num(0.1, ge=0)
    betas: list = field(default_factory=lambda: [0.9, 0.95])  # two numbers in [0, 1) (check_numbers)
    eps: float = num(1e-8, gt=0)
    grad_clip: float = num(1.0, ge=0)  # 0 disables clipping
    schedule: str = "cosine"  # cosine | constant (both after a linear warm-up)
    warmup_steps: int = num(100, ge=0)
    min_lr_ratio: float = num(0.1, ge=0, le=1)  # cosine floor as a fraction of lr


@dataclass
class TrainConfig:
    """Fields every trainer shares (the engine reads only these)."""

    run_dir: str = "runs/run"
    seed: int = num(0, ge=0, le=2**32 - 1)
    max_steps: int = num(1000, ge=1)  # optimizer steps
    batch_size: int = num(32, ge=1)  # examples per micro-batch per process
    grad_accum: int = num(1, ge=1)
    # several processes (SFT): every process draws the same micro-batch of batch_size x processes examples and
    # the masks of all its rows, and trains on its own batch_size rows, so N processes take the steps that one
    # process takes with batch_size x N (equal losses and weights up to float rounding: docs/scaling.md).
    # GRPO: every process draws the step's prompts x processes and generates its share of the groups' rollouts.
    # false: each process draws its own examples and masks (no process reads or noises another's rows)
    shard_global_batch: bool = False
    mixed_precision: str = "no"  # no | bf16 | fp16
    num_threads: int | None = num(None, ge=1)  # torch.set_num_threads on CPU; None leaves torch's default
    log_every: int = num(10, ge=1)
    save_every: int = num(500, ge=0)  # checkpoint every N optimizer steps (0: only at the end and on a signal)
    keep_checkpoints: int = num(2, ge=1)
    eval_every: int = num(0, ge=0)  # quick greedy accuracy on test examples every N steps (0: off)
    eval_examples: int = num(32, ge=1)  # per suite
    export_dir: str | None = None  # final model dir; default <run_dir>/final
    resume: bool = False
    # a run from step 0 in a run_dir that holds an earlier run's config.yaml, metrics.csv or eval.csv, or
    # into an export_dir that holds a model, is refused; true lets it replace them (checkpoints are never
    # replaced: resume them, or remove them)
    overwrite: bool = False
    progress: bool = True
    # the run is refused before its model is built when weights + gradients + AdamW states would not fit
    # in the free memory (training.memory); true skips that check
    allow_large_model: bool = False
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
        check_numbers(self)


@dataclass
class SFTConfig(TrainConfig):
    """LLaDA SFT: t ~ U(0,1), p = (1 - mask_eps) t + mask_eps, answer tokens masked i.i.d. with p."""

    run_dir: str = "runs/sft"
    mask_eps: float = num(1e-3, gt=0, le=1)  # > 0: the loss divides by p
    full_mask_prob: float = num(0.0, ge=0, le=1)  # extra, not LLaDA: fraction of rows with the whole answer masked (p = 1)
    t_min: float = num(0.0, ge=0, le=1)  # extra, not LLaDA: t ~ U(t_min, 1)
    prefix_prob: float = num(0.0, ge=0, le=1)  # extra, not LLaDA: fraction of rows whose answer is revealed up to a random cut
    # extra, not LLaDA: fraction of rows (of those with results) where only the number runs after a
    # trigger token are masked: the step results and final answer of a worked solution
    result_mask_prob: float = num(0.0, ge=0, le=1)
    # extra, not LLaDA: fraction of rows (of those with results) shown up to one of their results, drawn
    # uniformly, with that result and everything after it masked (a worked solution cut at a result)
    result_cut_prob: float = num(0.0, ge=0, le=1)
    result_triggers: list[str] = field(default_factory=lambda: ["=", "#"])
    # extra, not LLaDA: weight each masked token by (1 - p_target)^gamma, renormalised (MGDM-style)
    token_weight_gamma: float = num(0.0, ge=0, le=10)  # 0: the plain LLaDA loss
    # extra, LLaDA2.1's editing objective (token-to-token): this fraction of the answer tokens left unmasked
    # is replaced by random tokens, and the loss also covers every unmasked answer token (the clean token,
    # replaced or not, is the target), so the model learns which committed tokens to edit (strategy "edit")
    t2t_corrupt_prob: float = num(0.0, ge=0, le=1)  # 0: the plain objective
    t2t_loss_weight: float = num(1.0, ge=0)  # weight of that term beside the masked-token loss
    # LoRA on the model's own projection names (training.models.lora_targets translates LLaDA's names)
    lora: LoraSection = field(default_factory=lambda: LoraSection())


@dataclass
class LoraSection:
    enabled: bool = False
    r: int = num(32, ge=1)
    alpha: int = num(32, ge=1)
    dropout: float = num(0.1, ge=0, lt=1)
    target_modules: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "attn_out"])


@dataclass
class DistillConfig(TrainConfig):
    """D2F asymmetric distillation: block-causal student <- bidirectional frozen teacher."""

    run_dir: str = "runs/distill"
    teacher: str | None = None  # teacher checkpoint; None: the student's base with the adapter disabled
    block_size: int = num(16, ge=1)  # student block size (D2F trains with 16)
    pmask_low: float = num(0.2, ge=0, le="pmask_high")  # first block's mask ratio ~ U[pmask_low, pmask_high)
    pmask_high: float = num(0.7, ge="pmask_low", le=1)  # ratios rise monotonically up to this
    hard_label_weight: float = num(0.0, ge=0)  # optional extra CE to the ground truth (D2F: 0, self-alignment only)
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
    given: dict[str, str] = {}
    for item in overrides:
        key, value = parse_override(item)
        # one key with two values is a mistake (an edited command line that kept the old value); which one
        # was meant is not ours to guess, so neither is taken. The same value twice is harmless.
        if key in given and given[key].strip() != value.strip():
            raise ConfigError(f"{key} is given twice, as {key}={given[key]} and {key}={value}; give it once")
        given[key] = value
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

    check_numbers(cfg)
    if cfg.mixed_precision not in ("no", "bf16", "fp16"):
        bad(f"mixed_precision={cfg.mixed_precision!r}; valid: no, bf16, fp16")
    if cfg.optim.schedule not in ("cosine", "constant"):
        bad(f"optim.schedule={cfg.optim.schedule!r}; valid: cosine, constant")
    if cfg.data.eos_pad not in ("fixed", "random"):
        bad(f"data.eos_pad={cfg.data.eos_pad!r}; valid: fixed, random")
    if cfg.data.mix not in ("per_batch", "per_example"):
        bad(f"data.mix={cfg.data.mix!r}; valid: per_batch, per_example")
    from dllm.eval.tasks import suite_names

    if unknown := sorted(set(cfg.data.tasks) - set(suite_names("every"))):
        bad(f"data.tasks names unknown suites {unknown}; valid suites: {', '.join(suite_names('every'))}")
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
    from dllm.tokenization import TAG_STYLES, tag_context_error

    if cfg.model.pad_numbers and cfg.model.number_tokens:
        bad("model.pad_numbers and model.number_tokens exclude each other (digits padded to a width, or whole "
            "numbers as tokens); set one of them to 0 (recipes/tiny-sft.yaml sets pad_numbers: 4)")
    if cfg.model.number_tags and not cfg.model.pad_numbers:
        bad("model.number_tags tags padded numbers: it needs model.pad_numbers (e.g. 4)")
    if cfg.model.number_tag_style not in TAG_STYLES:
        bad(f"model.number_tag_style={cfg.model.number_tag_style!r}; valid: {', '.join(TAG_STYLES)}")
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
    if isinstance(cfg, DistillConfig) and not (cfg.model.path or cfg.model.grow_from):
        bad("distillation starts from a trained model: set model.path (e.g. tiny), or model.grow_from with a "
            "model.config to grow it into")
    if not (cfg.model.path or cfg.model.grow_from or cfg.model.config):
        bad(getattr(cfg, "no_model", None) or NO_MODEL)


# The default LLaDAConfig is LLaDA-8B: a recipe that names no model would build 8B parameters in memory.
NO_MODEL = ("no model to train: set model.path (a bundled name such as tiny, or a checkpoint directory) to start "
            "from a trained model, or model.config to build one from scratch, e.g. model.config='{d_model: 64, "
            "n_layers: 2, n_heads: 4, n_kv_heads: 4, mlp_hidden_size: 128}' (recipes/smoke-sft.yaml); with neither, "
            "LLaDA's defaults would build an 8B-parameter model")


def _is_weight(w) -> bool:
    try:
        return not isinstance(w, bool) and math.isfinite(float(w)) and float(w) >= 0
    except (TypeError, ValueError):
        return False


# --------------------------------------------------------------------------------------------
# numbers: every numeric field finite and in its declared range


def numeric_fields(cfg, prefix: str = ""):
    """``(dotted key, section, field, integer, optional)`` for every int/float field of ``cfg`` and of its
    sections, walked recursively (the property test walks the same list)."""
    hints = _hints(type(cfg))
    for f in dataclasses.fields(cfg):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            value = getattr(cfg, f.name, None)
            if dataclasses.is_dataclass(value):
                yield from numeric_fields(value, f"{prefix}{f.name}.")
            continue
        base, optional = _strip_optional(t)
        if base in (int, float):
            yield f"{prefix}{f.name}", cfg, f, base is int, optional


def field_range(section, f, integer: bool, optional: bool, prefix: str = "",
                resolve: bool = True) -> tuple[Range, str]:
    """The :class:`~dllm.validation.Range` a field declares (``num``), its bounds that name sibling fields
    read from ``section`` (``resolve=False``: left out), and a note naming those siblings for messages."""
    if "range" not in f.metadata:
        raise TypeError(f"{prefix}{f.name} is numeric but declares no range: give it num(default, ...)")
    bounds, notes = {}, []
    for key, bound in f.metadata["range"].items():
        if isinstance(bound, (str, tuple)):  # "sibling" or ("sibling", fn): the bound follows another field
            if not resolve:
                continue
            sibling, fn = (bound, None) if isinstance(bound, str) else bound
            value = getattr(section, sibling)
            bound = value if fn is None else fn(value)
            notes.append(f"{prefix}{sibling}={value}")
        elif callable(bound):
            raise TypeError(f"{prefix}{f.name}: a bound that follows a field is written (\"field\", fn)")
        bounds[key] = bound
    note = f" (it follows {', '.join(notes)})" if notes else ""
    return Range(integer=integer, optional=optional, **bounds), note


def check_numbers(cfg) -> None:
    """ConfigError naming the first numeric field that is not a finite number in its range (NaN, inf, a
    negative learning rate, a fraction above 1, ...), and the same for the numbers inside ``optim.betas``
    and ``model.config``. Bounds that follow another field (``pmask_low <= pmask_high``) are checked once
    every field is a valid number on its own."""
    fields = list(numeric_fields(cfg))
    for resolve in (False, True):
        for key, section, f, integer, optional in fields:
            prefix = key[: -len(f.name)]
            rng, note = field_range(section, f, integer, optional, prefix, resolve)
            if (err := rng.error(key, getattr(section, f.name))) is not None:
                raise ConfigError(err + note)
    optim = getattr(cfg, "optim", None)
    if optim is not None:
        betas = optim.betas
        if not isinstance(betas, (list, tuple)) or len(betas) != 2:
            raise ConfigError(f"optim.betas={betas!r} must be two numbers in [0, 1), e.g. [0.9, 0.95]")
        for i, b in enumerate(betas):
            if (err := Range(ge=0, lt=1).error(f"optim.betas[{i}]", b)) is not None:
                raise ConfigError(err)
    model = getattr(cfg, "model", None)
    for k, v in (getattr(model, "config", None) or {}).items():
        if isinstance(v, float) and not math.isfinite(v):  # a model built with a NaN rope_theta trains NaN
            raise ConfigError(f"model.config.{k}={v} must be a finite number")


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
