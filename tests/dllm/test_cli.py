"""dllm generate: text, one status line, --json, clear errors."""

import json

import pytest
from typer.testing import CliRunner

from dllm.cli import _mount_subcommands, app
from dllm.generation import DiffusionGenerationConfig
from dllm.testing import save_tiny_checkpoint


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    save_tiny_checkpoint(d, generation_config=DiffusionGenerationConfig(max_new_tokens=16, block_length=8))
    return d


def test_generate_json(ckpt):
    r = CliRunner().invoke(app, ["generate", "What is 2 + 3 ?", "--model", str(ckpt), "--strategy", "threshold",
                                 "--threshold", "0.5", "--cache", "dual", "--json"])
    assert r.exit_code == 0, r.output
    payload = json.loads(next(line for line in r.output.splitlines() if line.startswith("{")))
    assert set(payload) >= {"text", "num_forwards", "generated_tokens", "tpf", "seconds", "finish_reason"}
    assert payload["num_forwards"] >= 1 and payload["tpf"] == pytest.approx(
        payload["generated_tokens"] / payload["num_forwards"], abs=1e-3)
    assert payload["finish_reason"] in ("stop", "length") and payload["strategy"] == "threshold"


def test_generate_text_and_status_line(ckpt):
    r = CliRunner().invoke(app, ["generate", "reverse : Ann Bob", "--model", str(ckpt), "--max-new-tokens", "8"])
    assert r.exit_code == 0, r.output
    assert "forwards=" in r.output and "tpf=" in r.output and "tokens/s=" in r.output and "finish=" in r.output


@pytest.mark.parametrize("args,msg", [
    (["--strategy", "warp"], "unknown strategy 'warp'"),
    (["--strategy", "d2f"], "needs a block-causal model"),
    (["--threshold", "2"], "threshold must be in [0, 1]"),
    (["--model", "/no/such/dir"], "neither a bundled name"),
    (["--device", "tpu"], "is not a torch device"),
    (["--set", "foo=1"], "unknown generation option(s) foo; valid: alg_temp"),
    (["--set", "threshold"], "expected KEY=VALUE, got 'threshold'"),
    (["--set", "threshold=high"], "threshold='high' must be a finite number"),
    (["--batch-size", "0"], "--batch-size must be >= 1"),
    (["--strategy", "vanilla", "--threshold", "0.5"], "strategy 'vanilla' does not read threshold (read by threshold,"),
    (["--lopa-branches", "2"], "strategy 'threshold' does not read lopa_branches (read by lopa); leave it out"),
])
def test_generate_user_errors_are_clear(ckpt, args, msg):
    base = ["generate", "hi", "--model", str(ckpt)]
    r = CliRunner().invoke(app, base + args)
    assert r.exit_code == 2 and msg in r.output and "Traceback" not in r.output


def test_subcommands_mounted():
    _mount_subcommands()
    _mount_subcommands()
    names = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert {"generate", "bench", "train"} <= names


def test_generate_branch_parallel_matches_single_process(tmp_path):
    save_tiny_checkpoint(tmp_path, block_causal=True, block_size=8,
                         generation_config=DiffusionGenerationConfig(strategy="d2f", max_new_tokens=16, block_length=8))
    args = ["generate", "What is 2 + 3 ?", "--model", str(tmp_path), "--strategy", "lopa", "--lopa-branches", "2", "--json"]
    single = CliRunner().invoke(app, args)
    multi = CliRunner().invoke(app, args + ["--branch-parallel", "2"])
    assert single.exit_code == 0 and multi.exit_code == 0, multi.output
    a = json.loads(next(line for line in single.output.splitlines() if line.startswith("{")))
    b = json.loads(next(line for line in multi.output.splitlines() if line.startswith("{")))
    assert (a["text"], a["num_forwards"], a["generated_tokens"]) == (b["text"], b["num_forwards"], b["generated_tokens"])


def test_generate_text_rejects_non_text_prompts(ckpt):
    from dllm import generate_text, load_model, load_tokenizer
    from dllm.generation import GenerationConfigError

    model, tok = load_model(ckpt), load_tokenizer(ckpt)
    with pytest.raises(GenerationConfigError, match="a str or a list of str, got int"):
        generate_text(model, tok, 123)
    with pytest.raises(GenerationConfigError, match="non-str items"):
        generate_text(model, tok, ["hi", None])
    assert generate_text(model, tok, []) == []


def test_version():
    import dllm

    r = CliRunner().invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith(f"dllm {dllm.__version__} (torch ")


