"""Training data from your own JSON Lines files (the two accepted forms: ``dllm.eval.tasks.jsonl``).

Prompts go through the tokenizer's chat template and answers get one EOS, exactly as the task suites' examples do (``dllm.training.data``),
so SFT and D2F distillation train on files and suites alike (``data.files`` in a recipe).

A file is read, checked and tokenized once, when training starts. Examples that cannot fit are
dropped and counted, never cut: an answer longer than ``data.max_new_tokens`` would lose its EOS
(the model would not learn to stop), and a prompt longer than the model's context leaves no room
for the answer. The order is a fresh permutation per epoch, shared by every rank: rank ``r`` of
``w`` reads positions ``r, r + w, r + 2w, ...``, so ranks see disjoint examples within an epoch and
a position (a cursor) is all a resume needs.
"""

from __future__ import annotations

import random

from dllm.eval.tasks.jsonl import DataFileError, Record, read_records, record_texts, source_labels

from .encoding import encode_answer, encode_messages

__all__ = ["DataFileError", "EpochOrder", "FileSource", "read_records", "record_texts", "source_labels"]


class EpochOrder:
    """Position ``cursor`` of rank ``rank`` of ``world_size`` in a seeded per-epoch permutation of ``n`` items:
    item ``perm[epoch][(cursor * world_size + rank) % n]``, so ranks read disjoint items within an epoch."""

    def __init__(self, n: int, seed: int, label: str, rank: int = 0, world_size: int = 1) -> None:
        self.n, self.seed, self.label = n, seed, label
        self.rank, self.world_size = rank, max(1, world_size)
        self._perm: tuple[int, list[int]] | None = None

    def index(self, cursor: int) -> int:
        epoch, i = divmod(cursor * self.world_size + self.rank, self.n)
        if self._perm is None or self._perm[0] != epoch:
            order = list(range(self.n))
            random.Random(f"{self.seed}:{self.label}:{epoch}").shuffle(order)
            self._perm = (epoch, order)
        return self._perm[1][i]


class FileSource:
    """The tokenized examples of one file (or of ``records`` given in Python: ``path`` then only names
    them), read in a seeded per-epoch order shared by all ranks."""

    def __init__(self, path: str, label: str, tokenizer, max_new_tokens: int, seed: int, rank: int = 0,
                 world_size: int = 1, max_prompt_tokens: int | None = None,
                 records: list[Record] | None = None) -> None:
        self.path, self.label = path, label
        self.seed, self.rank, self.world_size = seed, rank, max(1, world_size)
        what = "data file " if records is None else ""
        records = read_records(path) if records is None else records
        unk = tokenizer.unk_token_id
        self.examples: list[tuple[list[int], list[int]]] = []
        self.too_long_answer = self.too_long_prompt = self.with_unk = 0
        for r in records:
            q, a = encode_messages(tokenizer, r.prompt_messages()), encode_answer(tokenizer, r.answer)
            if len(a) > max_new_tokens:
                self.too_long_answer += 1
                continue
            if max_prompt_tokens is not None and len(q) > max_prompt_tokens:
                self.too_long_prompt += 1
                continue
            self.with_unk += unk is not None and (unk in q or unk in a)
            self.examples.append((q, a))
        self.read = len(records)
        if not self.examples:
            raise DataFileError(f"{what}{path}: none of its {self.read} examples "
                                f"fits ({self.summary()}); raise data.max_new_tokens or shorten the examples")
        self.order = EpochOrder(len(self.examples), seed, label, rank, world_size)

    def summary(self) -> str:
        parts = [f"{len(self.examples):,} of {self.read:,} examples used"]
        if self.too_long_answer:
            parts.append(f"{self.too_long_answer:,} dropped: answer + EOS longer than data.max_new_tokens")
        if self.too_long_prompt:
            parts.append(f"{self.too_long_prompt:,} dropped: prompt + answer region longer than the model's context")
        if self.with_unk:
            parts.append(f"{self.with_unk:,} contain tokens the tokenizer maps to its unknown token")
        return "; ".join(parts)

    def example(self, cursor: int) -> tuple[list[int], list[int]]:
        """This rank's ``cursor``-th example: position ``cursor * world_size + rank`` of the epoch order."""
        return self.examples[self.order.index(cursor)]
