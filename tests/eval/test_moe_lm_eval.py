"""lm-eval's dllm model and dllm bench on the mixture-of-experts formats (LLaDA2, LLaDA-MoE)."""

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("lm_eval")

from dllm.eval.lm_eval_adapter import DLLMEvalModel  # noqa: E402


@pytest.mark.parametrize("family", ["llada2", "llada-moe"])
def test_lm_eval_model_generates_and_scores(moe_checkpoints, family):
    lm = DLLMEvalModel(pretrained=str(moe_checkpoints[family]), mc_num=2, mc_batch_size=2)
    gen = lm.generate_until([SimpleNamespace(args=("reverse : Ann Bob", {"until": ["\n"], "max_gen_toks": 8}))],
                            disable_tqdm=True)
    assert isinstance(gen[0], str)
    (ll, greedy), = lm.loglikelihood([SimpleNamespace(args=("1 + 1 =", " 2"))], disable_tqdm=True)
    assert math.isfinite(ll) and ll < 0 and isinstance(greedy, bool)


def test_bench_on_llada2_reports_edits(moe_checkpoints):
    from dllm import load_model, load_tokenizer
    from dllm.eval.bench import parse_methods, run_bench

    path = moe_checkpoints["llada2"]
    report = run_bench(load_model(path), load_tokenizer(path), suites="arith", n=2, progress=False,
                       methods=parse_methods("edit,edit:editing_threshold=0.5"))
    plain, editing = report["results"]
    assert plain["edits"] == 0 and editing["edits_per_block"] >= 0 and plain["examples"] == 2
