"""benchmarks/name_probe.py: masked-name accuracy of longlists answers with the rest of the reference shown."""

import json

import pytest


def test_name_slots(load_benchmark):
    mod = load_benchmark("name_probe")
    # "Ann Bob , Cal Dee , Eve Fay": names at 0 1 / 3 4 / 6 7
    assert mod.name_slots(8, "last") == [1, 4, 7] and mod.name_slots(8, "first") == [0, 3, 6]


def test_bundled_tiny_long_pairs_names_in_place(tmp_path, run_benchmark, capsys):
    """tiny-long copies and reverses lists (its card): with the first names shown it reads nearly every last
    name of a copied or reversed list off the prompt; the report covers the chosen ops only."""
    path = tmp_path / "probe.json"
    report = run_benchmark("name_probe", ["--model", "tiny-long", "--suite", "longlists:ops=copy+reverse+sort",
                                          "--n", "2", "--json", str(path)])
    assert json.loads(path.read_text()) == report
    assert list(report["by_op"]) == ["copy", "reverse", "sort"] and report["gen_length"] == 256
    for op in ("copy", "reverse"):
        r = report["by_op"][op]
        assert 2 * 22 <= r["names"] <= 2 * 48 and r["accuracy"] > 0.8
    assert "sort" in capsys.readouterr().out


@pytest.mark.parametrize("argv,match", [(["--suite", "chain"], "must be longlists"),
                                        (["--suite", "longlists:max_items=99"], "max_items"),
                                        (["--gen-length", "16"], "does not fit --gen-length 16")])
def test_bad_arguments_are_named(run_benchmark, capsys, argv, match):
    with pytest.raises(SystemExit) as err:
        run_benchmark("name_probe", ["--model", "tiny-long", "--n", "1", *argv])
    assert err.value.code == 2 and match in capsys.readouterr().err
