"""``DecodeSession``: one decoding batch, advanced one forward at a time by its owner.

    batch = DecodeSession(model, cfg, tokenizer=tok, joinable=True)
    batch.add_rows(ids, attention_mask)          # the first batch
    while not batch.finished():
        batch.step()                             # one forward (a LoPA round), its commits, its retirements
        batch.add_rows([[...]], threshold=0.8)   # joins at the loop's next join point (joins_rows strategies)
        batch.cancel(2)                          # ends row 2 "cancelled" at the next commit
    out = batch.output()                         # a DiffusionGenerateOutput, rows in the order they were added

``generate()`` is this loop. A server owns admission, cancellation and the order in which it steps its
batches; the streamer it passes only receives output. Rows that were added get consecutive indices
(``add_rows`` returns them), the indices of ``put_row``/``end_row`` and of the output.

Per-row options: a strategy lists the options its rows may set for themselves (``Strategy.row_options``,
e.g. ``threshold`` for ``threshold``, ``skip_threshold`` for ``d2f``), so requests that differ only there
share every forward; at temperature 0 each row decodes exactly as it does alone with that value.
"""

from __future__ import annotations

import time
import warnings

import torch

from dllm.special_ids import check_in_vocabulary, require_mask_token

from .budget import check_memory
from .errors import GenerationConfigError
from .output import DiffusionGenerateOutput
from .registry import check_compatible, get_strategy
from .state import DecodeState


def resolve_special_ids(model, cfg, tokenizer=None) -> tuple[int, tuple[int, ...]]:
    """``(mask id, EOS ids)`` of a call: the config's, else the model's, else the tokenizer's.

    EOS ids: ``cfg.eos_token_id`` (one id or several), else the model's generation config (a checkpoint's
    ``generation_config.json``, whose list transformers keeps), else ``model.config.eos_token_id``, else
    the tokenizer's; every id of a list counts. Empty when none is known (rows then run to their length).
    An id outside the vocabulary is kept (the reference fixtures test LLaDA-8B's EOS on tiny models): no
    row can commit it, so it never ends one.
    """
    if cfg.mask_token_id is not None:
        check_in_vocabulary(model, "mask_token_id", cfg.mask_token_id)
        mask_id = cfg.mask_token_id
    else:
        mask_id = require_mask_token(model, tokenizer)
    if cfg.eos_token_id is not None:
        eos_ids = cfg.eos_token_ids
    else:
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None or eos == []:
            eos = getattr(model.config, "eos_token_id", None)
        if (eos is None or eos == []) and tokenizer is not None:
            eos = tokenizer.eos_token_id
        eos = eos if isinstance(eos, (list, tuple)) else () if eos is None else (eos,)
        eos_ids = tuple(dict.fromkeys(int(i) for i in eos))
    return int(mask_id), eos_ids


