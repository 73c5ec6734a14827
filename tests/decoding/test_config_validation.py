"""Every numeric decoding option is a finite number in its range, checked when the config is built."""

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dllm import DiffusionGenerationConfig
from dllm.decoding.errors import GenerationConfigError
from dllm.validation import number_error

FIELDS = dataclasses.fields(DiffusionGenerationConfig)
NUMERIC = [f.name for f in FIELDS if str(f.type).startswith(("int", "float"))]


def test_the_numeric_fields_are_all_found():
    assert {"threshold", "factor", "temperature", "entropy_threshold", "lopa_rho", "max_new_tokens", "min_p"} <= set(NUMERIC)


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(NUMERIC), value=st.sampled_from([math.nan, math.inf, -math.inf, "0.5", True, [1]]))
def test_non_numbers_and_non_finite_values_are_refused_by_name(name, value):
    with pytest.raises(GenerationConfigError) as err:
        DiffusionGenerationConfig(**{name: value})
    assert str(err.value).startswith(name)


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NUMERIC), value=st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32),
                                                      st.integers(-10**6, 10**6)))
def test_a_finite_value_is_accepted_or_refused_by_name_never_crashes(name, value):
    try:
        cfg = DiffusionGenerationConfig(**{name: value})
    except GenerationConfigError as err:
        assert name in str(err)
    else:
        assert getattr(cfg, name) == value


def test_one_range_check_for_every_config():
    assert number_error("x", 0.5, ge=0, le=1) is None
    assert number_error("x", math.nan) == "x=nan must be a finite number"
    assert number_error("n", 2, integer=True, ge=1) is None and number_error("n", 0, integer=True, ge=1)
    assert number_error("x", True) is not None and number_error("x", 0.0, gt=0) is not None
