"""Fitting a checkpoint to a tokenizer with another vocabulary (``model.path`` + ``model.tokenizer``)."""

from __future__ import annotations

import pytest
import torch

from dllm.loading import load_model
from dllm.modeling import LLaDAConfig, LLaDAModelLM
from dllm.tokenization import build_tokenizer, save_tokenizer, special_token_ids, tag_origin
from dllm.training.config import ConfigError, DistillConfig, SFTConfig, load_config
from dllm.training.data import suite_texts
from dllm.training.models import match_vocabulary

from .conftest import MICRO_MODEL, micro_overrides

NEW_PIECES = ["▁zebra", "zebra", "▁yak"]


@pytest.fixture(scope="module")
def tokenizer(padded_digit_tokenizer):
    # every checkpoint here starts on the padded-digit vocabulary that the tagged tokenizers grow from
    return padded_digit_tokenizer


@pytest.fixture(scope="module")
def bigger_tokenizer():
    # the padded-digit vocabulary plus three pieces, which sort between old ones and move their ids
    return build_tokenizer(suite_texts(), pad_numbers=4, extra_pieces=NEW_PIECES)


def _checkpoint(path, tokenizer, tied=False):
    torch.manual_seed(0)
    cfg = LLaDAConfig(vocab_size=len(tokenizer), embedding_size=len(tokenizer), rope_theta=10000.0,
                      weight_tying=tied, **special_token_ids(tokenizer), **MICRO_MODEL)
    LLaDAModelLM(cfg).save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("tied", [False, True])
def test_every_token_keeps_its_rows_under_a_bigger_vocabulary(tmp_path, tokenizer, bigger_tokenizer, tied):
    path = _checkpoint(tmp_path / "ckpt", tokenizer, tied)
    old_vocab, new_vocab = tokenizer.get_vocab(), bigger_tokenizer.get_vocab()
    assert any(old_vocab[t] != new_vocab[t] for t in old_vocab)  # ids did move
    before, after = load_model(path).eval(), load_model(path).eval()
    assert match_vocabulary(after, path, bigger_tokenizer) == len(NEW_PIECES)
    assert after.get_input_embeddings().weight.shape[0] == after.config.vocab_size == len(new_vocab)
    assert (after.get_output_embeddings() is None) is tied
    text = "What is 35 + 7 ?"  # tokenized alike by both (the fixture's older cell rule differs after "digit space")
    a = torch.tensor([tokenizer(text)["input_ids"] + [tokenizer.mask_token_id] * 3])
    b = torch.tensor([bigger_tokenizer(text)["input_ids"] + [bigger_tokenizer.mask_token_id] * 3])
    assert tokenizer.tokenize(text) == bigger_tokenizer.tokenize(text)
    with torch.no_grad():
        la, lb = before(a).logits, after(b).logits
    perm = torch.tensor([new_vocab[t] for t in sorted(old_vocab, key=old_vocab.get)])
    torch.testing.assert_close(lb[..., perm], la)  # the same function on every old token
    mean = before.get_input_embeddings().weight.mean(0)
    torch.testing.assert_close(after.get_input_embeddings().weight[new_vocab["▁zebra"]], mean)
    assert match_vocabulary(load_model(path), path, tokenizer) == 0


@pytest.mark.slow
def test_replace_style_tags_leave_a_padded_digit_model_unchanged(tmp_path, tokenizer):
    # how the bundled (padded-digit) models take up number tags: each tag starts from the empty
    # digit it replaces, so the model reads the tagged text as it read the padded text
    tagged = build_tokenizer(suite_texts(), pad_numbers=4, number_tags=True, number_tag_style="replace")
    path = _checkpoint(tmp_path / "ckpt", tokenizer)
    before, after = load_model(path).eval(), load_model(path).eval()
    assert match_vocabulary(after, path, tagged) == len(tagged) - len(tokenizer)
    text = "What is 35 + 7 ?"
    assert tagged.tokenize(text) == ["▁What", "▁is", "▁⟦35⟧", "∅", "3", "5", "▁+", "▁⟦7⟧", "∅", "∅", "7", "▁?"]
    assert [tag_origin(p) or p for p in tagged.tokenize(text)] == tokenizer.tokenize(text)
    a = torch.tensor([tokenizer(text)["input_ids"] + [tokenizer.mask_token_id] * 3])
    b = torch.tensor([tagged(text)["input_ids"] + [tagged.mask_token_id] * 3])
    with torch.no_grad():
        la, lb = before(a).logits, after(b).logits
    old_vocab, new_vocab = tokenizer.get_vocab(), tagged.get_vocab()
    perm = torch.tensor([new_vocab[t] for t in sorted(old_vocab, key=old_vocab.get)])
    torch.testing.assert_close(lb[..., perm], la)
    # every tag, seen in the text or not, gets the logit of the empty digit it stands where
    for tag in ("▁⟦35⟧", "▁⟦7⟧", "▁⟦999⟧"):
        torch.testing.assert_close(lb[..., new_vocab[tag]], la[..., old_vocab["▁∅"]])
    torch.testing.assert_close(lb[..., new_vocab["⟦35⟧"]], la[..., old_vocab["∅"]])


