"""Where ``--model`` names resolve to: bundled names, directories, and repo ids already in the
Hugging Face cache (offline: nothing is downloaded)."""

import pytest

from dllm.loading import BUNDLED_DIR, CheckpointError, load_model, resolve_model_path
from dllm.testing import save_tiny_checkpoint


def _fake_hub_cache(root, repo_id: str, commit: str = "0123456789abcdef0123456789abcdef01234567"):
    """The layout ``huggingface-cli download`` leaves: refs/main names the snapshot folder."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    save_tiny_checkpoint(snapshot)
    return snapshot


def test_bundled_names_and_directories(tmp_path):
    assert resolve_model_path("tiny") == BUNDLED_DIR / "tiny"
    assert resolve_model_path(tmp_path) == tmp_path
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="is a file"):
        resolve_model_path(tmp_path / "file")


def test_repo_id_in_the_hub_cache_loads_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a network attempt would fail the test
    snapshot = _fake_hub_cache(tmp_path, "some-org/tiny-llada")
    assert resolve_model_path("some-org/tiny-llada") == snapshot.resolve()
    model = load_model("some-org/tiny-llada")
    assert model.config.model_type == "llada"
    with pytest.raises(CheckpointError, match="or a Hugging Face repo id in the local cache.*huggingface-cli download"):
        resolve_model_path("some-org/not-downloaded")
    with pytest.raises(CheckpointError, match="nor an existing directory;"):
        resolve_model_path("no/such/deep/dir")  # not a repo id: no cache lookup


def test_adapter_repo_id_in_the_hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants
    import torch
    from peft import LoraConfig, get_peft_model

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    base, _ = save_tiny_checkpoint(tmp_path / "base")
    peft_model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)
    snapshot = _fake_hub_cache(tmp_path / "hub", "some-org/tiny-lora")
    for f in snapshot.iterdir():
        f.unlink()
    peft_model.save_pretrained(snapshot)
    ids = torch.tensor([[5, 6, 7, 8]])
    merged = load_model(tmp_path / "base", adapter="some-org/tiny-lora")
    plain = load_model(tmp_path / "base")
    assert (merged(ids).logits - plain(ids).logits).abs().max() > 1e-3
    with pytest.raises(CheckpointError, match="not a PEFT adapter directory"):
        load_model(tmp_path / "base", adapter="some-org/no-such-lora")


def test_stored_parameter_count_reads_sharded_headers(tmp_path):
    from dllm.loading import stored_parameter_count

    model, _ = save_tiny_checkpoint(tmp_path / "one")
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    total = sum(p.numel() for p in model.parameters())
    assert stored_parameter_count(tmp_path / "one") == total == stored_parameter_count(tmp_path / "sharded")
    assert stored_parameter_count(tmp_path) is None  # no safetensors here
