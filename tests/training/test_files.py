"""Training on your own JSON Lines files: the two forms, clear errors, epoch order, ranks, resume."""

from __future__ import annotations

import json

import pytest
import torch

from dllm.training.config import ConfigError, DataSection, SFTConfig, load_config
from dllm.training.data import TaskStream
from dllm.training.encoding import encode_answer, encode_messages, encode_prompt
from dllm.training.files import DataFileError, FileSource, read_records, source_labels

from .conftest import micro_overrides

NAMES = ["Ann", "Bob", "Cal", "Dee", "Eve", "Fay", "Gus", "Hal", "Ida", "Kim", "Lee", "Max"]


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def _pairs(n):
    """``reverse : A B C`` -> ``C B A`` over the bundled tokenizer's words."""
    out = []
    for i in range(n):
        words = [NAMES[(i + j) % len(NAMES)] for j in range(2 + i % 3)]
        out.append({"prompt": "reverse : " + " ".join(words), "response": " ".join(reversed(words))})
    return out


def test_both_forms_are_read(tmp_path):
    f = _write(tmp_path / "d.jsonl", [
        {"prompt": "sort : Bob Ann", "response": "Ann Bob"},
        "",
        {"prompt": "copy : Ann", "completion": "Ann"},
        {"prompt": "copy : Bob", "answer": "Bob"},
        {"messages": [{"role": "user", "content": "copy : Cal"}, {"role": "assistant", "content": "Cal"},
                      {"role": "user", "content": "reverse : Ann Bob"}, {"role": "assistant", "content": "Bob Ann"}]},
    ])
    recs = read_records(f)
    assert [r.answer for r in recs] == ["Ann Bob", "Ann", "Bob", "Bob Ann"]
    assert recs[0].prompt_messages() == [{"role": "user", "content": "sort : Bob Ann"}]
    assert [m["role"] for m in recs[3].prompt_messages()] == ["user", "assistant", "user"]


def test_a_prompt_record_encodes_like_a_suite_example(tmp_path, tokenizer):
    f = _write(tmp_path / "d.jsonl", [{"prompt": "What is 3 + 4 ?", "response": "7"}])
    src = FileSource(str(f), "d", tokenizer, max_new_tokens=16, seed=0)
    assert src.examples == [(encode_prompt(tokenizer, "What is 3 + 4 ?"), encode_answer(tokenizer, "7"))]


def test_multi_turn_prompts_go_through_the_chat_template(tmp_path, tokenizer):
    msgs = [{"role": "user", "content": "copy : Cal"}, {"role": "assistant", "content": "Cal"},
            {"role": "user", "content": "reverse : Ann Bob"}]
    f = _write(tmp_path / "d.jsonl", [{"messages": [*msgs, {"role": "assistant", "content": "Bob Ann"}]}])
    (q, a), = FileSource(str(f), "d", tokenizer, max_new_tokens=16, seed=0).examples
    assert q == encode_messages(tokenizer, msgs)
    toks = tokenizer.convert_ids_to_tokens(q)
    assert toks.count("<|user|>") == 2 and toks[-1] == "<|assistant|>" and "<|eos|>" in toks  # the earlier turn
    assert tokenizer.decode(a, skip_special_tokens=True) == "Bob Ann"


