"""benchmarks/countdown_failures.py: wrong countdown answers by reference shape and kind of error."""

import json

import pytest
import torch

from eval.tasks import Example, get_suite


def _ex():
    return Example("x", "countdown", "numbers 3 5 7 target 22 :", "3 * 5 + 7", {"numbers": [3, 5, 7], "target": 22})


def test_shape_and_classify(load_benchmark):
    cf = load_benchmark("countdown_failures")
    suite = get_suite("countdown")
    assert cf.shape("12 * ( 13 - 6 )") == "n * ( n - n )"
    assert cf.classify(suite.score(_ex(), "7 + 5 * 3")) == "correct"
    assert cf.classify(suite.score(_ex(), "3 * 7 + 5")) == "wrong value"
    assert cf.classify(suite.score(_ex(), "3 * 5 + 5")) == "wrong numbers"
    assert cf.classify(suite.score(_ex(), "7 / 3 + 5")) == "wrong numbers"  # inexact division
    assert cf.classify(suite.score(_ex(), "three")) == "unreadable"
    assert cf.classify(suite.score(_ex(), "3 * 5 = 15 , 15 + 7 = 22")) == "correct"
    assert cf.classify(suite.score(_ex(), "3 * 5 = 15 , 15 + 7 = 23")) == "wrong step"
    assert cf.classify(suite.score(_ex(), "3 * 5 = 15 , 15 + 5 = 20")) == "wrong numbers"
    assert cf.classify(suite.score(_ex(), "3 * 7 = 21 , 21 + 5 = 26")) == "wrong value"
    assert cf.classify(suite.score(_ex(), "3 * 5 = 15 + 7 = 22")) == "correct"  # a chain
    assert cf.classify(suite.score(_ex(), "3 * 5 = 16 + 6 = 22")) == "wrong step"
    assert cf.classify(suite.score(_ex(), "3 * 7 = 21 + 5")) == "wrong value"


def test_step_checks(load_benchmark):
    cf = load_benchmark("countdown_failures")
    assert cf.step_checks("3 * 5 + 7", 22) is None  # a plain expression
    assert cf.step_checks("3 * 5 = 15 , 15 + 7 = 22", 22) == (True, True)
    assert cf.step_checks("9 * 11 = 71 + 14 = 85", 85) == (False, True)  # filled in backwards from the target
    assert cf.step_checks("9 * 11 = 99 + 14 = 113", 85) == (True, False)
    assert cf.step_checks("7 / 2 = 3 + 1 = 4", 4) == (False, True)  # an inexact division is never true


def test_canonical_form(load_benchmark):
    cf = load_benchmark("countdown_failures")
    suite = get_suite("countdown")
    for text, canonical in {"3 * 5 + 7": True, "3 * 5 = 15 , 15 + 7 = 22": True, "3 * 5 = 15 + 7 = 22": True,
                            "7 + 3 * 5": False, "5 * 3 = 15 + 7 = 22": False}.items():
        assert cf.is_canonical(suite.score(_ex(), text), text, "3 * 5 + 7") is canonical, text


def test_counts_add_up(run_benchmark, tmp_path):
    out = tmp_path / "r.json"
    result = run_benchmark("countdown_failures", ["--n", "6", "--batch-size", "4", "--json", str(out)])
    assert json.loads(out.read_text()) == result
    assert sum(result["counts"].values()) == result["n"] == 6
    assert sum(result["right_answers"].values()) == result["counts"]["correct"]
    assert sum(v["n"] for v in result["by_shape"].values()) == 6
    assert sum(v["correct"] for v in result["by_shape"].values()) == result["counts"]["correct"]
    assert result["steps"]["answers"] <= 6 and result["steps"]["first step true"] <= result["steps"]["answers"]
    assert result["block_length"] == 32  # the bundled model's own
    with pytest.raises(SystemExit, match="--block-length"):
        run_benchmark("countdown_failures", ["--n", "1", "--block-length", "7"])
    assert run_benchmark("countdown_failures", ["--n", "2", "--batch-size", "2", "--block-length", "1"])["block_length"] == 1


def test_bad_input_is_a_clear_error(run_benchmark):
    with pytest.raises(SystemExit, match="valid:"):
        run_benchmark("countdown_failures", ["--strategy", "greedy"])
    with pytest.raises(SystemExit, match="at least 1"):
        run_benchmark("countdown_failures", ["--n", "0"])


def test_train_split(run_benchmark):
    result = run_benchmark("countdown_failures", ["--n", "4", "--batch-size", "4", "--split", "train"])
    assert result["split"] == "train" and result["n"] == 4 == sum(result["counts"].values())
    with pytest.raises(SystemExit):
        run_benchmark("countdown_failures", ["--split", "dev"])


def test_unwritable_json_path_fails_before_the_run(run_benchmark, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit):
        run_benchmark("countdown_failures", ["--n", "600", "--json", str(blocker / "out.json")])
    assert "cannot create the folder" in capsys.readouterr().err


