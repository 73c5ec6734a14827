"""Chat-formatted token ids of prompts and answers, shared by the suite stream and data files."""

from __future__ import annotations


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of the user turn plus the generation prompt: ``<|user|> prompt <|assistant|>``."""
    return encode_messages(tokenizer, [{"role": "user", "content": prompt}])


def encode_messages(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the chat turns through the chat template, ending with the generation prompt."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_answer(tokenizer, answer: str) -> list[int]:
    """Answer ids followed by one EOS (collate pads further with EOS)."""
    return tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