def test_generate_set_reaches_any_option_and_flags_win(ckpt, monkeypatch):
    import dllm.text

    seen = []
    real = dllm.text.generate_text

    def spy(model, tok, prompts, **overrides):
        seen.append(overrides)
        return real(model, tok, prompts, **overrides)

    monkeypatch.setattr(dllm.text, "generate_text", spy)
    r = CliRunner().invoke(app, ["generate", "hi", "--model", str(ckpt), "--strategy", "threshold",
                                 "--set", "threshold=0.3", "-s", "cache=dual", "--threshold", "0.6",
                                 "-s", "stop_at_eos=false"])
    assert r.exit_code == 0, r.output
    assert seen == [{"chat": True, "strategy": "threshold", "threshold": 0.6, "cache": "dual", "stop_at_eos": False}]


def test_generate_reads_prompts_from_stdin_in_batches(ckpt, monkeypatch):
    import dllm.text

    batches = []
    real = dllm.text.generate_text

    def spy(model, tok, prompts, **overrides):
        batches.append(list(prompts))
        return real(model, tok, prompts, **overrides)

    monkeypatch.setattr(dllm.text, "generate_text", spy)
    prompts = ["What is 2 + 3 ?", "reverse : Ann Bob", "sort : Cal Ann", "What is 7 - 1 ?", "copy : Bob"]
    r = CliRunner().invoke(app, ["generate", "-", "--model", str(ckpt), "--json", "--batch-size", "2"],
                           input="\n".join(prompts[:2]) + "\n\n" + "\n".join(prompts[2:]) + "\n")
    assert r.exit_code == 0, r.output
    assert batches == [prompts[:2], prompts[2:4], prompts[4:]]  # blank lines skipped
    rows = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    assert len(rows) == 5 and all(row["num_forwards"] >= 1 for row in rows)
    # the same prompt alone gives the same answer (batch invariance at temperature 0)
    solo = CliRunner().invoke(app, ["generate", prompts[3], "--model", str(ckpt), "--json"])
    assert json.loads(solo.output.splitlines()[-1])["text"] == rows[3]["text"]
    r = CliRunner().invoke(app, ["generate", "-", "--model", str(ckpt)], input="\n  \n")
    assert r.exit_code == 2 and "no prompts on stdin" in r.output


def test_generate_stream_prints_the_same_text_as_it_commits(ckpt, monkeypatch):
    import dllm.decoding.cli as generate_cli

    # vanilla over the whole canvas: one token per forward, several commits to stream
    args = ["generate", "reverse : Ann Bob", "--model", str(ckpt), "--strategy", "vanilla", "--set", "stop_at_eos=false"]
    r = CliRunner().invoke(app, args + ["--json"])
    [plain] = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    chunks = []
    real_write = generate_cli._write
    monkeypatch.setattr(generate_cli, "_write", lambda text: (chunks.append(text), real_write(text)))
    r = CliRunner().invoke(app, args + ["--stream"])
    assert r.exit_code == 0, r.output
    text, status = r.output.rstrip("\n").rsplit("\n", 1)
    assert text == plain["text"] and status.startswith(f"[forwards={plain['num_forwards']} ")
    assert len([c for c in chunks if c.strip()]) > 1  # it arrived in pieces, as committed
    assert "".join(chunks).rstrip("\n") == plain["text"]
    r = CliRunner().invoke(app, ["generate", "hi", "--model", str(ckpt), "--stream", "--json"])
    assert r.exit_code == 2 and "--stream prints plain text" in r.output


def test_info_reads_headers_only_and_matches_the_loaded_model(ckpt):
    from dllm.loading import load_model

    r = CliRunner().invoke(app, ["info", str(ckpt), "--json"])
    assert r.exit_code == 0, r.output
    facts = json.loads(r.output.splitlines()[-1])
    loaded = load_model(ckpt)
    assert facts["parameters"] == sum(p.numel() for p in loaded.parameters())
    assert facts["attention"] == "bidirectional" and facts["model_type"] == loaded.config.model_type
    assert facts["generation_defaults"]["max_new_tokens"] == 16 and facts["generation_defaults"]["block_length"] == 8
    r = CliRunner().invoke(app, ["info", "tiny-d2f"])
    size = sum(p.numel() for p in load_model("tiny-d2f").parameters()) / 1e6
    assert r.exit_code == 0 and "block_causal" in r.output and "strategy=d2f" in r.output and f"({size:.2f}M)" in r.output
    assert 2.5 < size < 4.0  # a few million parameters: the tiny model, not a stub
    r = CliRunner().invoke(app, ["info", "/no/such/model"])
    assert r.exit_code == 2 and "neither a bundled name" in r.output


def test_python_dash_m_dllm_runs_the_cli():
    import subprocess
    import sys

    import dllm

    run = subprocess.run([sys.executable, "-m", "dllm", "--version"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.startswith(f"dllm {dllm.__version__} "), run.stderr
