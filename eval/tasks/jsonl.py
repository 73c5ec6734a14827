"""Your own examples as JSON Lines, one per line, in either form

    {"prompt": "...", "response": "..."}     ("completion" or "answer" may name the response)
    {"messages": [{"role": "user", "content": "..."}, ..., {"role": "assistant", "content": "..."}]}

In the chat form the last message is the answer and must be the assistant's; the messages before
it (system, user and earlier assistant turns) are the prompt. The prompt of the first form may also
be a list of messages and its response a one-message assistant list (trl's conversational
prompt-completion rows). Other keys are kept in ``Record.extra`` (GRPO passes them to reward
functions). ``dllm.training.files`` trains on such files (``data.files`` in a recipe);
:class:`FileSuite` scores a model on one (``dllm bench --suite my.jsonl``) by exact match, the way the
task suites are scored. :func:`parse_record` reads one row (a JSON object, a ``datasets`` row).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
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
    answer: str | None  # None only for prompt-only rows (``require_answer=False``: GRPO with reward functions)
    extra: dict = field(default_factory=dict, compare=False)  # the row's other keys, e.g. a "solution" column

    def prompt_messages(self) -> list[dict]:
        return [{"role": r, "content": c} for r, c in self.messages]


def _turns(msgs, where: str, key: str) -> list[tuple[str, str]]:
    if not isinstance(msgs, list) or not msgs:
        raise DataFileError(f"{where}: {key!r} must be a non-empty list of messages")
    turns = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataFileError(f"{where}: {'message' if key == 'messages' else key + ' message'} {i} needs string "
                                "'role' and 'content'")
        turns.append((m["role"], m["content"]))
    return turns


def parse_record(obj, where: str, require_answer: bool = True) -> Record:
    """One example in either accepted form; DataFileError naming ``where`` otherwise. With
    ``require_answer=False`` a row may be a prompt alone (``{"prompt": ...}``, or messages that do not end
    with the assistant's): its ``answer`` is None."""
    if not isinstance(obj, dict):
        raise DataFileError(f"{where}: expected a JSON object, got {type(obj).__name__}; accepted forms: {FORMS}")
    if "messages" in obj:
        msgs = obj["messages"]
        if require_answer and (not isinstance(msgs, list) or len(msgs) < 2):
            raise DataFileError(f"{where}: 'messages' must be a list of at least two messages (prompt turns, "
                                "then the assistant's answer)")
        turns = _turns(msgs, where, "messages")
        extra = {k: v for k, v in obj.items() if k != "messages"}
        if turns[-1][0] != "assistant":
            if not require_answer:  # a prompt alone
                return Record(tuple(turns), None, extra)
            raise DataFileError(f"{where}: the last message is the answer and must have role 'assistant', "
                                f"not {turns[-1][0]!r}")
        if len(turns) < 2:
            raise DataFileError(f"{where}: 'messages' must hold prompt turns before the assistant's answer")
        return Record(tuple(turns[:-1]), turns[-1][1], extra)
    key = next((k for k in RESPONSE_KEYS if k in obj), None)
    if "prompt" not in obj or (key is None and require_answer):
        raise DataFileError(f"{where}: keys {sorted(obj)} are neither form; accepted forms: {FORMS}")
    prompt = obj["prompt"]
    if isinstance(prompt, list):  # conversational: the prompt turns as messages
        turns = tuple(_turns(prompt, where, "prompt"))
    elif isinstance(prompt, str):
        turns = (("user", prompt),)
    else:
        raise DataFileError(f"{where}: 'prompt' must be a string or a list of messages")
    extra = {k: v for k, v in obj.items() if k not in ("prompt", key)}
    if key is None:
        return Record(turns, None, extra)
    answer = obj[key]
    if isinstance(answer, list):  # conversational: one assistant message
        msgs = _turns(answer, where, key)
        if len(msgs) != 1 or msgs[0][0] != "assistant":
            raise DataFileError(f"{where}: a {key!r} given as messages must be one message with role 'assistant'")
        answer = msgs[0][1]
    if not isinstance(answer, str):
        raise DataFileError(f"{where}: 'prompt' and {key!r} must be strings (or lists of messages)")
    return Record(turns, answer, extra)


_record = parse_record  # the name earlier code imported


def read_records(path: str | Path, require_answer: bool = True) -> list[Record]:
    """Every example of a JSON Lines file (blank lines skipped); DataFileError naming the line otherwise.
    ``require_answer=False`` also accepts prompt-only lines (see :func:`parse_record`)."""
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
                records.append(parse_record(obj, f"{path}:{n}", require_answer))
    except UnicodeDecodeError as e:
        raise DataFileError(f"{path}: not UTF-8 text ({e.reason})") from None
    if not records:
        raise DataFileError(f"data file {path} holds no examples")
    return records


def record_texts(paths) -> list[str]:
    """Every prompt turn and answer of the files (the vocabulary of a tokenizer built from scratch)."""
    return [t for p in paths for r in read_records(p) for t in record_words(r)]


def record_words(record: Record) -> list[str]:
    """The texts of one record: its prompt turns and its answer (if any)."""
    return [c for _, c in record.messages] + ([record.answer] if record.answer is not None else [])


def source_labels(paths) -> dict[str, str]:
    """A short, unique label per file (its stem; ``-2``, ``-3`` ... on a clash) for logs and resume state."""
    taken = set(suite_names("every"))
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


def exact_match(completion: str, answer: str) -> bool:
    """Whether ``completion`` is ``answer`` (whitespace runs count as one space): how files are scored."""
    return _normalise(completion) == _normalise(answer)


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
        ok = exact_match(completion, example.answer)
        return Score(ok, float(ok), {"expected": example.answer})
