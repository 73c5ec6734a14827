"""Which requests may share a batch: the config a batch decodes a request's rows with, their per-row
values, and the settings key two requests must have in common.

A server batches requests whose settings differ only in a strategy's ``row_options`` (``threshold``,
``skip_threshold``, D2F's ``block_add_threshold`` / ``decoded_token_threshold``), and ignores options
that the batch's strategy does not read. A strategy with ``batches_as`` goes further: where its rows
decode exactly as rows of another strategy, they join that strategy's batches. On a block-causal model
without a cache, ``threshold`` rows run as ``d2f`` rows with ``block_add_threshold = 1`` (one block in
flight), so a load that mixes ``threshold`` and ``d2f`` requests shares every forward; each row still
decodes as it does alone (``tests/decoding/test_batching.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .registry import get_strategy


@dataclass(frozen=True)
class BatchForm:
    cfg: Any  # the DiffusionGenerationConfig the batch decodes with
    row_values: dict[str, Any]  # this request's values of the batch strategy's row options
    key: tuple  # requests with equal keys may share a batch


def batch_form(model, cfg) -> BatchForm:
    """How rows decoding with ``cfg`` on ``model`` join a batch (see the module docstring)."""
    strategy = get_strategy(cfg.strategy)
    if strategy.batches_as is not None and (form := strategy.batches_as(model, cfg)) is not None:
        name, options = form
        cfg = cfg.replace(strategy=name, **options)
        strategy = get_strategy(name)
    row_values = {name: getattr(cfg, name) for name in strategy.row_options}
    names = [f.name for f in dataclasses.fields(cfg) if f.name not in strategy.row_options]
    ignored = set(strategy.unread(names))  # never ``steps``: every strategy's step limit depends on it
    key = tuple((name, getattr(cfg, name)) for name in names if name not in ignored)
    return BatchForm(cfg, row_values, key)