def test_countdown_prompt_tags_with_the_unk_head_keep_a_padded_digit_model_predicting_as_before(tmp_path, tokenizer):
    # tags that no answer contains (number_tag_context) start their head rows from UNK, which the
    # model never had to predict: the tags take almost no probability, so the first steps of a
    # fine-tune do not pay for them
    tagged = build_tokenizer(suite_texts(), pad_numbers=4, number_tags=True, number_tag_style="replace",
                             number_tag_digits=2, number_tag_context="countdown")
    path = _checkpoint(tmp_path / "ckpt", tokenizer)
    before, origin, unk = (load_model(path).eval() for _ in range(3))
    assert match_vocabulary(origin, path, tagged) == match_vocabulary(unk, path, tagged, tag_head="unk") == 220
    text = "What is 35 + 7 ?"  # not a countdown prompt: no tags, same pieces as the padded tokenizer
    assert tagged.tokenize(text) == tokenizer.tokenize(text)
    b = torch.tensor([tagged(text)["input_ids"] + [tagged.mask_token_id] * 3])
    a = torch.tensor([tokenizer(text)["input_ids"] + [tokenizer.mask_token_id] * 3])
    with torch.no_grad():
        la, lo, lu = before(a).logits, origin(b).logits, unk(b).logits
    old_vocab, new_vocab = tokenizer.get_vocab(), tagged.get_vocab()
    perm = torch.tensor([new_vocab[t] for t in sorted(old_vocab, key=old_vocab.get)])
    torch.testing.assert_close(lu[..., perm], la)
    torch.testing.assert_close(lo[..., perm], la)  # the heads differ only on the tags
    tags = torch.tensor([i for t, i in new_vocab.items() if tag_origin(t)])
    torch.testing.assert_close(lu[..., tags], la[..., [old_vocab["<|unk|>"]]].expand(*la.shape[:2], len(tags)))
    # (an untrained model gives UNK a typical logit; the bundled tiny gives it log p < -6.7 on answers)
    torch.testing.assert_close(lo[..., new_vocab["▁⟦35⟧"]], la[..., old_vocab["▁∅"]])
    torch.testing.assert_close(unk.get_input_embeddings().weight[new_vocab["▁⟦35⟧"]],
                               before.get_input_embeddings().weight[old_vocab["▁∅"]])
    with pytest.raises(ValueError, match="tag_head must be one of origin, unk"):
        match_vocabulary(load_model(path), path, tagged, tag_head="mean")
    tied = _checkpoint(tmp_path / "tied", tokenizer, tied=True)
    with pytest.raises(ValueError, match="ties its head to its embedding"):
        match_vocabulary(load_model(tied), tied, tagged, tag_head="unk")


def test_a_checkpoint_without_a_tokenizer_is_refused_when_ids_do_not_fit(tmp_path, tokenizer, bigger_tokenizer):
    path = _checkpoint(tmp_path / "ckpt", tokenizer)
    (path / "tokenizer.json").unlink()
    (path / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer to match them by"):
        match_vocabulary(load_model(path), path, bigger_tokenizer)


def test_sft_from_a_checkpoint_with_a_bigger_tokenizer_exports_the_bigger_model(tmp_path, tokenizer,
                                                                                bigger_tokenizer):
    from dllm.training.sft import SFTTrainer

    path = _checkpoint(tmp_path / "ckpt", tokenizer)
    tok_dir = save_tokenizer(bigger_tokenizer, tmp_path / "tok")
    over = micro_overrides(tmp_path / "run", max_steps=2, **{"model.path": str(path), "model.tokenizer": str(tok_dir)})
    assert SFTTrainer(load_config(SFTConfig, None, over)).run().status == "finished"
    model = load_model(tmp_path / "run" / "final")
    assert model.get_input_embeddings().weight.shape[0] == len(bigger_tokenizer)


def test_distillation_refuses_a_teacher_on_another_vocabulary(tmp_path, tokenizer, bigger_tokenizer):
    from dllm.training.distill import DistillTrainer

    path = _checkpoint(tmp_path / "ckpt", tokenizer)
    tok_dir = save_tokenizer(bigger_tokenizer, tmp_path / "tok")
    over = [f"run_dir={tmp_path / 'run'}", f"model.path={path}", f"model.tokenizer={tok_dir}", f"teacher={path}",
            "max_steps=1", "batch_size=2", "num_threads=1", "progress=false", "block_size=4",
            "data.tasks={arith: 1}", "data.max_new_tokens=8"]
    with pytest.raises(ConfigError, match="same tokenizer"):
        DistillTrainer(load_config(DistillConfig, None, over)).run()
