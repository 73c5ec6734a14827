"""lm-eval integration: the `dllm` model on local JSONL tasks (no downloads)."""

import json
import math
import sys

import pytest
import torch

pytest.importorskip("lm_eval")

from dllm.eval.lm_eval_adapter import mc_loglikelihood  # noqa: E402
from dllm.eval.tasks import get_suite  # noqa: E402
from dllm.generation import DiffusionGenerationConfig  # noqa: E402
from dllm.testing import save_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm")
    model, tok = save_tiny_checkpoint(d / "ckpt", generation_config=DiffusionGenerationConfig(max_new_tokens=8, block_length=8))
    exs = get_suite("arith").examples("test", 3)
    with open(d / "arith.jsonl", "w") as f:
        for e in exs:
            f.write(json.dumps({"prompt": e.prompt, "answer": e.answer, "choices": [e.answer, "1"], "label": 0}) + "\n")
    tasks = d / "tasks"
    tasks.mkdir()
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {d}/arith.jsonl\ntest_split: test\n"
    (tasks / "gen.yaml").write_text(
        "task: dllm_local_gen\n" + common + 'output_type: generate_until\ndoc_to_text: "{{prompt}}"\n'
        'doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 8\n'
        "metric_list:\n  - metric: exact_match\n")
    (tasks / "mc.yaml").write_text(
        "task: dllm_local_mc\n" + common + 'output_type: multiple_choice\ndoc_to_text: "{{prompt}}"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n')
    return d, model, tok


def test_single_token_estimate_is_exact_log_prob(ckpt):
    _, model, tok = ckpt
    mask = tok.mask_token_id
    ctx, cont = [5, 6, 7, 8], [9]
    est = mc_loglikelihood(model, ctx, cont, mask_id=mask, mc_num=4, batch_size=2)
    with torch.no_grad():
        logits = model(torch.tensor([ctx + [mask]])).logits[0, -1].float()
    assert est == pytest.approx(float(torch.log_softmax(logits, -1)[9]), abs=1e-4)


def test_estimate_is_deterministic_and_negative(ckpt):
    _, model, tok = ckpt
    a = mc_loglikelihood(model, [5, 6], [7, 8, 9], mask_id=tok.mask_token_id, mc_num=8, batch_size=4, seed=1)
    b = mc_loglikelihood(model, [5, 6], [7, 8, 9], mask_id=tok.mask_token_id, mc_num=8, batch_size=4, seed=1)
    assert a == b and a < 0 and math.isfinite(a)


@pytest.mark.slow
def test_lm_eval_cli_on_local_tasks(ckpt, tmp_path, monkeypatch):
    d, _, _ = ckpt
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from dllm.eval.lm_eval_adapter import main

    out = tmp_path / "out"
    main(["--model", "dllm", "--model_args", f"pretrained={d}/ckpt,strategy=threshold,threshold=0.5,mc_num=2,mc_batch_size=2",
          "--tasks", "dllm_local_gen,dllm_local_mc", "--include_path", str(d / "tasks"), "--output_path", str(out)])
    files = list(out.rglob("results_*.json"))
    assert files, "lm-eval wrote no results"
    results = json.loads(files[0].read_text())["results"]
    assert "exact_match,none" in results["dllm_local_gen"]
    assert 0.0 <= results["dllm_local_mc"]["acc,none"] <= 1.0


def test_model_args_the_strategy_does_not_read_are_refused(ckpt):
    from dllm.eval.lm_eval_adapter import DLLMEvalModel

    with pytest.raises(ValueError, match="unknown dllm model_args"):
        DLLMEvalModel(pretrained=str(ckpt[0] / "ckpt"), no_such_arg=1)
    with pytest.raises(ValueError, match=r"model_args: strategy 'vanilla' does not read lopa_branches \(read by lopa\)"):
        DLLMEvalModel(pretrained=str(ckpt[0] / "ckpt"), strategy="vanilla", lopa_branches=2)
    assert DLLMEvalModel(pretrained=str(ckpt[0] / "ckpt"), strategy="vanilla", steps=8).gen_config.steps == 8


