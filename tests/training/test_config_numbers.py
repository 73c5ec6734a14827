"""Every numeric option of SFTConfig, DistillConfig and GRPOConfig is a finite number in its declared range,
checked when a config is built in Python and when a recipe loads: NaN, infinities and out-of-range values
always give a ConfigError naming the field, and values in range never do (property-based, over every
numeric field found by walking the dataclass sections)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm.training.config import ConfigError, DistillConfig, SFTConfig, field_range, load_config, numeric_fields
from dllm.training.grpo_config import GRPOConfig, load_grpo_config
from dllm.validation import Range

# the smallest recipe each config loads from: a model to start from (everything else at its default)
BASE = {SFTConfig: ["model.path=tiny"], DistillConfig: ["model.path=tiny"], GRPOConfig: ["model.path=tiny-d2f"]}
CLASSES = list(BASE)


def _load(cls, overrides):
    return load_grpo_config(None, overrides) if cls is GRPOConfig else load_config(cls, None, overrides)


def _fields(cls) -> dict[str, tuple]:
    return {key: (section, f, integer, optional) for key, section, f, integer, optional in numeric_fields(cls())}


FIELDS = {cls: _fields(cls) for cls in CLASSES}
CASES = [(cls, key) for cls in CLASSES for key in FIELDS[cls]]


def _valid_range(cls, key) -> Range:
    """The field's range with its bounds that follow another field read from the base config."""
    cfg = _load(cls, BASE[cls])
    section, f, integer, optional = dict(((k, (s, f, i, o)) for k, s, f, i, o in numeric_fields(cfg)))[key]
    return field_range(section, f, integer, optional, resolve=True)[0]


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def test_every_numeric_field_is_found_and_declares_a_range():
    for cls in CLASSES:
        for key, (section, f, integer, optional) in FIELDS[cls].items():
            assert "range" in f.metadata, f"{cls.__name__}.{key} declares no range"
            field_range(section, f, integer, optional, resolve=True)  # every bound resolves
    assert {"optim.lr", "optim.eps", "seed", "max_steps", "mask_eps", "data.eos_pad_power"} <= set(FIELDS[SFTConfig])
    assert {"pmask_low", "pmask_high", "lora.dropout", "lora.r"} <= set(FIELDS[DistillConfig])
    assert {"rollout.temperature", "rollout.threshold", "loss.clip_low", "loss.beta", "reward.tpf_weight",
            "evaluation.threshold", "filter.tpf_range"} <= set(FIELDS[GRPOConfig])
    for cls in CLASSES:  # independently of the type hints: every field whose default is a number is walked
        assert _number_valued(cls()) <= set(FIELDS[cls]), cls.__name__


def _number_valued(cfg, prefix: str = "") -> set[str]:
    found = set()
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            found |= _number_valued(value, f"{prefix}{f.name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.add(f"{prefix}{f.name}")
    return found


def _outside(rng: Range, integer: bool):
    """Numbers outside ``rng`` (never its "off" value)."""
    num = st.integers if integer else (lambda **kw: st.floats(allow_nan=False, allow_infinity=False, **kw))
    sides = []
    lo = rng.ge if rng.ge is not None else rng.gt
    hi = rng.le if rng.le is not None else rng.lt
    if lo is not None:
        top = (math.ceil(lo) - 1 if rng.ge is not None else math.floor(lo)) if integer else lo
        sides.append(num(max_value=top, **({} if integer or rng.gt is not None else {"exclude_max": True})))
    if hi is not None:
        bottom = (math.floor(hi) + 1 if rng.le is not None else math.ceil(hi)) if integer else hi
        sides.append(num(min_value=bottom, **({} if integer or rng.lt is not None else {"exclude_min": True})))
    if not sides:
        return st.nothing()
    return st.one_of(sides).filter(lambda v: rng.off is None or v != rng.off)


def _inside(rng: Range, integer: bool):
    lo = rng.ge if rng.ge is not None else rng.gt
    hi = rng.le if rng.le is not None else rng.lt
    if integer:
        low = None if lo is None else (math.ceil(lo) if rng.ge is not None else math.floor(lo) + 1)
        high = None if hi is None else (math.floor(hi) if rng.le is not None else math.ceil(hi) - 1)
        inside = st.integers(min_value=low, max_value=high)
    else:
        inside = st.floats(min_value=lo, max_value=hi, exclude_min=rng.gt is not None and lo is not None,
                           exclude_max=rng.lt is not None and hi is not None, allow_nan=False, allow_infinity=False)
    values = [inside] + ([st.just(rng.off)] if rng.off is not None else []) + ([st.none()] if rng.optional else [])
    return st.one_of(values)


def _python_config(cls, key: str, value):
    """The config built in Python with ``key`` set: a top-level keyword or a section given as a dict."""
    head, _, rest = key.partition(".")
    return cls(**{head: {rest: value}} if rest else {head: value})


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), data=st.data(), python=st.booleans())
def test_nan_inf_and_out_of_range_values_are_refused_by_name(case, data, python):
    cls, key = case
    _, f, integer, optional = FIELDS[cls][key]
    rng = _valid_range(cls, key)
    value = data.draw(st.one_of(st.sampled_from([math.nan, math.inf, -math.inf]), _outside(rng, integer)),
                      label="value")
    with pytest.raises(ConfigError) as err:
        if python:
            _python_config(cls, key, value)
        else:
            _load(cls, BASE[cls] + [f"{key}={_text(value)}"])
    assert key in str(err.value), str(err.value)


