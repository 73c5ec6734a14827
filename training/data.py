"""Training data from the task suites: chat-formatted, EOS-padded, left-padded batches from an
infinite, seeded, resumable stream over a weighted mix of suites.

Layout of a batch row (P = longest prompt in the batch, G = generation length of the batch):
``[pad ... pad | <|user|> prompt <|assistant|> | answer <|eos|> <|eos|> ... <|eos|>]``
with slots ``[0, P)`` the (left-padded) prompt and ``[P, P+G)`` the answer region. Every answer
slot, EOS padding included, is a training target, so the model learns to stop.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from .config import DataSection, suite_options_error
from .encoding import encode_answer, encode_prompt
from .files import FileSource, source_labels


@dataclass
class Batch:
    input_ids: torch.Tensor  # [b, P+G] clean tokens
    attention_mask: torch.Tensor  # [b, P+G] 1 real, 0 left padding
    prompt_length: int  # P: answers start here in every row
    answer_mask: torch.Tensor  # [b, P+G] True on answer slots (EOS padding included)
    suites: list[str]

    @property
    def gen_length(self) -> int:
        return self.input_ids.shape[1] - self.prompt_length

    def to(self, device) -> Batch:
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.prompt_length,
                     self.answer_mask.to(device), self.suites)

    def select(self, rows: slice) -> Batch:
        """Rows ``rows`` (the same padding: prompts still end at ``prompt_length``)."""
        return Batch(self.input_ids[rows], self.attention_mask[rows], self.prompt_length, self.answer_mask[rows],
                     self.suites[rows])


def collate(pairs: list[tuple[list[int], list[int]]], gen_length: int, pad_id: int, eos_id: int,
            suites: list[str] | None = None) -> Batch:
    """Left-pad prompts with ``pad_id`` to a common length; pad answers with EOS to ``gen_length``."""
    longest = max(len(a) for _, a in pairs)
    if longest > gen_length:
        raise ValueError(f"an answer of {longest} tokens (EOS included) does not fit gen_length={gen_length}")
    p = max(len(q) for q, _ in pairs)
    b, t = len(pairs), p + gen_length
    ids = torch.full((b, t), eos_id, dtype=torch.long)
    attn = torch.ones((b, t), dtype=torch.long)
    for i, (q, a) in enumerate(pairs):
        ids[i, : p - len(q)] = pad_id
        attn[i, : p - len(q)] = 0
        ids[i, p - len(q) : p] = torch.tensor(q)
        ids[i, p : p + len(a)] = torch.tensor(a)
    answer_mask = torch.zeros((b, t), dtype=torch.bool)
    answer_mask[:, p:] = True
    return Batch(ids, attn, p, answer_mask, suites or [""] * b)


def suite_texts(n_per_split: int = 1000, seed: int = 0) -> list[str]:
    """Prompts and answers of up to ``n_per_split`` train and test examples of every suite
    (the tokenizer's vocabulary); a split smaller than that contributes all it has."""
    from dllm.eval.tasks import get_suite, suite_names

    texts = []
    for name in suite_names():
        suite = get_suite(name)
        for split in ("train", "test"):
            n = n_per_split
            while True:
                try:
                    exs = suite.examples(split, n, seed=seed)
                    break
                except ValueError:  # the split has fewer distinct problems than asked
                    if n <= 1:
                        raise
                    n //= 2
            texts += [t for ex in exs for t in (ex.prompt, ex.answer)]
    return texts


class TaskStream:
    """Infinite deterministic batches over a weighted mix of suites and data files.

    Batch ``k`` of process ``rank`` depends only on (seed, rank, k): the source choice and the padding
    length come from ``Random((seed, rank, k))`` and examples are read from per-source cursors into
    deterministic suite chunks or file epochs (``dllm.training.files``), so the stream's position is just
    (batches drawn, cursors) and resuming continues exactly where an uninterrupted run would be.
    ``max_length`` (the model's context) drops file examples whose prompt leaves no room for the
    answer region; ``notes`` says what each file contributed. ``dataset``: the records of a
    ``train_dataset`` given in Python, one more source (weight ``cfg.dataset_weight``), read like a file.
    """

    def __init__(self, tokenizer, cfg: DataSection, batch_size: int, seed: int, rank: int = 0,
                 pad_multiple: int = 1, world_size: int = 1, max_length: int | None = None,
                 dataset: list | None = None) -> None:
        from dllm.eval.tasks import get_suite

        from .datasets import DATASET_LABEL

        self.tokenizer = tokenizer
        self.cfg = cfg
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.pad_multiple = max(1, pad_multiple)
        weights = {k: float(v) for k, v in cfg.tasks.items() if float(v) > 0}
        if cfg.suite_options and (err := suite_options_error(cfg)):
            raise ValueError(err)
        self.suites = {name: get_suite(name, **cfg.suite_options.get(name, {})) for name in weights}
        for name, suite in self.suites.items():
            need = suite.max_answer_tokens + 1
            if need > cfg.max_new_tokens:
                raise ValueError(
                    f"suite {name!r} answers take up to {need} tokens with EOS; raise data.max_new_tokens "
                    f"(now {cfg.max_new_tokens}) or drop the suite from data.tasks"
                )
        self.files: dict[str, FileSource] = {}
        self.notes: list[str] = []
        file_weights = {p: float(w) for p, w in cfg.files.items() if float(w) > 0}
        gen_cap = -(-cfg.max_new_tokens // self.pad_multiple) * self.pad_multiple
        max_prompt = None if max_length is None else max_length - gen_cap
        for path, label in source_labels(file_weights).items():
            src = FileSource(path, label, tokenizer, cfg.max_new_tokens, seed, rank, world_size, max_prompt)
            self.files[label] = src
            weights[label] = file_weights[path]
            self.notes.append(f"data file {path} ({label}): {src.summary()}")
        if dataset is not None and float(cfg.dataset_weight) > 0:
            label = DATASET_LABEL
            while label in weights:  # a data file with that stem
                label += "_"
            src = FileSource(DATASET_LABEL, label, tokenizer, cfg.max_new_tokens, seed, rank, world_size, max_prompt,
                             records=dataset)
            self.files[label] = src
            weights[label] = float(cfg.dataset_weight)
            self.notes.append(f"{DATASET_LABEL}: {src.summary()}")
        self.names = list(weights)
        self.weights = [weights[n] for n in self.names]
        self.batches = 0
        self.cursors = {n: 0 for n in self.names}
        self._chunks: dict[tuple[str, int], list[tuple[list[int], list[int]]]] = {}

    # -- resumable position -------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"batches": self.batches, "cursors": dict(self.cursors)}

    def load_state_dict(self, state: dict) -> None:
        self.batches = int(state["batches"])
        self.cursors = {n: int(state["cursors"].get(n, 0)) for n in self.names}

    # -- examples ------------------------------------------------------------------------------
    def _chunk(self, name: str, k: int) -> list[tuple[list[int], list[int]]]:
        key = (name, k)
        if key not in self._chunks:
            if len(self._chunks) > 2 * len(self.names):
                self._chunks.clear()
            chunk_seed = ((self.seed * 1_000_003 + self.rank) * 1_000_003 + k) + 1
            exs = self.suites[name].examples("train", self.cfg.chunk_size, seed=chunk_seed)
            self._chunks[key] = [(encode_prompt(self.tokenizer, e.prompt), encode_answer(self.tokenizer, e.answer))
                                 for e in exs]
        return self._chunks[key]

    def _take(self, name: str) -> tuple[list[int], list[int]]:
        c = self.cursors[name]
        self.cursors[name] = c + 1
        if name in self.files:
            return self.files[name].example(c)
        return self._chunk(name, c // self.cfg.chunk_size)[c % self.cfg.chunk_size]

    def _gen_length(self, rng: random.Random, longest_answer: int) -> int:
        hi = self.cfg.max_new_tokens
        if self.cfg.eos_pad == "fixed":
            g = hi
        else:
            # u**power skews towards tight padding; the long tail still covers every length up to hi
            g = longest_answer + int((hi - longest_answer + 1) * rng.random() ** self.cfg.eos_pad_power)
            g = min(g, hi)
        # block models: whole blocks, so the last block of every answer region is complete
        return -(-g // self.pad_multiple) * self.pad_multiple

    def next_batch(self) -> Batch:
        rng = random.Random(f"{self.seed}:{self.rank}:{self.batches}")
        self.batches += 1
        if self.cfg.mix == "per_batch":
            names = [rng.choices(self.names, self.weights)[0]] * self.batch_size
        else:
            names = rng.choices(self.names, self.weights, k=self.batch_size)
        pairs = [self._take(n) for n in names]
        g = self._gen_length(rng, max(len(a) for _, a in pairs))
        return collate(pairs, g, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id, names)
