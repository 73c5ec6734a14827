"""The special token ids a decoder needs, read from a loaded model and its tokenizer."""

from __future__ import annotations

from .errors import CheckpointError


def require_mask_token(model, tokenizer=None) -> int:
    """The mask id from the config, else the tokenizer; a clear error naming the fix otherwise."""
    mask_id = getattr(model.config, "mask_token_id", None)
    if mask_id is None and tokenizer is not None:
        mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise CheckpointError(
            "this checkpoint defines no mask token: set \"mask_token_id\" in its config.json "
            "(LLaDA: 126336, Dream: 151666) or give the tokenizer a mask_token"
        )
    return int(mask_id)