@settings(max_examples=300, deadline=None)
@given(case=st.sampled_from(CASES), data=st.data(), python=st.booleans())
def test_values_in_range_are_accepted(case, data, python):
    cls, key = case
    _, f, integer, optional = FIELDS[cls][key]
    value = data.draw(_inside(_valid_range(cls, key), integer), label="value")
    cfg = _python_config(cls, key, value) if python else _load(cls, BASE[cls] + [f"{key}={_text(value)}"])
    got = cfg
    for part in key.split("."):
        got = getattr(got, part)
    assert got == value and (value is None or isinstance(got, int if integer else (int, float)))


def test_numbers_inside_lists_and_mappings(tmp_path):
    for over, name in [("optim.betas=[.nan, 0.9]", "optim.betas[0]"), ("optim.betas=[0.9, 1.0]", "optim.betas[1]"),
                       ("optim.betas=[0.9]", "optim.betas"), ("model.config={rope_theta: .inf}", "model.config.rope_theta"),
                       ("data.tasks.arith=.inf", "data.tasks"), ("data.tasks.arith=.nan", "data.tasks")]:
        with pytest.raises(ConfigError, match=name.replace("[", r"\[").replace("]", r"\]")):
            load_config(SFTConfig, None, ["model.path=tiny", over])
    (tmp_path / "rw.py").write_text("def f(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    with pytest.raises(ConfigError, match=r"reward.function_weights\[0\]=nan must be a finite number"):
        load_grpo_config(None, ["model.path=tiny-d2f", f"reward.functions=[{tmp_path / 'rw.py'}:f]",
                                "reward.function_weights=[.nan]"])


def test_a_bound_that_follows_another_field_names_it():
    with pytest.raises(ConfigError, match=r"pmask_low=0.8 must be in \[0, 0.7\] \(it follows pmask_high=0.7\)"):
        load_config(DistillConfig, None, ["model.path=tiny", "pmask_low=0.8"])
    with pytest.raises(ConfigError, match=r"pmask_low=1.0 must be in \[0, 0.9\] \(it follows pmask_high=0.9\)"):
        load_config(DistillConfig, None, ["model.path=tiny", "pmask_low=1", "pmask_high=0.9"])
    assert load_config(DistillConfig, None, ["model.path=tiny", "pmask_low=0.9", "pmask_high=1.0"]).pmask_low == 0.9


def test_python_configs_are_checked_when_built_and_when_changed():
    with pytest.raises(ConfigError, match="optim.lr=nan must be a finite number > 0"):
        SFTConfig(optim={"lr": float("nan")})
    with pytest.raises(ConfigError, match="max_steps='10' must be an integer >= 1"):
        SFTConfig(max_steps="10")
    cfg = GRPOConfig(model={"path": "tiny-d2f"})
    cfg.loss.clip_low = float("inf")  # set after construction: the trainer checks it again
    from dllm.training.grpo import GRPOTrainer

    with pytest.raises(ConfigError, match="loss.clip_low=inf must be a finite number in"):
        GRPOTrainer(cfg)
