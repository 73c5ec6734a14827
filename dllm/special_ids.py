"""The special token ids a decoder needs, read from a loaded model and its tokenizer, checked against the
model's vocabulary: a wrong mask id silently ruins every answer, so a doubtful one is an error here."""

from __future__ import annotations

from .errors import CheckpointError

# family name -> its published mask id, in registration order; dllm.modeling.families fills it as each
# family registers (this module stays below the model code: decoders import it)
KNOWN_MASK_IDS: dict[str, int] = {}


def require_mask_token(model, tokenizer=None) -> int:
    """The mask id from the config, else the tokenizer; a clear error naming the fix when there is none, or
    when it is not a row of the model's embedding (a config.json without ``mask_token_id`` of its own
    falls back to its family's published id, which a small or re-tokenized model does not have)."""
    mask_id = getattr(model.config, "mask_token_id", None)
    if mask_id is None and tokenizer is not None:
        mask_id = getattr(tokenizer, "mask_token_id", None)
    if mask_id is None:
        raise CheckpointError(
            "this checkpoint defines no mask token: set \"mask_token_id\" in its config.json "
            f"({known_mask_ids()}) or give the tokenizer a mask_token"
        )
    check_in_vocabulary(model, "mask_token_id", int(mask_id))
    return int(mask_id)


def known_mask_ids() -> str:
    """The published mask id of every registered family, for error messages: ``"LLaDA: 126336, ..."``."""
    return ", ".join(f"{name}: {mask_id}" for name, mask_id in KNOWN_MASK_IDS.items())


def check_in_vocabulary(model, name: str, token_id: int) -> None:
    """CheckpointError unless ``token_id`` is a row of the model's input embedding."""
    rows = model.get_input_embeddings().num_embeddings
    if not 0 <= token_id < rows:
        raise CheckpointError(
            f"{name}={token_id} is not in this model's vocabulary ({rows} rows): set \"{name}\" in its "
            "config.json to the tokenizer's id (a config without one gets its family's published id, "
            "which only the full-size vocabulary has)"
        )
