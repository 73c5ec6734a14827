"""benchmarks/lopa_full_window.py: the full-window attention experiment runs and leaves nothing patched."""

import torch

import decoding.loops.lopa as lopa


def test_full_window_rows_and_cleanup(capsys, run_benchmark):
    before = (lopa.SlotWorker.__init__, lopa.select_winners, lopa._check_commit_noop)
    result = run_benchmark("lopa_full_window", ["--suite", "arith", "--n", "2", "--branches", "0,2"])
    assert set(result) == {("arith", m, k) for m in ("block_causal", "full_window") for k in (0, 2)}
    for row in result.values():
        assert 0.0 <= row["accuracy"] <= 100.0 and row["tpf"] > 0
    assert (lopa.SlotWorker.__init__, lopa.select_winners, lopa._check_commit_noop) == before
    assert "full_window" in capsys.readouterr().out


def test_full_window_changes_the_attention_and_commits_the_winner(load_benchmark):
    from dllm.loading import load_model, resolve_model_path
    from dllm.tokenization import load_tokenizer
    from training.rollouts import encode_prompt

    mod = load_benchmark("lopa_full_window")
    model = load_model("tiny-d2f").eval()
    tok = load_tokenizer(resolve_model_path("tiny-d2f"))
    ids = torch.tensor([encode_prompt(tok, "reverse : Ann Bob Cal Dee Eve")])
    seen = []
    orig = model.forward

    def spy(*a, **k):
        seen.append(k.get("attention_policy"))
        return orig(*a, **k)

    model.forward = spy
    with mod.full_window(model):
        cfg = model.diffusion_generation_config.replace(strategy="lopa", lopa_branches=2, return_dict_in_generate=True)
        model.generate(ids, generation_config=cfg, tokenizer=tok)
    assert seen and all(p == "bidirectional" for p in seen)
    assert model.forward is spy  # restored


def test_winner_cache_rows_are_copied_to_the_other_branches(load_benchmark):
    from dllm.loading import load_model

    mod = load_benchmark("lopa_full_window")
    model = load_model("tiny-d2f").eval()
    rows, groups = 2, 3
    settings = lopa.SlotSettings(prompt_length=4, mask_id=3, use_cache=True, suppress_mask=True, temperature=0.0,
                                 top_p=None, top_k=None, remasking="low_confidence", alpha=0.0, rho=1.0)
    with mod.full_window(model):
        worker = lopa.SlotWorker(model, groups=groups, key_valid=torch.ones(rows, 12, dtype=torch.bool),
                                 settings=settings)
        for buf in (*worker.cache.keys, *worker.cache.values):
            buf.copy_(torch.randn_like(buf))
        # branch-major scores: row 0 -> branch 2 wins, row 1 -> the anchor wins
        score = torch.tensor([0.5, 0.9, 0.1, 0.2, 0.8, 0.3], dtype=torch.float64)
        winners = lopa.select_winners(score, rows, groups)
    assert winners.tolist() == [2, 0]
    for buf in (*worker.cache.keys, *worker.cache.values):
        for g in range(groups):
            assert torch.equal(buf[g * rows + 0], buf[2 * rows + 0])
            assert torch.equal(buf[g * rows + 1], buf[0 * rows + 1])
