"""An exported model decodes as the model training started from, where that still applies."""

import json

from dllm import load_tokenizer
from dllm.loading import resolve_model_path
from dllm.training.models import generation_defaults


def _saved(name: str) -> dict:
    return json.loads((resolve_model_path(name) / "generation_config.json").read_text())["dllm"]


def test_a_fine_tune_keeps_the_start_models_decoding_defaults():
    tok = load_tokenizer("tiny-d2f")
    gen = generation_defaults(tok, 64, 8, start="tiny-d2f")["dllm"]
    assert gen["skip_threshold"] == _saved("tiny-d2f")["skip_threshold"] == 0.97  # tuned, not the library's 0.9
    assert gen["strategy"] == "d2f" and gen["block_length"] == 8 and gen["max_new_tokens"] == 64
    assert gen["mask_token_id"] == tok.mask_token_id and gen["eos_token_id"] == tok.eos_token_id
    bidirectional = generation_defaults(load_tokenizer("tiny"), 48, None, start="tiny")["dllm"]
    assert bidirectional["strategy"] == _saved("tiny")["strategy"] and bidirectional["max_new_tokens"] == 48


def test_a_change_of_attention_starts_from_the_library_defaults():
    """A D2F student distilled from the bidirectional teacher's weights decodes with d2f, not the teacher's rule."""
    gen = generation_defaults(load_tokenizer("tiny"), 64, 8, start="tiny")["dllm"]
    assert gen["strategy"] == "d2f" and gen["block_length"] == 8 and "skip_threshold" not in gen
    assert generation_defaults(load_tokenizer("tiny"), 64, 8)["dllm"] == gen  # no start: the same
