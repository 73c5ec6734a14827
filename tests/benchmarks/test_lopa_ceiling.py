"""benchmarks/lopa_ceiling.py: the one-block-per-round TPF ceiling next to d2f and LoPA."""

import json


def test_ceiling_rounds(load_benchmark):
    ceil = load_benchmark("lopa_ceiling").ceiling_rounds
    assert [ceil(n, 8) for n in (1, 7, 8, 9, 16, 17)] == [1, 1, 1, 2, 2, 3]
    assert ceil(0, 8) == 1  # a row still takes its first round


def test_ceiling_bounds_every_strategy(tmp_path, capsys, run_benchmark):
    path = tmp_path / "ceiling.json"
    result = run_benchmark("lopa_ceiling", ["--suite", "arith", "--n", "3", "--branches", "0,2",
                                            "--json", str(path)])
    rows = result["rows"]
    assert [r["lopa_branches"] for r in rows] == [0, 2]
    B = result["block_length"]
    for r in rows:
        # the pipeline cannot beat one round per block: measured rounds never fall below the ceiling's
        assert r["rounds"] >= r["ceiling_rounds"] >= 3
        assert r["tpf"] <= r["ceiling_tpf"] + 1e-9 <= B + 1e-9
        assert 0.0 <= r["accuracy"] <= 1.0
    assert rows[0]["ceiling_over_d2f"] == rows[0]["ceiling_tpf"] / rows[0]["tpf"]
    assert json.loads(path.read_text())["rows"] == rows
    out = capsys.readouterr().out
    assert "ceil/d2f" in out and "lopa k=2" in out


def test_block_length_override(run_benchmark):
    result = run_benchmark("lopa_ceiling", ["--suite", "arith", "--n", "2", "--branches", "0",
                                            "--block-length", "16", "--set", "skip_threshold=0.9"])
    assert result["block_length"] == 16 and result["overrides"] == {"skip_threshold": 0.9, "block_length": 16}
    assert result["rows"][0]["ceiling_tpf"] <= 16


def test_reference_answers_ceiling(run_benchmark):
    """--reference: no decoding; each reference answer's tokens plus the EOS, and the ceiling per block size."""
    from dllm.eval.tasks import get_suite
    from dllm.loading import resolve_model_path
    from dllm.tokenization import load_tokenizer

    result = run_benchmark("lopa_ceiling", ["--reference", "--model", "tiny", "--suite", "arith,sudoku9",
                                            "--n", "4", "--blocks", "8,32"])
    rows = {(r["suite"], r["block_length"]): r for r in result["rows"]}
    assert list(rows) == [("arith", 8), ("arith", 32), ("sudoku9", 8), ("sudoku9", 32)]
    # tiny pads every number to 4 digits: an arith answer is 4 tokens + EOS, one round at any block size
    assert rows["arith", 8]["ceiling_tpf"] == rows["arith", 32]["ceiling_tpf"] == 5.0
    assert rows["arith", 8]["lengths"]["min"] == rows["arith", 8]["lengths"]["max"] == 5
    tok = load_tokenizer(resolve_model_path("tiny"))
    lengths = [len(tok(e.answer, add_special_tokens=False)["input_ids"]) + 1
               for e in get_suite("sudoku9").examples("test", 4)]
    for B in (8, 32):
        r = rows["sudoku9", B]
        assert r["tokens"] == sum(lengths) and r["ceiling_rounds"] == sum(-(-L // B) for L in lengths)
        assert r["ceiling_tpf"] == sum(lengths) / r["ceiling_rounds"] <= B
