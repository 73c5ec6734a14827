"""The lm-eval model `dllm` takes an SDAR-format checkpoint by path: generation with the family's own decoder
and the Monte Carlo log-likelihood on the model's block grid."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("lm_eval")

from dllm.eval.lm_eval_adapter import mc_loglikelihood  # noqa: E402
from dllm.eval.tasks import get_suite  # noqa: E402
from dllm.testing import save_tiny_block_checkpoint  # noqa: E402


@pytest.mark.slow
def test_lm_eval_on_an_sdar_checkpoint(tmp_path, monkeypatch):
    ckpt = tmp_path / "sdar"
    model = save_tiny_block_checkpoint(ckpt, "sdar", seed=0, scale=8.0)
    ll = mc_loglikelihood(model, [5, 6, 7, 8, 9], [10, 11], mask_id=3, mc_num=4, batch_size=2, seed=0)
    assert ll < 0
    exs = get_suite("arith").examples("test", 3)
    with open(tmp_path / "arith.jsonl", "w") as f:
        for e in exs:
            f.write(json.dumps({"prompt": e.prompt, "answer": e.answer, "choices": [e.answer, "1"], "label": 0}) + "\n")
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {tmp_path}/arith.jsonl\ntest_split: test\n"
    (tasks / "gen.yaml").write_text(
        "task: sdar_local_gen\n" + common + 'output_type: generate_until\ndoc_to_text: "{{prompt}}"\n'
        'doc_to_target: "{{answer}}"\ngeneration_kwargs:\n  until: ["\\n"]\n  max_gen_toks: 8\n'
        "metric_list:\n  - metric: exact_match\n")
    (tasks / "mc.yaml").write_text(
        "task: sdar_local_mc\n" + common + 'output_type: multiple_choice\ndoc_to_text: "{{prompt}}"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: "{{label}}"\nmetric_list:\n  - metric: acc\n')
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from dllm.eval.lm_eval_adapter import main

    out = tmp_path / "out"
    main(["--model", "dllm", "--model_args", f"pretrained={ckpt},mc_num=2,mc_batch_size=2",
          "--tasks", "sdar_local_gen,sdar_local_mc", "--include_path", str(tasks), "--output_path", str(out)])
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]
    assert "exact_match,none" in results["sdar_local_gen"]
    assert 0.0 <= results["sdar_local_mc"]["acc,none"] <= 1.0
