"""GRPO with your own prompts and rewards: reward functions in Python (trl's signature) and as
``module:function`` paths in YAML, weights, prompts from a train_dataset or JSON Lines files (exact
match by default), and a run that makes no update saying so."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest

from dllm.eval.tasks import Example
from dllm.testing import save_tiny_checkpoint
from dllm.training.config import ConfigError
from dllm.training.grpo import GRPOTrainer
from dllm.training.grpo_config import GRPOConfig, load_grpo_config
from dllm.training.rewards import Scorer, load_reward_function

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "recipes" / "smoke-grpo.yaml"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("grpo-model")
    save_tiny_checkpoint(d, block_causal=True, block_size=4)
    return d


def _cfg(run_dir, **extra) -> GRPOConfig:
    kw = {"run_dir": str(run_dir), "max_steps": 2, "num_threads": 1, "progress": False, "save_every": 0,
          "batch_size": 16, "data": {"max_new_tokens": 8, "chunk_size": 32},
          "rollout": {"group_size": 4, "prompts_per_step": 2, "threshold": 0.3},
          "filter": {"require_correct": False}, "optim": {"lr": 1e-3, "warmup_steps": 0}}
    kw.update(extra)
    return GRPOConfig(**kw)


def _metrics(run_dir) -> list[dict]:
    return list(csv.DictReader((Path(run_dir) / "metrics.csv").open()))


def test_reward_function_paths_load_or_fail_naming_the_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def length(prompts, completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"
        "NOT_A_FUNCTION = 3\n"
        "def one_arg(completions):\n    return []\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.chdir(tmp_path)  # a module beside the user's working directory is found, as with python -m
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    assert load_reward_function("my_rewards:length")(["p"], ["abc"]) == [3.0]
    assert load_reward_function(f"{tmp_path / 'my_rewards.py'}:length")(["p"], ["ab"]) == [2.0]
    for path, msg in [("my_rewards", "must be 'module:function'"),
                      ("nope_module:fn", r"'nope_module:fn': cannot import 'nope_module' \(No module named"),
                      ("my_rewards:missing", "module 'my_rewards' has no 'missing'"),
                      ("my_rewards:NOT_A_FUNCTION", "'NOT_A_FUNCTION' is a int, not a function"),
                      ("my_rewards:one_arg", r"must take \(prompts, completions, \*\*kwargs\)"),
                      ("broken:fn", "importing 'broken' raised RuntimeError: boom"),
                      ("nowhere.py:fn", "file nowhere.py does not exist")]:
        with pytest.raises(ConfigError, match=msg):
            load_reward_function(path)


def test_recipe_functions_are_checked_at_load(ckpt, tmp_path):
    base = [f"model.path={ckpt}", f"run_dir={tmp_path / 'r'}"]
    with pytest.raises(ConfigError, match="reward function 'nope:fn': cannot import"):
        load_grpo_config(SMOKE, [*base, "reward.functions=[nope:fn]"])
    (tmp_path / "rw.py").write_text("def f(prompts, completions, **kw):\n    return [0.0] * len(completions)\n")
    fn = f"{tmp_path / 'rw.py'}:f"
    assert load_grpo_config(SMOKE, [*base, f"reward.functions=[{fn}]"]).reward.functions == [fn]
    with pytest.raises(ConfigError, match="2 weights for 1 reward functions"):
        load_grpo_config(SMOKE, [*base, f"reward.functions=[{fn}]", "reward.function_weights=[1, 2]"])
    from typer.testing import CliRunner

    from dllm.training.cli import train_app

    res = CliRunner().invoke(train_app, ["grpo", "--config", str(SMOKE), *base, "reward.functions=[nope:fn]"])
    assert res.exit_code == 2 and "cannot import 'nope'" in res.output and "Traceback" not in res.output


def _example(i, answer, source="train_dataset", **extra):
    return Example(f"x{i}", source, f"prompt {i}", answer,
                   {"key": str(i), "messages": [{"role": "user", "content": f"prompt {i}"}], "extra": extra})


def test_scorer_weights_kwargs_and_checks():
    seen = {}

    def exact(prompts, completions, answer, **kwargs):
        seen.update(prompts=prompts, answer=answer, kwargs=set(kwargs))
        return [float(c == a) for c, a in zip(completions, answer)]

    def only_named(prompts, completions, solution):  # no **kwargs: gets only what it names
        return [None if s is None else 0.5 for s in solution]

    s = Scorer([exact, only_named], [1.0, 2.0], correct_threshold=1.0)
    exs = [_example(0, "a", solution="x"), _example(1, "b")]
    correct, reward = s(exs, ["a", "z"])
    assert reward == [2.0, 0.0] and correct == [True, False]  # 1 x 1 + 2 x 0.5; 1 x 0 + 2 x None(=0)
    assert seen == {"prompts": ["prompt 0", "prompt 1"], "answer": ["a", "b"], "kwargs": {"source", "solution"}}
    assert s.means() == {"reward_exact": 0.5, "reward_only_named": 0.25} and s.means() == {}
    # the built-in scoring: exact match for data examples, the verifier for suite examples
    from dllm.eval.tasks import get_suite

    arith = get_suite("arith").examples("train", 1, seed=0)[0]
    correct, reward = Scorer()([_example(0, "Ann  Lee"), arith], ["Ann Lee", arith.answer])
    assert correct == [True, True] and reward == [1.0, 1.0]
    for bad, msg in [(lambda p, c, **k: [1.0], "returned 1 values for 2 completions"),
                     (lambda p, c, **k: ["x", 1], "returned 'x'"), (lambda p, c, **k: [math.nan, 1], "finite"),
                     (lambda p, c, **k: 3, "it must return a list of 2 numbers")]:
        with pytest.raises(ConfigError, match=msg):
            Scorer([bad])(exs, ["a", "b"])
    with pytest.raises(ConfigError, match="1 weights for 2 reward functions"):
        Scorer([exact, exact], [1.0])


def test_python_reward_function_on_prompts_alone(ckpt, tmp_path):
    """trl's pattern: prompts without answers, a reward function, its extra column as a keyword."""
    calls = []

    def likes_short(prompts, completions, target_len, **kwargs):
        calls.append((list(prompts), kwargs["answer"], list(target_len)))
        return [-abs(len(c.split()) - t) for c, t in zip(completions, target_len)]

    rows = [{"prompt": "What is 1 + 2 ?", "target_len": 1}, {"prompt": "What is 3 + 4 ?", "target_len": 2}]
    tr = GRPOTrainer(args=_cfg(tmp_path / "run", reward={"correct_threshold": -0.5, "tpf_weight": 0.0}),
                     model=str(ckpt), reward_funcs=likes_short, train_dataset=rows)
    assert tr.cfg.data.tasks == {}
    result = tr.train()
    assert result.status == "finished" and result.updates > 0
    prompts, answers, targets = calls[0]
    assert set(prompts) <= {r["prompt"] for r in rows} and answers == [None] * 8 and set(targets) <= {1, 2}
    rows_out = _metrics(tmp_path / "run")
    assert "reward_likes_short" in rows_out[0] and float(rows_out[0]["reward"]) <= 0
    # without a reward function a prompt alone has nothing to be scored against
    with pytest.raises(ConfigError, match=r"train_dataset\[0\]: keys \['prompt', 'target_len'\] are neither form"):
        GRPOTrainer(args=_cfg(tmp_path / "x"), model=str(ckpt), train_dataset=rows)


