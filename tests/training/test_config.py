"""YAML recipes + key=value overrides: typing, nesting, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from dllm.training.config import ConfigError, DistillConfig, SFTConfig, load_config, valid_keys

REPO = Path(__file__).resolve().parents[2]


def test_yaml_and_overrides_are_typed(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("max_steps: 10\nmodel:\n  path: tiny\noptim:\n  lr: 1e-3\n  betas: [0.9, 0.99]\ndata:\n  tasks: {arith: 1}\n")
    cfg = load_config(SFTConfig, recipe, ["optim.lr=3e-4", "batch_size=8", "progress=false",
                                          "data.tasks.gsm=2", "model.block_size=none", "mask_eps=0.01"])
    assert cfg.max_steps == 10 and isinstance(cfg.max_steps, int)
    assert cfg.optim.lr == 3e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.betas == [0.9, 0.99]
    assert cfg.batch_size == 8 and cfg.progress is False
    assert cfg.data.tasks == {"arith": 1, "gsm": 2}
    assert cfg.model.block_size is None and cfg.mask_eps == 0.01


def test_a_key_given_twice_with_two_values_is_refused():
    with pytest.raises(ConfigError, match=r"max_steps is given twice, as max_steps=2000 and max_steps=1011; give it once"):
        load_config(SFTConfig, None, ["max_steps=2000", "optim.lr=1e-3", "max_steps=1011"])
    with pytest.raises(ConfigError, match="optim.lr is given twice"):
        load_config(SFTConfig, None, ["optim.lr=1e-3", "--optim.lr=2e-3"])
    # the same value twice (a typed resume=true beside --resume), or a dict and then one of its keys, is fine
    cfg = load_config(SFTConfig, None, ["model.path=tiny", "resume=true", "resume=true", "data.tasks={arith: 1}",
                                        "data.tasks.gsm=2"])
    assert cfg.resume is True and cfg.data.tasks == {"arith": 1, "gsm": 2}


def test_null_unsets_an_optional_string(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  path: runs/x/final\n  tokenizer: tok\n")
    cfg = load_config(SFTConfig, recipe, ["model.path=null", "model.tokenizer=None", "model.config={d_model: 32}"])
    assert cfg.model.path is None and cfg.model.tokenizer is None
    assert load_config(SFTConfig, recipe, ["model.path=nullx"]).model.path == "nullx"


def test_yaml_scientific_notation_without_dot(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  path: tiny\noptim:\n  lr: 5e-6\n")  # YAML reads this as a string; the field type wins
    assert load_config(DistillConfig, recipe).optim.lr == 5e-6


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as err:
        load_config(SFTConfig, None, ["optim.lrr=1"])
    msg = str(err.value)
    assert "optim.lrr" in msg and "optim.lr" in msg and "max_steps" in msg
    with pytest.raises(ConfigError, match="unknown config key 'teacher'"):
        load_config(SFTConfig, None, ["teacher=x"])  # distill-only key
    assert "teacher" in valid_keys(DistillConfig) and "lora.r" in valid_keys(DistillConfig)


def test_bad_values_are_rejected():
    with pytest.raises(ConfigError, match="max_steps"):
        load_config(SFTConfig, None, ["max_steps=ten"])
    with pytest.raises(ConfigError, match="schedule"):
        load_config(SFTConfig, None, ["optim.schedule=linear"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(SFTConfig, None, ["max_steps"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(SFTConfig, "nope.yaml")
    with pytest.raises(ConfigError, match=r"unknown suites \['poetry'\]; valid suites: arith"):
        load_config(SFTConfig, None, ["data.tasks.poetry=1"])  # before any model is built, not deep in the data
    for key in ("prefix_prob", "full_mask_prob", "t_min", "result_mask_prob", "result_cut_prob"):
        with pytest.raises(ConfigError, match=rf"{key}=1.5 must be in \[0, 1\]"):
            load_config(SFTConfig, None, [f"{key}=1.5"])
    # tokenizer settings fail as config errors (a clean CLI message), not deep in the tokenizer build
    with pytest.raises(ConfigError, match=r"model.number_tokens=5 must be 0 \(off\) or in \[2, 3\]"):
        load_config(SFTConfig, None, ["model.number_tokens=5"])
    with pytest.raises(ConfigError, match="model.pad_numbers=1 must be"):
        load_config(SFTConfig, None, ["model.pad_numbers=1"])
    with pytest.raises(ConfigError, match="exclude each other"):
        load_config(SFTConfig, REPO / "recipes" / "tiny-sft.yaml", ["model.number_tokens=3"])
    assert load_config(SFTConfig, REPO / "recipes" / "tiny-sft.yaml",
                       ["model.number_tokens=3", "model.pad_numbers=0"]).model.number_tokens == 3
    with pytest.raises(ConfigError, match="model.number_tags tags padded numbers: it needs model.pad_numbers"):
        load_config(SFTConfig, None, ["model.number_tags=true"])
    assert load_config(SFTConfig, REPO / "recipes" / "tiny-sft.yaml", ["model.number_tags=true"]).model.number_tags
    with pytest.raises(ConfigError, match="model.number_tag_style='after'; valid: insert, replace"):
        load_config(SFTConfig, REPO / "recipes" / "tiny-sft.yaml", ["model.number_tags=true",
                                                                   "model.number_tag_style=after"])
    with pytest.raises(ConfigError, match="model.number_tag_digits=3 must be 0"):
        load_config(SFTConfig, None, ["model.number_tags=true", "model.pad_numbers=3", "model.number_tag_digits=3"])
    with pytest.raises(ConfigError, match="model.number_tag_context limits which numbers get tags"):
        load_config(SFTConfig, REPO / "recipes" / "tiny-sft.yaml", ["model.number_tag_context=countdown"])
    with pytest.raises(ConfigError, match=r"model.number_tag_context '\(' is not a valid regular expression"):
        load_config(SFTConfig, REPO / "recipes" / "tiny-sft.yaml", ["model.number_tags=true",
                                                                   "model.number_tag_context=("])
    assert load_config(SFTConfig, REPO / "recipes" / "tiny-sft.yaml", [
        "model.number_tags=true", "model.number_tag_context=countdown"]).model.number_tag_context == "countdown"
    with pytest.raises(ConfigError, match="model.tag_head='mean'; valid: origin, unk"):
        load_config(SFTConfig, REPO / "recipes" / "tiny-sft.yaml", ["model.tag_head=mean"])


@pytest.mark.parametrize("recipe,cls", [
    ("tiny-sft.yaml", SFTConfig), ("smoke-sft.yaml", SFTConfig),
    ("tiny-d2f.yaml", DistillConfig), ("smoke-distill.yaml", DistillConfig),
])
def test_shipped_recipes_load(recipe, cls):
    load_config(cls, REPO / "recipes" / recipe)


@pytest.mark.parametrize("kind,recipe", [("sft", "smoke-sft.yaml"), ("distill", "smoke-distill.yaml"),
                                         ("grpo", "smoke-grpo.yaml")])
def test_print_config_is_a_recipe_that_loads_to_the_same_config(kind, recipe, tmp_path):
    """``--print-config`` shows every key with the overrides applied, and its YAML is itself a recipe."""
    from typer.testing import CliRunner

    from dllm.cli import _mount_subcommands, app
    from dllm.training.config import to_dict
    from dllm.training.grpo_config import load_grpo_config

    _mount_subcommands()
    path = Path(__file__).resolve().parents[2] / "recipes" / recipe
    r = CliRunner().invoke(app, ["train", kind, "-c", str(path), "seed=7", f"run_dir={tmp_path / 'run'}",
                                 "--print-config"])
    assert r.exit_code == 0, r.output
    assert not (tmp_path / "run").exists()  # nothing ran
    printed = tmp_path / "printed.yaml"
    printed.write_text(r.output)
    load = {"sft": lambda p: load_config(SFTConfig, p), "distill": lambda p: load_config(DistillConfig, p),
            "grpo": lambda p: load_grpo_config(p)}[kind]
    again = load(printed)
    assert again.seed == 7 and to_dict(again) == to_dict(load(path)) | {"seed": 7, "run_dir": str(tmp_path / "run")}