class DecodeSession:
    def __init__(self, model, generation_config=None, *, tokenizer=None, streamer=None, branch_executor=None,
                 joinable: bool = False, join_max_spread_blocks: float | None = None, criteria=()) -> None:
        cfg = generation_config if generation_config is not None else model.diffusion_generation_config
        self.model, self.cfg, self.tokenizer = model, cfg, tokenizer
        self.strategy = get_strategy(cfg.strategy)
        check_compatible(self.strategy, model, cfg)
        self.mask_id, self.eos_ids = resolve_special_ids(model, cfg, tokenizer)
        if cfg.stop_strings and tokenizer is None:
            raise GenerationConfigError("stop_strings need the tokenizer: pass tokenizer= to generate")
        self.streamer, self.criteria = streamer, tuple(criteria)
        self.resources = {"executor": branch_executor} if self.strategy.branches else {}
        # a branch executor that does not re-lay out its caches for joined rows (branch parallelism's ranks)
        self._fixed_branches = (self.strategy.branches and branch_executor is not None
                                and not getattr(branch_executor, "joins_rows", False))
        self.joinable = bool(joinable) and self.strategy.can_join(cfg) and not self._fixed_branches
        self.join_max_spread_blocks = join_max_spread_blocks
        self.vocab = model.get_input_embeddings().num_embeddings
        self.device = model.get_input_embeddings().weight.device
        self._first: list[tuple[torch.Tensor, torch.Tensor | None, dict]] = []
        self._cancel_first: set[int] = set()
        self.state: DecodeState | None = None
        self._loop = None
        self._stats: dict | None = None
        self._t0 = 0.0
        self._seconds = 0.0

    # -- rows -----------------------------------------------------------------------------------
    def add_rows(self, input_ids, attention_mask: torch.Tensor | None = None, **row_options) -> range:
        """Add prompts (a left-padded LongTensor [n, L] with its attention mask, or a list of id lists);
        returns their row indices. Before the first step they form the first batch; afterwards they join
        at the loop's next join point, which only a joinable batch of a ``joins_rows`` strategy has.

        ``row_options``: values of ``Strategy.row_options`` for these rows (default: the config's)."""
        ids, mask = self._as_batch(input_ids, attention_mask)
        values = self._row_values(row_options, ids.shape[0])
        if self.state is None:
            first = sum(t.shape[0] for t, _, _ in self._first)
            self._first.append((ids, mask, values))
            return range(first, first + ids.shape[0])
        if self.finished():
            raise GenerationConfigError("this batch has finished; start a new one for more rows")
        if not self.joinable:
            raise GenerationConfigError(
                f"strategy {self.strategy.name!r} does not take rows into a running batch"
                + ("; its branch executor keeps the rows it started with" if self._fixed_branches else "")
                + ("" if self.strategy.can_join(self.cfg) and not self._fixed_branches
                   else "; run them in a batch of their own"))
        prompts = [row[m.bool()].tolist() if m is not None else row.tolist()
                   for row, m in zip(ids, mask if mask is not None else [None] * ids.shape[0])]
        per_row = [{k: v[i] for k, v in values.items()} for i in range(len(prompts))]
        first = self.state.num_rows + len(self.state.incoming)
        for p, v in zip(prompts, per_row):
            self.state.add_incoming([p], v)
        return range(first, first + len(prompts))

    def _as_batch(self, input_ids, attention_mask):
        if isinstance(input_ids, (list, tuple)):
            rows = [list(map(int, p)) for p in input_ids]
            if not rows or not all(rows):
                raise GenerationConfigError("add_rows needs at least one non-empty prompt")
            width = max(map(len, rows))
            ids = torch.full((len(rows), width), self._pad_id(), dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, p in enumerate(rows):
                ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
                mask[i, width - len(p):] = 1
            input_ids, attention_mask = ids, mask
        if not torch.is_tensor(input_ids) or input_ids.dim() != 2 or 0 in input_ids.shape \
                or input_ids.dtype not in (torch.int64, torch.int32):
            got = (f"{input_ids.dtype} of shape {tuple(input_ids.shape)}" if torch.is_tensor(input_ids)
                   else type(input_ids).__name__)
            raise GenerationConfigError(f"input_ids must be a non-empty LongTensor of shape [batch, prompt_length]; "
                                        f"got {got}")
        lo, hi = (int(v) for v in torch.aminmax(input_ids))  # one reduction, once per call
        if lo < 0 or hi >= self.vocab:
            raise GenerationConfigError(f"input_ids hold ids outside the model's vocabulary [0, {self.vocab}): "
                                        f"min {lo}, max {hi} (another model's tokenizer?)")
        if attention_mask is not None:
            if attention_mask.shape != input_ids.shape:
                raise GenerationConfigError(f"attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                                            f"{tuple(input_ids.shape)}")
            if bool((attention_mask[:, -1] == 0).any()):
                raise GenerationConfigError("prompts must be left-padded (attention_mask ends with 1 on every row)")
        if bool((input_ids == self.mask_id).any()):
            raise GenerationConfigError(f"the prompt contains the mask token id {self.mask_id}; masks are for the "
                                        "canvas only")
        cfg, model = self.cfg, self.model
        limit = getattr(model.config, "max_sequence_length", None) or getattr(model.config, "max_position_embeddings", None)
        if limit and input_ids.shape[1] + cfg.max_new_tokens > limit:
            warnings.warn(f"prompt ({input_ids.shape[1]} tokens) + max_new_tokens ({cfg.max_new_tokens}) exceeds the "
                          f"model's context length ({limit}); answers past it are unreliable", stacklevel=4)
        return input_ids.long(), attention_mask

    def _row_values(self, options: dict, n: int) -> dict[str, list]:
        unknown = set(options) - self.strategy.row_options
        if unknown:
            valid = ", ".join(sorted(self.strategy.row_options)) or "none"
            raise GenerationConfigError(f"strategy {self.strategy.name!r} cannot set {', '.join(sorted(unknown))} "
                                        f"per row (per-row options: {valid})")
        out = {}
        for name in self.strategy.row_options:
            value = options.get(name, getattr(self.cfg, name))
            values = list(value) if isinstance(value, (list, tuple)) else [value] * n
            if len(values) != n:
                raise GenerationConfigError(f"{name}: {len(values)} values for {n} rows")
            for v in set(values):
                self.cfg.replace(**{name: v})  # the config's own checks (range, finite)
            out[name] = values
        return out

    @property
    def eos_id(self) -> int | None:
        """The first EOS id (the one that pads a finished answer); ``eos_ids`` holds every one."""
        return self.eos_ids[0] if self.eos_ids else None

    def _pad_id(self) -> int:
        for tok in (self.cfg.pad_token_id, self.eos_id):
            if tok is not None and tok != self.mask_id:
                return int(tok)
        return 0 if self.mask_id != 0 else 1

    def cancel(self, row: int) -> None:
        """End ``row`` with ``"cancelled"`` at the next commit (its output keeps what was committed)."""
        if self.state is None:
            self._cancel_first.add(int(row))
        else:
            self.state.stopping.cancel(row)

    # -- stepping ---------------------------------------------------------------------------------
    def _start(self) -> None:
        if not self._first:
            raise GenerationConfigError("add_rows before the first step")
        if len(self._first) == 1:
            ids, mask, values = self._first[0]
        else:
            width = max(t.shape[1] for t, _, _ in self._first)
            parts_ids, parts_mask = [], []
            for t, m, _ in self._first:
                pad = width - t.shape[1]
                m = torch.ones_like(t) if m is None else m
                parts_ids.append(torch.nn.functional.pad(t, (pad, 0), value=self._pad_id()))
                parts_mask.append(torch.nn.functional.pad(m, (pad, 0), value=0))
            ids, mask = torch.cat(parts_ids), torch.cat(parts_mask)
            values = {k: sum((v[k] for _, _, v in self._first), []) for k in self._first[0][2]}
        cfg = self.cfg
        check_memory(self.model, ids.shape[0], ids.shape[1], cfg)  # refuse, not fail mid-allocation
        ids = ids.to(self.device)
        mask = mask.to(self.device) if mask is not None else None
        # Rows set their own values only where someone asked, or may ask later (joins): otherwise the config's.
        given = any(v != [getattr(cfg, k)] * len(v) for k, v in values.items())
        row_values = ({k: torch.tensor(v, dtype=torch.float64) for k, v in values.items()}
                      if (given or self.joinable) else None)
        self.state = DecodeState(ids, mask, cfg, mask_id=self.mask_id, eos_ids=self.eos_ids, tokenizer=self.tokenizer,
                                 streamer=self.streamer, strategy=self.strategy, criteria=self.criteria,
                                 row_values=row_values)
        self.state.joining = self.joinable
        self.state.join_max_spread_blocks = self.join_max_spread_blocks
        for row in self._cancel_first:
            self.state.stopping.cancel(row)
        gen = torch.Generator(device=self.device).manual_seed(cfg.seed) if cfg.seed is not None else None
        self._loop = self.strategy.loop(self.model, self.state, gen, **self.resources)

    def step(self) -> bool:
        """Run one forward (and its commits); False once the batch has finished."""
        if self._stats is not None:
            return False
        t0 = time.perf_counter()
        if self.state is None:
            self._start()
        try:
            next(self._loop)
            if self.state.live == 0 and not self.state.incoming:  # the last rows left: end now, not next step
                self._exhaust()
            return True
        except StopIteration as stop:
            self._stats = dict(stop.value or {})
            return False
        finally:
            self._seconds += time.perf_counter() - t0

    def _exhaust(self) -> None:
        try:
            next(self._loop)
        except StopIteration as stop:
            self._stats = dict(stop.value or {})
        else:
            raise RuntimeError(f"strategy {self.strategy.name!r}: its loop went on with no rows left")

    def finished(self) -> bool:
        return self._stats is not None

    def run(self) -> DiffusionGenerateOutput:
        """Step until finished; the output."""
        while self.step():
            pass
        return self.output()

    def output(self) -> DiffusionGenerateOutput:
        if self._stats is None:
            raise RuntimeError("the batch has not finished: step() until finished()")
        stats = dict(self._stats)
        return self.state.finish(total_seconds=self._seconds, forward_seconds=stats.pop("forward_seconds", 0.0),
                                 stats=stats)

    def close(self) -> None:
        """Abandon the batch (its loop's resources, e.g. LoPA's branch executor, are released)."""
        if self._loop is not None:
            self._loop.close()
        self._stats = self._stats if self._stats is not None else {}

    # -- what the owner reads ------------------------------------------------------------------
    @property
    def live(self) -> int:
        """Rows being decoded (0 before the first step)."""
        return 0 if self.state is None else self.state.live

    @property
    def num_rows(self) -> int:
        """Rows added so far, waiting ones included."""
        if self.state is None:
            return sum(t.shape[0] for t, _, _ in self._first)
        return self.state.num_rows + len(self.state.incoming)

    @property
    def admits_now(self) -> bool:
        """Whether rows added now are decoded from the next step on: a joinable batch whose loop is at a join
        point: every step for most strategies; at block boundaries for the semi-AR schedules (``vanilla``,
        Dream's), ``sdar``, ``fast_dllm_v2`` and LoPA on the threshold rule. ``d2f`` with
        ``join_max_spread_blocks`` admits rows at every step, but places them only while the windows stay
        inside the bound (until then they wait in the batch: the bound trades first-token latency for
        throughput)."""
        return self.joinable and (self.state is None or self.state.join_ready)

    @property
    def forwards(self) -> int:
        return 0 if self.state is None else self.state.forward_calls
