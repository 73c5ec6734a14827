"""Your own examples as JSON Lines, one per line, in either form

    {"prompt": "...", "response": "..."}     ("completion" or "answer" may name the response)
    {"messages": [{"role": "user", "content": "..."}, ..., {"role": "assistant", "content": "..."}]}

In the chat form the last message is the answer and must be the assistant's; the messages before
it (system, user and earlier assistant turns) are the prompt. ``dllm.training.files`` trains on such
files (``data.files`` in a recipe); :class:`FileSuite` scores a model on one (``dllm bench --suite
my.jsonl``) by exact match, the way the task suites are scored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .base import Example, Score, TaskSuite, count_tokens
from .builtin import suite_names

RESPONSE_KEYS = ("response", "completion", "answer")
FORMS = ('{"prompt": ..., "response": ...} (or "completion" / "answer") or '
         '{"messages": [{"role": ..., "content": ...}, ...]} ending with the assistant\'s answer')


class DataFileError(ValueError):
    """A data file is missing, unreadable or holds a line in neither accepted form."""


@dataclass(frozen=True)
class Record:
    messages: tuple[tuple[str, str], ...]  # the prompt turns as (role, content)
    answer: str

    def prompt_messages(self) -> list[dict]:
        return [{"role": r, "content": c} for r, c in self.messages]


def _record(obj, where: str) -> Record:
    if not isinstance(obj, dict):
        raise DataFileError(f"{where}: expected a JSON object, got {type(obj).__name__}; accepted forms: {FORMS}")
    if "messages" in obj:
        msgs = obj["messages"]
        if not isinstance(msgs, list) or len(msgs) < 2:
            raise DataFileError(f"{where}: 'messages' must be a list of at least two messages (prompt turns, "
                                "then the assistant's answer)")
        turns = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise DataFileError(f"{where}: message {i} needs string 'role' and 'content'")
            turns.append((m["role"], m["content"]))
        if turns[-1][0] != "assistant":
            raise DataFileError(f"{where}: the last message is the answer and must have role 'assistant', "
                                f"not {turns[-1][0]!r}")
        return Record(tuple(turns[:-1]), turns[-1][1])
    key = next((k for k in RESPONSE_KEYS if k in obj), None)
    if "prompt" not in obj or key is None:
        raise DataFileError(f"{where}: keys {sorted(obj)} are neither form; accepted forms: {FORMS}")
    if not isinstance(obj["prompt"], str) or not isinstance(obj[key], str):
        raise DataFileError(f"{where}: 'prompt' and {key!r} must be strings")
    return Record((("user", obj["prompt"]),), obj[key])


def read_records(path: str | Path) -> list[Record]:
    """Every example of a JSON Lines file (blank lines skipped); DataFileError naming the line otherwise."""
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"data file {path} does not exist")
    records = []
    try:
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataFileError(f"{path}:{n}: not valid JSON ({e.msg}); one JSON object per line") from None
                records.append(_record(obj, f"{path}:{n}"))
    except UnicodeDecodeError as e:
        raise DataFileError(f"{path}: not UTF-8 text ({e.reason})") from None
    if not records:
        raise DataFileError(f"data file {path} holds no examples")
    return records


def record_texts(paths) -> list[str]:
    """Every prompt turn and answer of the files (the vocabulary of a tokenizer built from scratch)."""
    return [t for p in paths for r in read_records(p) for t in (*(c for _, c in r.messages), r.answer)]


def source_labels(paths) -> dict[str, str]:
    """A short, unique label per file (its stem; ``-2``, ``-3`` ... on a clash) for logs and resume state."""
    taken = set(suite_names())
    labels = {}
    for p in paths:
        stem = Path(p).stem or "data"
        label, i = stem, 2
        while label in taken:
            label, i = f"{stem}-{i}", i + 1
        taken.add(label)
        labels[p] = label
    return labels


def is_data_file(spec: str) -> bool:
    """Whether a ``--suite`` entry names a JSON Lines file rather than a registered suite."""
    return spec.strip().lower().endswith(".jsonl")


def _normalise(text: str) -> str:
    return " ".join(text.split())


class FileSuite(TaskSuite):
    """The examples of one JSON Lines file, scored by exact match (whitespace runs count as one space).

    A file has no splits and no sampling: ``examples(split, n)`` gives its first ``n`` examples in file
    order (all of them when it holds fewer). Only single-turn examples can be scored, since a prompt is one
    user message; a file with system or earlier turns fails with the line to fix.
    """

    def __init__(self, path: str | Path, name: str | None = None) -> None:
        self.path = Path(path)
        self.name = name or self.path.stem
        self.records = read_records(self.path)
        for i, r in enumerate(self.records):
            if len(r.messages) != 1 or r.messages[0][0] != "user":
                raise DataFileError(f"{self.path}: example {i + 1} has prompt turns "
                                    f"{[role for role, _ in r.messages]}; scoring takes one user message then the "
                                    "assistant's answer")
        self.max_prompt_tokens = max(count_tokens(r.messages[0][1]) for r in self.records)
        self.max_answer_tokens = max(count_tokens(r.answer) for r in self.records)

    def _draw(self, rng):  # pragma: no cover - examples() is overridden: a file is read, not sampled
        raise NotImplementedError

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        return [Example(f"{self.name}-{i:05d}", self.name, r.messages[0][1], r.answer, {"key": f"{self.path}:{i}"})
                for i, r in enumerate(self.records[:n])]

    def score(self, example: Example, completion: str) -> Score:
        ok = _normalise(completion) == _normalise(example.answer)
        return Score(ok, float(ok), {"expected": example.answer})