def test_pair_problems(load_benchmark, run_benchmark):
    cf = load_benchmark("countdown_failures")
    suite = get_suite("countdown")
    train, test = cf.pair_examples("train", 10_000), cf.pair_examples("test", 10_000)
    assert (len(train), len(test)) == (598, 56)
    assert not {e.meta["key"] for e in train} & {e.meta["key"] for e in test}
    for ex in train[:50] + test:  # every reference is one operation that reaches the target
        assert len(ex.meta["numbers"]) == 2 and suite.score(ex, ex.answer).correct, ex
    result = run_benchmark("countdown_failures", ["--pairs", "--n", "5", "--batch-size", "5"])
    assert result["pairs"] is True and result["n"] == 5 == sum(result["counts"].values())
    assert all(len(s.split()) == 3 for s in result["by_shape"])  # "n op n"


def _tagged_micro_model(cf, path, number_tags=True):
    """A random micro LLaDA model with a countdown-prompt-tag tokenizer whose tag embedding rows
    equal the rows of the empty digits they stand where: it cannot tell a tag from its origin.
    With ``number_tags=False`` the tokenizer pads digits only and the model is left as drawn."""
    from dllm.modeling import LLaDAConfig, LLaDAModelLM
    from dllm.tokenization import build_tokenizer, special_token_ids
    from training.data import suite_texts

    tags = dict(number_tags=True, number_tag_style="replace", number_tag_digits=2, number_tag_context="countdown")
    tok = build_tokenizer(suite_texts(), pad_numbers=4, **(tags if number_tags else {}))
    torch.manual_seed(0)
    cfg = LLaDAConfig(vocab_size=len(tok), embedding_size=len(tok), rope_theta=10000.0, d_model=32, n_layers=1,
                      n_heads=2, n_kv_heads=2, mlp_hidden_size=64, **special_token_ids(tok))
    model = LLaDAModelLM(cfg)
    if number_tags:
        table = cf.tag_ablation_map(tok)
        with torch.no_grad():
            emb = model.get_input_embeddings().weight
            emb.copy_(emb[table])
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return tok


def test_ablate_tags(load_benchmark, run_benchmark, tmp_path):
    cf = load_benchmark("countdown_failures")
    tok = _tagged_micro_model(cf, tmp_path / "m")
    table = cf.tag_ablation_map(tok)
    vocab = tok.get_vocab()
    inv = {i: t for t, i in vocab.items()}
    ids = tok("numbers 3 15 7 target 52 :", add_special_tokens=False)["input_ids"]
    assert [inv[int(i)] for i in table[torch.tensor(ids)]] == [
        "▁numbers", "▁∅", "∅", "∅", "3", "▁∅", "∅", "1", "5", "▁∅", "∅", "∅", "7", "▁target", "▁∅", "∅", "5", "2", "▁:"]
    untouched = [i for t, i in vocab.items() if "⟦" not in t]
    assert table[untouched].tolist() == untouched
    argv = ["--model", str(tmp_path / "m"), "--strategy", "vanilla", "--n", "4", "--batch-size", "2"]
    plain, ablated = run_benchmark("countdown_failures", argv), run_benchmark("countdown_failures", argv + ["--ablate-tags"])
    assert (plain["ablate_tags"], ablated["ablate_tags"]) == (False, True)
    # this model reads a tag exactly as its empty digit, so removing the tags changes nothing
    assert {k: v for k, v in ablated.items() if k != "ablate_tags"} == {k: v for k, v in plain.items() if k != "ablate_tags"}
    assert sum(ablated["counts"].values()) == 4
    plain_dir = tmp_path / "plain"
    _tagged_micro_model(cf, plain_dir, number_tags=False)
    with pytest.raises(SystemExit, match="has no number tags"):
        run_benchmark("countdown_failures", ["--model", str(plain_dir), "--n", "1", "--ablate-tags"])


def test_generate_ablated_feeds_the_mapped_ids(load_benchmark, tmp_path):
    from types import SimpleNamespace

    from dllm import DiffusionGenerationConfig

    cf = load_benchmark("countdown_failures")
    tok = _tagged_micro_model(cf, tmp_path / "m")
    seen = []

    def generate(ids, attention_mask, generation_config):
        seen.append(ids)
        eos = torch.full((ids.shape[0], 1), tok.eos_token_id)
        return SimpleNamespace(sequences=torch.cat([ids, eos], 1))

    cfg = DiffusionGenerationConfig(eos_token_id=tok.eos_token_id, mask_token_id=tok.mask_token_id)
    texts = cf.generate_ablated(SimpleNamespace(generate=generate), tok, ["numbers 3 15 7 target 52 :"], cfg,
                               cf.tag_ablation_map(tok))
    assert texts == [""]
    pieces = tok.convert_ids_to_tokens(seen[0][0].tolist())
    assert "▁⟦15⟧" in tok.tokenize("numbers 3 15 7 target 52 :") and not any("⟦" in p for p in pieces)
