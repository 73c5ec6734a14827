"""``DiffusionGenerationConfig``: one frozen, JSON-serialisable description of how to decode."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dllm.validation import number_error

from .errors import GenerationConfigError
from .registry import get_strategy, strategy_names

CONFIG_NAME = "generation_config.json"
# Our keys live under this one key of generation_config.json so that transformers' own
# GenerationConfig (which reads the same file) and ours never fight over a field.
FILE_KEY = "dllm"

CACHES = ("none", "prefix", "dual")
REMASKING = ("low_confidence", "random")
# How a rule ranks positions (never how it thresholds them: thresholds compare probabilities). The
# references' ``sampling_strategy``: max probability ("default"), negative entropy sum p log p, or the
# top-1 minus top-2 probability (D2F-eval "margin_confidence", LoPA "margin").
RANKINGS = ("prob", "neg_entropy", "margin")
# SDAR's remasking_strategy values that dllm implements (lmdeploy: dllm_unmasking_strategy)
UNMASKING = ("low_confidence_dynamic", "low_confidence_static")


@dataclass(frozen=True)
class DiffusionGenerationConfig:
    """How ``model.generate`` turns a canvas of masks into text.

    Strategy parameters that do not apply to the chosen strategy are ignored (a sweep can keep one
    config); options passed to one ``generate`` call that its strategy does not read are warned of
    (``dllm.decoding.registry.unread_options_error``). See the README's strategy table for which fields
    each strategy reads.
    """

    strategy: str = "threshold"
    max_new_tokens: int = 64
    block_length: int | None = 32  # None: one block spanning max_new_tokens
    steps: int | None = None  # total denoising steps (vanilla quota schedule, Dream algorithms)
    # Fast-dLLM
    threshold: float = 0.9
    factor: float = 1.0
    cache: str = "none"
    refresh_interval: int | None = None  # also recompute the whole canvas every N steps inside a block
    dual_cache_step_bound: bool = False  # Fast-dLLM upstream quirk: dual-cache loop capped at steps/block
    # sampling
    temperature: float = 0.0
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None  # drop tokens below min_p x the top token's probability (vLLM's min_p)
    remasking: str = "low_confidence"
    cfg_scale: float = 0.0
    # Dream algorithms
    eps: float = 1e-3
    alg_temp: float | None = None
    # D2F / d3LLM pipelines
    block_add_threshold: float = 0.1  # tau_add
    decoded_token_threshold: float = 0.95  # tau_act
    skip_threshold: float = 0.9  # tau_conf (d2f: conf > tau; d3llm: entropy <= entropy_threshold)
    d2f_confidence: str = "prob"  # ranks a fully activated block's top-1 fallback (d2f, lopa's anchor fill)
    entropy_threshold: float = 0.5
    cache_delay: int = 2  # d3llm with a cache: forwards a finished block waits before it is cached
    # LoPA (lookahead branches on top of the base rule; see docs/lopa.md)
    lopa_branches: int = 0  # k lookahead branches; a round verifies k + 1 (k lookahead + the anchor)
    lopa_alpha: float = 0.0  # score weight of the branch's creating-token confidence (reference alpha)
    lopa_rho: float = 1.0  # score = mean of the lowest max(1, floor(rho * n)) remaining confidences
    lopa_confidence: str = "prob"  # branch score and lookahead ranking: "prob", "neg_entropy" or "margin"
    lopa_force_anchor: bool = False  # test switch: the anchor always wins (reproduces lopa_branches=0)
    # Token editing (LLaDA2.1 M2T + T2T, strategy "edit"): masks are committed above `threshold`, and a
    # committed token of the current block is replaced when the model prefers another with probability
    # above `editing_threshold`; a filled block gets at most `max_post_steps` edit-only forwards
    editing_threshold: float = 0.9
    max_post_steps: int = 16
    # SDAR / TraDo / LightningRL block decoding (strategy "sdar"; their names: denoising_steps,
    # remasking_strategy, confidence_threshold = `threshold`) and Fast-dLLM v2's sub-blocks
    # (strategy "fast_dllm_v2": small_block_size; threshold; use_block_cache = cache "dual")
    denoising_steps: int | None = None  # per block (None: one step per slot, the block length)
    unmasking: str = "low_confidence_dynamic"  # or "low_confidence_static" (a fixed quota per step)
    sub_block_length: int | None = None  # None: 8 (the reference's default), capped at the block length
    # stopping and bookkeeping
    max_steps: int | None = None  # forwards per row before it ends "step_limit" (None: step_limit())
    stop_at_eos: bool = True
    min_tokens: int = 0  # no EOS in the first min_tokens slots of an answer
    ignore_eos: bool = False  # never commit EOS: the answer fills max_new_tokens (benchmarks, as in vLLM)
    suppress_mask_token: bool = True  # never predict [MASK] (the references can, on untrained weights)
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    mask_token_id: int | None = None
    # one id or several (chat checkpoints list the turn end and the document end): any of them ends an
    # answer; a list of one is stored as its id, a longer one as a tuple (see eos_token_ids)
    eos_token_id: tuple[int, ...] | int | None = None  # checked by _eos_value, not as a number
    pad_token_id: int | None = None
    return_dict_in_generate: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop_strings, (list, str)):
            object.__setattr__(self, "stop_strings", (self.stop_strings,) if isinstance(self.stop_strings, str) else tuple(self.stop_strings))
        if self.eos_token_id is not None:
            object.__setattr__(self, "eos_token_id", _eos_value(self.eos_token_id))
        _check_field_types(self)
        names = strategy_names()
        if self.strategy not in names:
            raise GenerationConfigError(f"unknown strategy {self.strategy!r}; valid: {', '.join(names)}")
        _positive_int("max_new_tokens", self.max_new_tokens)
        if self.block_length is not None:
            _positive_int("block_length", self.block_length)
        if self.steps is not None:
            _positive_int("steps", self.steps)
        strategy = get_strategy(self.strategy)
        if strategy.validate is not None and (problem := strategy.validate(self)):
            raise GenerationConfigError(problem)
        for name in ("threshold", "block_add_threshold", "decoded_token_threshold", "skip_threshold",
                     "editing_threshold"):
            _unit_interval(name, getattr(self, name))
        if not isinstance(self.max_post_steps, int) or isinstance(self.max_post_steps, bool) or self.max_post_steps < 0:
            raise GenerationConfigError(f"max_post_steps must be an integer >= 0, got {self.max_post_steps!r}")
        if self.factor <= 0:
            raise GenerationConfigError(f"factor must be > 0, got {self.factor}")
        if self.cache not in CACHES:
            raise GenerationConfigError(f"cache={self.cache!r}; valid: {', '.join(CACHES)}")
        if self.refresh_interval is not None:
            _positive_int("refresh_interval", self.refresh_interval)
        if self.temperature < 0:
            raise GenerationConfigError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise GenerationConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None:
            _positive_int("top_k", self.top_k)
        if self.min_p is not None and not 0 <= self.min_p < 1:
            raise GenerationConfigError(f"min_p must be in [0, 1), got {self.min_p}")
        if not isinstance(self.min_tokens, int) or isinstance(self.min_tokens, bool) or self.min_tokens < 0:
            raise GenerationConfigError(f"min_tokens must be an integer >= 0, got {self.min_tokens!r}")
        if self.min_tokens > self.max_new_tokens:
            raise GenerationConfigError(f"min_tokens={self.min_tokens} exceeds max_new_tokens={self.max_new_tokens}")
        if self.remasking not in REMASKING:
            raise GenerationConfigError(f"remasking={self.remasking!r}; valid: {', '.join(REMASKING)}")
        if self.unmasking not in UNMASKING:
            raise GenerationConfigError(f"unmasking={self.unmasking!r}; valid: {', '.join(UNMASKING)}")
        for name in ("denoising_steps", "sub_block_length"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        if self.cfg_scale < 0:
            raise GenerationConfigError(f"cfg_scale must be >= 0, got {self.cfg_scale}")
        if not 0 < self.eps < 1:
            raise GenerationConfigError(f"eps must be in (0, 1), got {self.eps}")
        if not isinstance(self.cache_delay, int) or self.cache_delay < 0:
            raise GenerationConfigError(f"cache_delay must be an integer >= 0, got {self.cache_delay!r}")
        if self.entropy_threshold < 0:
            raise GenerationConfigError(f"entropy_threshold must be >= 0, got {self.entropy_threshold}")
        if not isinstance(self.lopa_branches, int) or isinstance(self.lopa_branches, bool) or self.lopa_branches < 0:
            raise GenerationConfigError(f"lopa_branches must be an integer >= 0, got {self.lopa_branches!r}")
        _unit_interval("lopa_alpha", self.lopa_alpha)
        if not 0.0 < self.lopa_rho <= 1.0:
            raise GenerationConfigError(f"lopa_rho must be in (0, 1], got {self.lopa_rho}")
        for name in ("d2f_confidence", "lopa_confidence"):
            if getattr(self, name) not in RANKINGS:
                raise GenerationConfigError(f"{name}={getattr(self, name)!r}; valid: {', '.join(RANKINGS)}")
        if self.max_steps is not None:
            _positive_int("max_steps", self.max_steps)
        if self.cfg_scale > 0 and (not strategy.guidance or self.cache != "none"):
            guided = ", ".join(n for n in strategy_names() if get_strategy(n).guidance)
            raise GenerationConfigError(f"cfg_scale > 0 is supported by strategy={guided} with cache='none' only")

    # -- derived -------------------------------------------------------------------------
    @property
    def block_size(self) -> int:
        return self.block_length or self.max_new_tokens

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """``eos_token_id`` as a tuple (empty when unset): every id that ends an answer, the first one
        the id that pads a finished answer."""
        if self.eos_token_id is None:
            return ()
        return self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    @property
    def canvas_tokens(self) -> int:
        """Slots decoded: ``max_new_tokens`` rounded up to whole blocks. A block is the unit every strategy
        decodes (and the block-causal attention's unit), so a canvas never ends inside one; the answer is
        cut back to ``max_new_tokens`` and a row stops once those slots are filled.

        Decoders on a position grid (``sdar``, ``fast_dllm_v2``) decode the model's blocks, whose
        first one starts up to a block before the prompt end: they get one more block of slots."""
        extra = self.block_size if get_strategy(self.strategy).grid == "position" else 0
        return self.num_blocks * self.block_size + extra

    @property
    def num_blocks(self) -> int:
        return -(-self.max_new_tokens // self.block_size)

    def steps_per_block(self) -> int:
        """Vanilla quota schedule: ``steps`` spread evenly over blocks (default: one token per step)."""
        steps = self.steps if self.steps is not None else self.canvas_tokens
        return max(1, steps // self.num_blocks)

    def step_limit(self) -> int:
        """Forwards a row may take before it ends with ``finish_reason="step_limit"``.

        ``max_steps``, or by default twice what a row needs when every forward commits one token
        (the larger of ``max_new_tokens`` and ``steps``, plus one per block). Every loop commits at
        least one token per forward to a row that is not stuck, and the fixed-step schedules run
        ``steps`` forwards, so only a row that keeps committing ``[MASK]`` (possible with
        ``suppress_mask_token=False``) reaches it; the D2F reference stops at 10,001 forwards.
        """
        if self.max_steps is not None:
            return self.max_steps
        limit = 2 * (max(self.canvas_tokens, self.steps or 0) + self.num_blocks)
        extra = get_strategy(self.strategy).extra_forwards
        if extra is not None:
            limit += extra(self)
        return limit

    # -- overrides and files ----------------------------------------------------------------
    def replace(self, **overrides: Any) -> DiffusionGenerationConfig:
        check_option_names(overrides)
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["stop_strings"] = list(self.stop_strings)
        if isinstance(self.eos_token_id, tuple):
            d["eos_token_id"] = list(self.eos_token_id)  # as transformers' GenerationConfig writes a list
        return d

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DiffusionGenerationConfig:
        check_option_names(data)
        data = dict(data)
        if "stop_strings" in data and data["stop_strings"] is not None:
            data["stop_strings"] = tuple(data["stop_strings"])
        return cls(**data)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write into ``generation_config.json`` under the ``"dllm"`` key, keeping other keys in the file."""
        path = Path(directory) / CONFIG_NAME
        existing = json.loads(path.read_text()) if path.exists() else {}
        existing[FILE_KEY] = self.to_dict()
        path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
        return path

    @classmethod
    def from_pretrained(cls, directory: str | Path) -> DiffusionGenerationConfig | None:
        path = Path(directory) / CONFIG_NAME
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls.from_dict(data[FILE_KEY]) if FILE_KEY in data else None


def parse_option_value(text: str) -> Any:
    """A value written on a command line: an int, a float, ``true``/``false``, ``none``, else the
    string itself (``dual``). The config's own checks then say whether it fits the field."""
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    return text


def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["skip_threshold=0.7", "cache=dual"]`` -> ``{"skip_threshold": 0.7, "cache": "dual"}``;
    field names are checked against the config, values by the config when it is built."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise GenerationConfigError(f"expected KEY=VALUE, got {item!r}")
        out[key] = parse_option_value(value.strip())
    check_option_names(out)
    return out


def check_option_names(names) -> None:
    """GenerationConfigError listing the valid fields if any of ``names`` is not one."""
    valid = {f.name for f in dataclasses.fields(DiffusionGenerationConfig)}
    unknown = sorted(set(names) - valid)
    if unknown:
        raise GenerationConfigError(
            f"unknown generation option(s) {', '.join(unknown)}; valid: {', '.join(sorted(valid))}"
        )


def _check_field_types(cfg: DiffusionGenerationConfig) -> None:
    """Numbers must be finite (JSON) numbers and switches bools: a value from a CLI or a JSON file may be a
    string, and NaN passes every range check written as a comparison (``x <= 0`` is false for NaN), so the
    range checks below would let it through or fail with a TypeError instead of naming the field."""
    for f in dataclasses.fields(cfg):
        value, kind = getattr(cfg, f.name), str(f.type)
        if value is None and "None" in kind:
            continue
        if kind.startswith("bool"):
            problem = None if isinstance(value, bool) else f"{f.name} must be true or false, got {value!r}"
        elif kind.startswith("int"):  # a count: 2.0 from a JSON file is a mistake to name, not to round
            ok = isinstance(value, int) and not isinstance(value, bool)
            problem = None if ok else f"{f.name} must be an integer, got {value!r}"
        elif kind.startswith("float"):
            problem = number_error(f.name, value)
        else:
            continue
        if problem:
            raise GenerationConfigError(problem)


def _eos_value(value: Any) -> int | tuple[int, ...]:
    """``eos_token_id`` as given (an id, or a list or tuple of ids, as transformers' GenerationConfig
    takes it; ``"151645,151643"`` from a command line) -> the id, or a tuple of two or more distinct ids
    in the given order."""
    if isinstance(value, str):
        try:
            value = [int(part) for part in value.split(",")]
        except ValueError:
            raise GenerationConfigError(f"eos_token_id must be an id or a list of ids, got {value!r}") from None
    ids = list(value) if isinstance(value, (list, tuple)) else [value]
    if not ids:
        raise GenerationConfigError("eos_token_id is an empty list; give one id or several, or None")
    for v in ids:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise GenerationConfigError(f"eos_token_id must be an id (an integer >= 0) or a list of ids, got {value!r}")
    ids = list(dict.fromkeys(ids))  # a repeated id changes nothing
    return ids[0] if len(ids) == 1 else tuple(ids)


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GenerationConfigError(f"{name} must be a positive integer, got {value!r}")


def _unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise GenerationConfigError(f"{name} must be in [0, 1], got {value}")
