"""The trainers from Python, the way trl's are used: a config object built in Python, ``model=`` a name or
directory, ``train_dataset=`` a list of dicts / dict of columns / ``datasets.Dataset``, ``.train()``;
and every recipe's export following a ``run_dir`` override."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from dllm.training import ConfigError, DistillConfig, SFTConfig
from dllm.training.config import DataSection, OptimSection, load_config

from .conftest import MICRO_MODEL, TOKENIZER_DIR

REPO = Path(__file__).resolve().parents[2]
ROWS = [{"prompt": "copy : Ann Lee", "completion": "Ann Lee"},
        {"prompt": "copy : Pam", "completion": "Pam"},
        {"prompt": "copy : Lee Ann Pam", "completion": "Lee Ann Pam"}]


def _micro(run_dir, **extra) -> SFTConfig:
    """A from-scratch micro model that trains a step in well under a second."""
    kw = {"run_dir": str(run_dir), "max_steps": 3, "batch_size": 2, "num_threads": 1, "log_every": 1,
          "save_every": 0, "progress": False, "model": {"tokenizer": str(TOKENIZER_DIR), "config": dict(MICRO_MODEL)},
          "data": {"max_new_tokens": 8}, "optim": {"lr": 1e-3, "warmup_steps": 1}}
    kw.update(extra)
    return SFTConfig(**kw)


def _metrics(run_dir) -> list[dict]:
    return list(csv.DictReader((Path(run_dir) / "metrics.csv").open()))


def test_configs_build_in_python_section_by_section():
    cfg = SFTConfig(model={"path": "tiny"}, optim={"lr": "3e-4"}, data=DataSection(tasks={"arith": 1}))
    assert cfg.model.path == "tiny" and cfg.optim.lr == 3e-4 and cfg.optim.schedule == "cosine"
    assert cfg.data.tasks == {"arith": 1}
    # a dict fills the section on top of this config's own defaults (distillation's optimizer differs)
    d = DistillConfig(optim={"lr": 2e-5})
    assert d.optim.lr == 2e-5 and d.optim.schedule == "constant" and d.optim.weight_decay == 0.05
    assert isinstance(SFTConfig(optim=OptimSection(lr=1.0)).optim, OptimSection)
    with pytest.raises(ConfigError, match="unknown config key 'optim.learning_rate'.*optim.lr"):
        SFTConfig(optim={"learning_rate": 1e-4})
    with pytest.raises(ConfigError, match="optim.lr='fast' is not a valid float"):
        SFTConfig(optim={"lr": "fast"})
    # data.tasks unset: every suite for a recipe, none beside a train_dataset
    assert SFTConfig().data.tasks is None
    assert set(load_config(SFTConfig, None, ["model.path=tiny"]).data.tasks) == {"arith", "gsm", "lists", "sudoku",
                                                                                 "countdown"}


def test_sft_trains_on_a_list_of_rows_alone(tmp_path, capsys):
    from dllm.training import SFTTrainer

    cfg = _micro(tmp_path / "run")
    trainer = SFTTrainer(args=cfg, train_dataset=ROWS)
    assert trainer.cfg is not cfg and cfg.data.tasks is None and trainer.cfg.data.tasks == {}
    result = trainer.train()
    assert result.status == "finished" and result.export_dir == tmp_path / "run" / "final"
    rows = _metrics(tmp_path / "run")
    assert len(rows) == 3 and all(float(r["loss_train_dataset"]) > 0 for r in rows)
    assert not [k for k in rows[0] if k.startswith("loss_") and k != "loss_train_dataset"]
    assert "train_dataset: 3 of 3 examples used" in capsys.readouterr().err


def test_a_datasets_dataset_and_columns_mix_with_suites(tmp_path):
    import datasets

    from dllm.training import SFTTrainer

    ds = datasets.Dataset.from_list([{**r, "source": "mine"} for r in ROWS])  # extra columns are ignored
    cfg = _micro(tmp_path / "a", max_steps=6, data={"tasks": {"arith": 1}, "max_new_tokens": 8, "dataset_weight": 1})
    SFTTrainer(args=cfg, train_dataset=ds).train()
    seen = {k for r in _metrics(tmp_path / "a") for k, v in r.items() if k.startswith("loss_") and v}
    assert seen == {"loss_arith", "loss_train_dataset"}
    # a dict of columns (Dataset.from_dict's input) and trl's conversational prompt/completion rows
    columns = {"prompt": [r["prompt"] for r in ROWS], "completion": [r["completion"] for r in ROWS]}
    chat = [{"prompt": [{"role": "user", "content": r["prompt"]}],
             "completion": [{"role": "assistant", "content": r["completion"]}]} for r in ROWS]
    a = SFTTrainer(args=_micro(tmp_path / "b"), train_dataset=columns).train_records
    b = SFTTrainer(args=_micro(tmp_path / "c"), train_dataset=chat).train_records
    assert [(r.messages, r.answer) for r in a] == [(r.messages, r.answer) for r in b]
    assert a[0].messages == (("user", "copy : Ann Lee"),) and a[0].answer == "Ann Lee"


def test_user_mistakes_are_one_clear_error(tmp_path):
    from dllm.training import SFTTrainer

    cfg = _micro(tmp_path / "run")
    cases = [
        ([ROWS[0], {"prompt": "x"}], r"train_dataset\[1\]: keys \['prompt'\] are neither form"),
        ([{"prompt": 3, "completion": "a"}], r"train_dataset\[0\]: 'prompt' must be a string or a list of messages"),
        ("data.jsonl", "is a path .*data.files"),
        ({"train": ROWS[:1], "test": ROWS[1:]}, r"holds splits \['test', 'train'\]: pass one of them"),
        ({"prompt": "a", "completion": "b"}, "is one dict"),
        ({"prompt": ["a", "b"], "completion": ["a"]}, "columns differ in length"),
        ([], "holds no examples"),
        (42, "must be a list of rows"),
    ]
    for dataset, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            SFTTrainer(args=cfg, train_dataset=dataset)

    class FakeSplit(list):
        column_names = ["prompt", "completion"]

    with pytest.raises(ConfigError, match=r"holds splits \['train'\]: pass one of them"):
        SFTTrainer(args=cfg, train_dataset={"train": FakeSplit(ROWS)})
    with pytest.raises(ConfigError, match="need at least one source with a positive weight"):
        SFTTrainer(args=_micro(tmp_path / "w", data={"dataset_weight": 0}), train_dataset=ROWS)
    with pytest.raises(TypeError, match="save_pretrained"):
        SFTTrainer(args=cfg, model=object())
    with pytest.raises(TypeError, match="takes a SFTConfig, not DistillConfig"):
        SFTTrainer(DistillConfig())
    with pytest.raises(ConfigError, match="max_steps=0 must be >= 1"):  # Python configs are validated too
        SFTTrainer(args=_micro(tmp_path / "x", max_steps=0), train_dataset=ROWS)


def test_a_tokenizer_built_from_scratch_learns_the_dataset_words(tmp_path):
    from dllm.training import SFTTrainer

    rows = [{"prompt": "greet Zorblax", "response": "hello Zorblax"}]
    cfg = _micro(tmp_path / "run", max_steps=1, model={"config": dict(MICRO_MODEL)})
    trainer = SFTTrainer(args=cfg, train_dataset=rows)
    trainer.setup_models()
    tok = trainer.tokenizer
    assert tok.unk_token_id not in tok("hello Zorblax")["input_ids"]


def test_distill_from_python_with_a_dataset(tmp_path):
    from dllm.testing import save_tiny_checkpoint
    from dllm.training import DistillTrainer

    save_tiny_checkpoint(tmp_path / "base")
    cfg = DistillConfig(run_dir=str(tmp_path / "run"), max_steps=2, batch_size=2, num_threads=1, log_every=1,
                        save_every=0, progress=False, block_size=4, data={"max_new_tokens": 8})
    result = DistillTrainer(args=cfg, model=str(tmp_path / "base"), train_dataset=ROWS).train()
    assert result.status == "finished" and (result.export_dir / "model.safetensors").exists()
    assert float(_metrics(tmp_path / "run")[-1]["loss_train_dataset"]) >= 0


def _recipe_class(name: str):
    from dllm.training.grpo_config import GRPOConfig

    if name.startswith("grpo") or name == "smoke-grpo":
        return GRPOConfig
    said = re.findall(r"dllm train (sft|distill)", (REPO / "recipes" / f"{name}.yaml").read_text())
    if said:  # the recipe's own command names its trainer
        return {"sft": SFTConfig, "distill": DistillConfig}[said[0]]
    return DistillConfig if "d2f" in name or "distill" in name else SFTConfig


@pytest.mark.parametrize("recipe", sorted(p.stem for p in (REPO / "recipes").glob("*.yaml")))
def test_run_dir_override_moves_the_export(recipe, tmp_path):
    """No recipe pins export_dir: it defaults to <run_dir>/final, so run_dir=... moves the model too."""
    from dllm.training.engine import export_path

    cfg = load_config(_recipe_class(recipe), REPO / "recipes" / f"{recipe}.yaml", [f"run_dir={tmp_path / 'mine'}"])
    assert cfg.export_dir is None and export_path(cfg) == tmp_path / "mine" / "final"


def test_a_run_on_a_dataset_resumes_bit_identically(tmp_path):
    import torch
    from safetensors.torch import load_file

    from dllm.training import SFTTrainer

    rows = ROWS * 3  # more rows than a step reads: the epoch order and cursor matter
    flat = {"optim": {"lr": 1e-3, "warmup_steps": 0, "schedule": "constant"}}  # the same lr whatever max_steps says
    SFTTrainer(args=_micro(tmp_path / "a", max_steps=4, **flat), train_dataset=rows).train()
    SFTTrainer(args=_micro(tmp_path / "b", max_steps=2, **flat), train_dataset=rows).train()
    resumed = SFTTrainer(args=_micro(tmp_path / "b", max_steps=4, resume=True, **flat), train_dataset=rows).train()
    assert resumed.step == 4
    a, b = (load_file(str(tmp_path / d / "final" / "model.safetensors")) for d in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
