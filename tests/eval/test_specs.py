"""The name-list syntax `dllm bench` shares between --strategies and --suite."""
import pytest

from dllm.eval.specs import SpecError, parse_named_specs

EX = "a:x=1,y=2"


def test_parameters_belong_to_the_name_before_them():
    assert parse_named_specs("a, b:x=1,y=2 ; c,d:", EX) == [
        ("a", {}), ("b", {"x": "1", "y": "2"}), ("c", {}), ("d", {})]
    assert parse_named_specs("a,x=1", EX) == [("a", {"x": "1"})]  # a bare name takes them too
    assert parse_named_specs(" , ", EX) == []


def test_a_path_is_not_split_at_a_colon():
    assert parse_named_specs("data/run:1.jsonl,my.v2:x.jsonl", EX) == [("data/run:1.jsonl", {}), ("my.v2:x.jsonl", {})]


@pytest.mark.parametrize("spec,match", [("x=1,a", "before any name"), ("a:x=1:y=2", "separate parameters with commas"),
                                        ("a:x=1=2", "separate parameters"), (":x=1", "no name before its colon"),
                                        ("a,=1", "no parameter name")])
def test_malformed_specs_name_the_item_and_show_an_example(spec, match):
    with pytest.raises(SpecError, match=match) as err:
        parse_named_specs(spec, EX)
    assert EX in str(err.value) or "no parameter name" in match
