"""``train_dataset=``: examples given in Python, the way trl's trainers take them.

A dataset is a list of dicts, a dict of columns, or a Hugging Face ``datasets.Dataset`` (any iterable
of rows): each row in one of the forms a JSON Lines data file accepts (``dllm.eval.tasks.jsonl``:
``prompt`` + ``completion``/``response``/``answer``, or ``messages``), parsed by the same code, so a
row that would be a bad line in a file fails the same way, naming ``train_dataset[i]``. ``datasets``
is never imported: a ``Dataset`` is read through its iteration.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from dllm.eval.tasks.jsonl import DataFileError, Record, parse_record

DATASET_LABEL = "train_dataset"  # its source name in logs (loss_train_dataset) and resume state


def dataset_records(dataset, require_answer: bool = True, name: str = DATASET_LABEL) -> list[Record]:
    """The rows of ``dataset`` as records; DataFileError naming the row (or the type) otherwise."""
    records = []
    for i, row in enumerate(_rows(dataset, name)):
        if isinstance(row, Mapping):  # a Dataset fills the columns a row lacks with None
            row = {k: v for k, v in row.items() if v is not None}
        records.append(parse_record(row, f"{name}[{i}]", require_answer))
    if not records:
        raise DataFileError(f"{name} holds no examples")
    return records


def _rows(dataset, name: str) -> Iterable:
    if isinstance(dataset, (str, Path)):
        raise DataFileError(f"{name} is a path ({dataset}); a JSON Lines file goes in data.files "
                            f"(data={{'files': {{'{dataset}': 1.0}}}}), {name}= takes the examples themselves")
    if isinstance(dataset, Mapping):
        values = list(dataset.values())
        # a DatasetDict, or splits of rows ({"train": [{...}, ...]}): a column never holds dicts
        if values and all(hasattr(v, "column_names") or (isinstance(v, (list, tuple)) and v
                                                         and all(isinstance(x, Mapping) for x in v)) for v in values):
            raise DataFileError(f"{name} holds splits {sorted(dataset)}: pass one of them, "
                                f"e.g. {name}=dataset['{next(iter(dataset))}']")
        if values and all(isinstance(v, (list, tuple)) for v in values):  # columns, as in Dataset.from_dict
            lengths = {len(v) for v in values}
            if len(lengths) != 1:
                raise DataFileError(f"{name}: its columns differ in length ({sorted(lengths)})")
            keys = list(dataset)
            return ({k: dataset[k][i] for k in keys} for i in range(lengths.pop()))
        raise DataFileError(f"{name} is one dict; give a list of rows (dicts), a dict of equal-length columns "
                            "or a datasets.Dataset")
    if not isinstance(dataset, Iterable):
        raise DataFileError(f"{name} must be a list of rows (dicts), a dict of columns or a datasets.Dataset, "
                            f"not {type(dataset).__name__}")
    return iter(dataset)
