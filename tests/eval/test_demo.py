"""make demo's program runs end to end (on small random checkpoints standing in for the bundled ones)."""

from dllm.eval.demo import main
from dllm.generation import DiffusionGenerationConfig
from dllm.testing import save_tiny_checkpoint


def test_demo_runs_and_reports(tmp_path, capsys):
    cfg = DiffusionGenerationConfig(max_new_tokens=16, block_length=8)
    save_tiny_checkpoint(tmp_path / "tiny", generation_config=cfg)
    save_tiny_checkpoint(tmp_path / "d2f", block_causal=True, block_size=8, generation_config=cfg.replace(strategy="d2f"))
    assert main(["--tiny", str(tmp_path / "tiny"), "--tiny-d2f", str(tmp_path / "d2f"), "--tiny-long",
                 str(tmp_path / "tiny"), "--per-suite", "1"]) == 0
    out = capsys.readouterr().out
    for word in ("vanilla", "threshold+dual", "d2f", "speed vs vanilla", "TPF"):
        assert word in out
    assert out.count("[arith]") == 1 and out.count("[sudoku]") == 1
    # the long example: its suite, partial credit and the speed ratio
    assert "Long answer [sudoku9]" in out and "blank" in out and "x vanilla's tokens/s" in out


def test_demo_can_skip_the_long_example(tmp_path, capsys):
    cfg = DiffusionGenerationConfig(max_new_tokens=8, block_length=8)
    save_tiny_checkpoint(tmp_path / "tiny", generation_config=cfg)
    save_tiny_checkpoint(tmp_path / "d2f", block_causal=True, block_size=8, generation_config=cfg.replace(strategy="d2f"))
    assert main(["--tiny", str(tmp_path / "tiny"), "--tiny-d2f", str(tmp_path / "d2f"), "--tiny-long", "none",
                 "--per-suite", "1"]) == 0
    assert "Long answer" not in capsys.readouterr().out


def test_demo_missing_model_is_a_clear_error(tmp_path, capsys):
    assert main(["--tiny", str(tmp_path / "nope")]) == 2
    assert "neither a bundled name" in " ".join(capsys.readouterr().out.split())