@pytest.mark.parametrize("model_args,msg", [
    ("pretrained={ckpt},strategy=warp", "unknown strategy 'warp'"),
    ("pretrained={ckpt},strategy=vanilla,lopa_branches=2", "strategy 'vanilla' does not read lopa_branches"),
    ("pretrained={ckpt},no_such_arg=1", "unknown dllm model_args ['no_such_arg']"),
    ("pretrained={ckpt},threshold=2", "threshold must be in [0, 1], got 2"),
    ("pretrained=/no/such/model", "neither a bundled name"),
])
@pytest.mark.parametrize("form", ["comma", "spaces"])
def test_dllm_model_args_are_checked_before_lm_eval_starts(ckpt, monkeypatch, model_args, msg, form):
    """lm-eval indexes every task it knows (about 15 s) before it builds the model: the dllm model's arguments
    fail first, in either of lm-eval's spellings (``a=1,b=2`` or ``a=1 b=2``)."""
    import lm_eval.__main__
    from typer.testing import CliRunner

    from dllm.cli import _mount_subcommands, app

    d, _, _ = ckpt
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: pytest.fail("lm-eval started"))
    _mount_subcommands()
    args = model_args.format(ckpt=f"{d}/ckpt")
    args = args.split(",") if form == "spaces" else [args]
    r = CliRunner().invoke(app, ["lm-eval", "--model", "dllm", "--model_args", *args, "--tasks", "dllm_local_gen"])
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output


def test_valid_model_args_and_other_models_reach_lm_eval(ckpt, monkeypatch):
    import lm_eval.__main__

    from dllm.eval.lm_eval_adapter import main

    d, _, _ = ckpt
    calls = []
    monkeypatch.setattr(lm_eval.__main__, "cli_evaluate", lambda: calls.append(list(sys.argv)))
    main(["--model", "dllm", "--model_args", f"pretrained={d}/ckpt,strategy=threshold,threshold=0.5,mc_num=2",
          "--tasks", "t"])
    main(["--model", "hf", "--model_args", "pretrained=/no/such/model,strategy=warp", "--tasks", "t"])
    main(["--model", "dllm", "--model_args", "pretrained=tiny", "--no_such_flag"])  # lm-eval's parser says why
    assert len(calls) == 3


# Each lm-eval call indexes every task it knows (~15 s here): one of lm-eval's own errors.
@pytest.mark.parametrize("model_args,tasks,msg", [
    ("pretrained={ckpt}", "no_such_task", "Tasks not found"),
])
def test_dllm_lm_eval_user_errors_are_one_line(ckpt, monkeypatch, model_args, tasks, msg):
    from typer.testing import CliRunner

    from dllm.cli import _mount_subcommands, app

    d, _, _ = ckpt
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _mount_subcommands()
    r = CliRunner().invoke(app, ["lm-eval", "--model", "dllm", "--model_args", model_args.format(ckpt=f"{d}/ckpt"),
                                 "--tasks", tasks, "--include_path", str(d / "tasks")])
    assert r.exit_code == 2, r.output
    assert msg in r.output and "Traceback" not in r.output


@pytest.mark.slow
def test_the_stock_lm_eval_command_against_dllm_serve(ckpt, served_tiny_d2f, tmp_path):
    """The other route, with nothing of dllm's inside lm-eval: `lm_eval --model local-chat-completions`
    (lm-eval's `api` extra) against `dllm serve`, on the same local task."""
    import os
    import shutil
    import subprocess
    import sys

    d, _, _ = ckpt
    lm_eval = shutil.which("lm_eval", path=os.path.dirname(sys.executable))
    if lm_eval is None:
        pytest.skip("lm-eval's command is not installed beside this python")
    pytest.importorskip("tenacity", reason="lm-eval's api extra: pip install 'lm-eval[api]'")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    url = f"http://127.0.0.1:{served_tiny_d2f}/v1/chat/completions"
    run = subprocess.run([lm_eval, "--model", "local-chat-completions", "--model_args",
                          f"model=tiny-d2f,base_url={url},tokenizer_backend=None,num_concurrent=1",
                          "--apply_chat_template", "--tasks", "dllm_local_gen", "--include_path", str(d / "tasks"),
                          "--output_path", str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    [result] = list((tmp_path / "out").rglob("results_*.json"))
    score = json.loads(result.read_text())["results"]["dllm_local_gen"]["exact_match,none"]
    assert score >= 2 / 3  # the bundled model answers these arith prompts (3 of them)
