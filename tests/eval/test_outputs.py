"""Output paths of long runs are checked before the run (eval/outputs.py)."""

import argparse

import pytest

from dllm.eval.outputs import IMAGE_FORMATS, OutputPathError, check_output_args, prepare_output_file


def test_prepare_output_file_creates_the_folder_and_writes_nothing(tmp_path):
    out = tmp_path / "a" / "b" / "report.json"
    assert prepare_output_file(out) == out
    assert out.parent.is_dir() and not out.exists()
    out.write_text("{}")
    assert prepare_output_file(out) == out  # an existing file may be overwritten
    assert prepare_output_file(str(tmp_path / "fig.PNG"), IMAGE_FORMATS).name == "fig.PNG"


def test_prepare_output_file_rejects_what_cannot_become_the_file(tmp_path):
    with pytest.raises(OutputPathError, match="is a folder"):
        prepare_output_file(tmp_path)
    blocker = tmp_path / "plain-file"
    blocker.write_text("")
    with pytest.raises(OutputPathError, match="cannot create the folder"):
        prepare_output_file(blocker / "out.json")
    with pytest.raises(OutputPathError, match=r"unknown file format '\.xyz'; use one of: png"):
        prepare_output_file(tmp_path / "fig.xyz", IMAGE_FORMATS)
    with pytest.raises(OutputPathError, match="'\\(none\\)'"):
        prepare_output_file(tmp_path / "fig", IMAGE_FORMATS)


def test_check_output_args_ends_the_script_with_a_usage_error(tmp_path, capsys):
    ap = argparse.ArgumentParser(prog="script")
    check_output_args(ap, None, tmp_path / "new" / "r.json")  # None = option not given
    assert (tmp_path / "new").is_dir()
    with pytest.raises(SystemExit) as exit_info:
        check_output_args(ap, tmp_path)
    assert exit_info.value.code == 2
    assert "script: error:" in capsys.readouterr().err