def test_grpo_on_a_jsonl_file_by_exact_match_and_with_a_yaml_function(ckpt, tmp_path, monkeypatch):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + 1 ?", "answer": str(i + 1)}) + "\n" for i in range(4)))
    over = [f"model.path={ckpt}", f"run_dir={tmp_path / 'a'}", "max_steps=2", "num_threads=1", "eval_every=0",
            "filter.require_correct=false", "rollout.threshold=0.3", "data.tasks={}", f"data.files={{{data}: 1}}"]
    result = GRPOTrainer(load_grpo_config(SMOKE, over)).run()
    assert result.status == "finished"
    assert {"accuracy", "reward"} <= set(_metrics(tmp_path / "a")[0])
    (tmp_path / "rw.py").write_text("def long(prompts, completions, **kw):\n    return [len(c) for c in completions]\n")
    monkeypatch.chdir(tmp_path)
    over[1] = f"run_dir={tmp_path / 'b'}"
    cfg = load_grpo_config(SMOKE, [*over, "reward.functions=[rw:long]", "reward.function_weights=[0.5]"])
    GRPOTrainer(cfg).run()
    assert "reward_long" in _metrics(tmp_path / "b")[0]


def test_a_run_without_updates_says_so(ckpt, tmp_path, capsys):
    from dllm.training.cli import grpo

    over = [f"model.path={ckpt}", f"run_dir={tmp_path / 'run'}", "max_steps=2", "num_threads=1", "eval_every=0",
            "rollout.threshold=0.3", "filter.require_correct=true", "filter.tpf_range=0.01"]
    grpo(SMOKE, over, resume=False)  # a random model is never right: every group is filtered
    err = capsys.readouterr().err
    assert "loss 0.0000" not in err
    assert "step 1/2 no update: every group was filtered (0 of " in err
    assert "a group needs a correct rollout and a TPF range >= 0.01" in err
    assert "no update: every group was filtered in all 2 RL steps" in err and "filter.require_correct=false" in err
    assert "finished at step 2 without an update" in err
    rows = _metrics(tmp_path / "run")
    assert [r["updates"] for r in rows] == ["0", "0"] and all(r.get("loss", "") == "" for r in rows)
