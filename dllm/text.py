"""Text in, text out: the tokenizer and chat template around ``model.generate``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from dllm.decoding.config import DiffusionGenerationConfig
from dllm.decoding.errors import GenerationConfigError
from dllm.decoding.registry import warn_unread_options


@dataclass
class TextResult:
    text: str
    num_forwards: int
    generated_tokens: int
    tpf: float
    seconds: float
    finish_reason: str
    token_ids: list[int]
    step_map: list[int]
    stats: dict = field(default_factory=dict)  # the strategy's per-row counters (``edit``: edits, blocks)

    def to_dict(self) -> dict:
        return asdict(self)


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-id rows -> left-padded ``input_ids`` and ``attention_mask`` (1 on real tokens)."""
    length = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, r in enumerate(rows):
        input_ids[i, length - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, length - len(r):] = 1
    return input_ids, mask


def encode_prompts(tokenizer, prompts: list[str], chat: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ``input_ids`` and ``attention_mask`` for the prompts (chat template applied)."""
    rows = []
    for p in prompts:
        if chat and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(p, add_special_tokens=True)["input_ids"]
        if not ids:
            raise ValueError("empty prompt")
        rows.append(list(ids))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return left_pad(rows, pad)


def completion_text(tokenizer, ids: list[int], eos_id, stop_strings=()) -> str:
    """The text of generated ``ids`` up to the first EOS (``eos_id``: one id, several, or None) and the
    first stop string."""
    eos = () if eos_id is None else {eos_id} if isinstance(eos_id, int) else set(eos_id)
    end = next((i for i, t in enumerate(ids) if t in eos), None) if eos else None
    if end is not None:
        ids = ids[:end]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    for s in stop_strings:
        if s in text:
            text = text[: text.index(s)]
    return text


def generate_text(
    model,
    tokenizer,
    prompts: str | list[str],
    *,
    chat: bool = True,
    generation_config: DiffusionGenerationConfig | None = None,
    streamer=None,
    **overrides,
) -> list[TextResult]:
    """Generate completions for text prompts; one :class:`TextResult` per prompt."""
    single = isinstance(prompts, str)
    if not single and (not isinstance(prompts, (list, tuple)) or not all(isinstance(x, str) for x in prompts)):
        raise GenerationConfigError(f"prompts must be a str or a list of str, got {type(prompts).__name__}"
                                    + ("" if not isinstance(prompts, (list, tuple)) else " with non-str items"))
    prompts = [prompts] if single else list(prompts)
    if not prompts:
        return []
    input_ids, mask = encode_prompts(tokenizer, prompts, chat=chat)
    cfg = generation_config or model.diffusion_generation_config
    cfg = cfg.replace(return_dict_in_generate=True, **overrides)
    warn_unread_options(cfg.strategy, overrides, stacklevel=3)
    out = model.generate(input_ids, attention_mask=mask, generation_config=cfg, streamer=streamer, tokenizer=tokenizer)
    eos_ids = getattr(out, "eos_token_ids", ())  # the ids the decoder stopped at, every one
    if cfg.eos_token_id is None and tokenizer.eos_token_id is not None:
        eos_ids = (*eos_ids, tokenizer.eos_token_id)  # and the tokenizer's, as before
    p = input_ids.shape[1]
    seconds = out.timings["total_seconds"]
    results = []
    for i in range(len(prompts)):
        ids = out.sequences[i, p:].tolist()
        results.append(TextResult(
            text=completion_text(tokenizer, ids, eos_ids, cfg.stop_strings),
            num_forwards=int(out.num_forwards[i]),
            generated_tokens=int(out.generated_tokens[i]),
            tpf=float(out.tpf[i]),
            seconds=seconds,
            finish_reason=out.finish_reason[i],
            token_ids=ids,
            step_map=out.step_map[i].tolist(),
            stats={k: v[i] for k, v in out.stats.items() if isinstance(v, list) and len(v) == len(prompts)},
        ))
    return results


def load_tokenizer_for(path) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