@pytest.mark.parametrize("row, message", [
    ("{not json", r"d.jsonl:2: not valid JSON"),
    ('["a", "b"]', r"d.jsonl:2: expected a JSON object"),
    ({"question": "x", "response": "y"}, r"d.jsonl:2: keys \['question', 'response'\] are neither form"),
    ({"prompt": "x", "response": 3}, r"must be strings"),
    ({"messages": [{"role": "user", "content": "x"}]}, r"at least two messages"),
    ({"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]},
     r"must have role 'assistant', not 'user'"),
    ({"messages": [{"role": "user"}, {"role": "assistant", "content": "y"}]}, r"message 0 needs string"),
])
def test_bad_lines_are_named_with_their_line_number(tmp_path, row, message):
    f = _write(tmp_path / "d.jsonl", [{"prompt": "a", "response": "b"}, row])
    with pytest.raises(DataFileError, match=message):
        read_records(f)


def test_missing_empty_and_binary_files(tmp_path):
    with pytest.raises(DataFileError, match="does not exist"):
        read_records(tmp_path / "nope.jsonl")
    with pytest.raises(DataFileError, match="holds no examples"):
        read_records(_write(tmp_path / "e.jsonl", ["", "  "]))
    (tmp_path / "b.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DataFileError, match="not UTF-8"):
        read_records(tmp_path / "b.jsonl")


def test_examples_that_cannot_fit_are_dropped_and_counted(tmp_path, tokenizer):
    rows = _pairs(4) + [{"prompt": "copy : " + " ".join(NAMES), "response": " ".join(NAMES)},  # long answer
                        {"prompt": "copy : " + " ".join(NAMES * 3), "response": "Ann"},  # long prompt
                        {"prompt": "copy : Zorblax", "response": "Zorblax"}]  # unknown word
    f = _write(tmp_path / "d.jsonl", rows)
    src = FileSource(str(f), "d", tokenizer, max_new_tokens=8, seed=0, max_prompt_tokens=20)
    assert (src.read, len(src.examples), src.too_long_answer, src.too_long_prompt, src.with_unk) == (7, 5, 1, 1, 1)
    s = src.summary()
    assert "5 of 7 examples used" in s and "data.max_new_tokens" in s and "context" in s and "unknown token" in s
    with pytest.raises(DataFileError, match="none of its 7 examples fits"):
        FileSource(str(f), "d", tokenizer, max_new_tokens=1, seed=0)


def test_every_epoch_is_a_permutation_split_between_ranks(tmp_path, tokenizer):
    f = str(_write(tmp_path / "d.jsonl", _pairs(10)))
    one = FileSource(f, "d", tokenizer, 16, seed=3)
    everything = sorted(map(str, one.examples))
    epoch0 = [one.example(c) for c in range(10)]
    epoch1 = [one.example(c) for c in range(10, 20)]
    assert sorted(map(str, epoch0)) == everything == sorted(map(str, epoch1))
    assert epoch0 != epoch1  # a fresh order per epoch
    assert epoch0 == [FileSource(f, "d", tokenizer, 16, seed=3).example(c) for c in range(10)]
    assert epoch0 != [FileSource(f, "d", tokenizer, 16, seed=4).example(c) for c in range(10)]
    ranks = [FileSource(f, "d", tokenizer, 16, seed=3, rank=r, world_size=2) for r in range(2)]
    split = [[ranks[r].example(c) for c in range(5)] for r in range(2)]
    assert sorted(map(str, split[0] + split[1])) == everything  # disjoint, and together the whole epoch
    assert split[0] == epoch0[0::2] and split[1] == epoch0[1::2]


def test_labels_are_unique_and_never_a_suite_name():
    assert source_labels(["a/train.jsonl", "b/train.jsonl", "x/gsm.jsonl"]) == {
        "a/train.jsonl": "train", "b/train.jsonl": "train-2", "x/gsm.jsonl": "gsm-2"}


def _file_stream(tokenizer, path, **kw):
    cfg = DataSection(tasks=kw.pop("tasks", {}), files={str(path): 1.0}, max_new_tokens=16, chunk_size=16,
                      eos_pad="random", mix=kw.pop("mix", "per_example"))
    return TaskStream(tokenizer, cfg, batch_size=4, seed=0, **kw)


def test_the_stream_trains_on_files_alone_or_mixed_and_resumes(tmp_path, tokenizer):
    f = _write(tmp_path / "mine.jsonl", _pairs(7))  # 7 examples: batches of 4 cross epoch boundaries
    s = _file_stream(tokenizer, f)
    assert s.names == ["mine"] and s.notes == [f"data file {f} (mine): 7 of 7 examples used"]
    answers = {tuple(encode_answer(tokenizer, r["response"])) for r in _pairs(7)}
    first = [s.next_batch() for _ in range(6)]
    for b in first:
        assert b.suites == ["mine"] * 4
        for row in b.input_ids[:, b.prompt_length:].tolist():
            eos = row.index(tokenizer.eos_token_id)
            assert tuple(row[: eos + 1]) in answers
    resumed = _file_stream(tokenizer, f)
    half = _file_stream(tokenizer, f)
    for _ in range(3):
        half.next_batch()
    resumed.load_state_dict(half.state_dict())
    for want in first[3:]:
        assert torch.equal(resumed.next_batch().input_ids, want.input_ids)
    mixed = _file_stream(tokenizer, f, tasks={"arith": 1.0})
    seen = {x for _ in range(10) for x in mixed.next_batch().suites}
    assert seen == {"arith", "mine"}


def test_the_model_context_bounds_file_prompts(tmp_path, tokenizer):
    f = _write(tmp_path / "d.jsonl", _pairs(3) + [{"prompt": "copy : " + " ".join(NAMES * 3), "response": "Ann"}])
    s = _file_stream(tokenizer, f, max_length=40, pad_multiple=8)  # prompts may take 40 - 16 tokens
    assert s.files["d"].too_long_prompt == 1 and len(s.files["d"].examples) == 3


def test_config_checks_files_and_weights(tmp_path):
    f = _write(tmp_path / "d.jsonl", _pairs(3))
    cfg = load_config(SFTConfig, None, ["model.path=tiny", "data.tasks={}", f"data.files={{{f}: 2}}"])
    assert cfg.data.files == {str(f): 2}
    with pytest.raises(ConfigError, match="nope.jsonl does not exist"):
        load_config(SFTConfig, None, [f"data.files={{{tmp_path / 'nope.jsonl'}: 1}}"])
    with pytest.raises(ConfigError, match="at least one source with a positive weight"):
        load_config(SFTConfig, None, ["data.tasks={}"])
    bad = _write(tmp_path / "bad.jsonl", _pairs(2) + [{"prompt": "x"}])
    with pytest.raises(ConfigError, match=r"data.files: .*bad.jsonl:3: keys \['prompt'\] are neither form"):
        load_config(SFTConfig, None, [f"data.files={{{bad}: 1}}"])
    with pytest.raises(ConfigError, match="numbers >= 0"):
        load_config(SFTConfig, None, [f"data.files={{{f}: -1}}"])
    from dllm.training.grpo_config import GRPOConfig, validate_grpo

    g = load_config(GRPOConfig, None, ["model.path=tiny-d2f"])
    g.data.files = {str(f): 1.0}
    validate_grpo(g)  # GRPO reads a file's prompts and scores them against its answers
    g.data.files = {str(bad): 1.0}  # a prompt alone has nothing to match without a reward function
    with pytest.raises(ConfigError, match=r"bad.jsonl:3: keys \['prompt'\] are neither form"):
        validate_grpo(g)


def test_sft_from_scratch_on_a_file_alone(tmp_path, capsys):
    """No suite at all: the tokenizer is built from the file's words, and in-training eval says it is off."""
    from dllm.training.sft import SFTTrainer

    f = _write(tmp_path / "mine.jsonl", [{"prompt": "greet Zorblax", "response": "hello Zorblax"},
                                          {"prompt": "greet Quux", "response": "hello Quux"}])
    over = micro_overrides(tmp_path / "run", max_steps=3, eval_every=2, **{
        "data.tasks": "{}", "data.files": f"{{{f}: 1}}", "model.tokenizer": "null"})
    trainer = SFTTrainer(load_config(SFTConfig, None, over))
    result = trainer.run()
    assert result.status == "finished"
    assert trainer.tokenizer.unk_token_id not in trainer.tokenizer("hello Zorblax Quux")["input_ids"]
    err = capsys.readouterr().err
    assert f"data file {f} (mine): 2 of 2 examples used" in err and "in-training evaluation is off" in err
    import csv

    rows = list(csv.DictReader((tmp_path / "run" / "metrics.csv").open()))
    assert len(rows) == 3 and all(float(r["loss_mine"]) > 0 for r in rows)


def test_a_bad_data_file_is_a_one_line_cli_error(tmp_path):
    from typer.testing import CliRunner

    from dllm.training.cli import train_app

    f = _write(tmp_path / "d.jsonl", _pairs(2) + ["{oops"])
    res = CliRunner().invoke(train_app, ["sft", *micro_overrides(tmp_path / "run", **{
        "data.tasks": "{}", "data.files": f"{{{f}: 1}}"})])
    assert res.exit_code == 2
    assert f"{f}:3: not valid JSON" in res.output and "Traceback" not in res.output


def test_the_example_recipe_loads_and_its_data_is_what_the_script_writes(tmp_path, monkeypatch):
    import importlib.util
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)  # the recipe names its file relative to the repository root, as documented
    cfg = load_config(SFTConfig, repo / "recipes" / "tiny-own-data.yaml")
    assert cfg.data.files == {"recipes/data/reverse-sort-train.jsonl": 10.0} and cfg.model.path == "tiny"
    from dllm.training.config import DistillConfig

    student = load_config(DistillConfig, repo / "recipes" / "tiny-d2f-own-data.yaml")
    assert student.teacher == "runs/tiny-own-data/final" and student.data.files == {
        "recipes/data/reverse-sort-train.jsonl": 12.0}
    spec = importlib.util.spec_from_file_location("make_reverse_sort", repo / "recipes" / "data" / "make_reverse_sort.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--out", str(tmp_path)])
    for split in ("train", "test"):
        name = f"reverse-sort-{split}.jsonl"
        assert (tmp_path / name).read_text() == (repo / "recipes" / "data" / name).read_text()
    test = {r.messages[0][1] for r in read_records(tmp_path / "reverse-sort-test.jsonl")}
    train = {r.messages[0][1] for r in read_records(tmp_path / "reverse-sort-train.jsonl")}
    assert len(test) == 200 and len(train) == 2000 and not test & train
    r = read_records(tmp_path / "reverse-sort-test.jsonl")[0]
    assert r.answer.split() == sorted(r.messages[0][1].split(" : ")[1].split(), reverse=True)


def test_a_run_on_a_file_resumes_bit_identically(tmp_path):
    from safetensors.torch import load_file

    from dllm.training.sft import SFTTrainer

    f = _write(tmp_path / "mine.jsonl", _pairs(5))  # 4 per micro-batch: epochs end mid-batch

    def over(run):
        return micro_overrides(tmp_path / run, max_steps=6, save_every=3, **{
            "data.tasks": "{arith: 1}", "data.files": f"{{{f}: 2}}", "data.mix": "per_example"})

    SFTTrainer(load_config(SFTConfig, None, over("a"))).run()

    class Crash(SFTTrainer):
        calls = 0

        def compute_loss(self, model, batch, generator):
            Crash.calls += 1
            if Crash.calls == 5:  # during step 5, after the step-3 checkpoint
                raise RuntimeError("simulated crash")
            return super().compute_loss(model, batch, generator)

    with pytest.raises(RuntimeError, match="simulated crash"):
        Crash(load_config(SFTConfig, None, over("b"))).run()
    assert SFTTrainer(load_config(SFTConfig, None, over("b") + ["resume=true"])).run().step == 6
    a = load_file(str(tmp_path / "a" / "checkpoints" / "step-0000006" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "checkpoints" / "step-0000006" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
